"""`discover`: vLLM releases newer than the newest track, found on PyPI and proposed as tracks.

Each new release line's newest sdist gives the track its commit prefix, triton_kernels commit, ROCm base
Dockerfile and that file's AITER tag. Newer AITER tags are reported, never taken.
"""
from __future__ import annotations

import difflib
import hashlib
import io
import re
import tarfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version
from rocm_vllm_runtime import files, schema

from . import model, resolve
from .model import PinError

# PyPI's JSON API answer (https://docs.pypi.org/api/json/) as pypi_sdists reads it.
PYPI_LIMIT = 64 << 20
PYPI_SCHEMA = {"type": "object", "required": ["releases"], "properties": {"releases": {
    "type": "object", "maxProperties": 100_000, "additionalProperties": {
        "type": "array", "maxItems": 10_000, "items": {
            "type": "object", "required": ["packagetype", "url", "filename", "digests"],
            "properties": {
                "packagetype": {"type": "string", "maxLength": 100},
                "url": {"type": "string", "maxLength": 4096},
                "filename": {"type": "string", "maxLength": 1000},
                "yanked": {"type": "boolean"},
                "digests": {"type": "object", "required": ["sha256"],
                            "properties": {"sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}}}}}}}}

DEFAULT_INDEX = "https://pypi.org/pypi"
SUMMARY_LINES = 120  # per diffed file


def final(text: str, post: bool = False) -> Version | None:
    """text as a final X.Y.Z release (packaging's reading; a post release where post), else None."""
    try:
        v = Version(text)
    except InvalidVersion:
        return None
    plain = len(v.release) == 3 and not (v.pre or v.dev or v.local or v.epoch) and (post or v.post is None)
    return v if plain else None


def release_key(version: str) -> Version:
    v = final(version)
    if v is None or str(v) != version:
        raise PinError(f"{version!r} is not a vLLM release (X.Y.Z)")
    return v


@dataclass(frozen=True)
class Sdist:
    version: str
    url: str
    sha256: str
    filename: str


@dataclass
class Release:
    """What the pins job reads from a vLLM release's source."""
    version: str
    commit_prefix: str | None
    triton_kernels_commit: str | None
    base_dockerfiles: dict[str, dict[str, str]] = field(default_factory=dict)  # path -> ARG defaults
    files: dict[str, str] = field(default_factory=dict)  # requirements/*.txt, docker/Dockerfile.rocm*


def pypi_sdists(index_url: str = DEFAULT_INDEX) -> dict[str, Sdist]:
    """Every X.Y.Z release of vLLM on PyPI that has an sdist that is not yanked."""
    url = f"{index_url.rstrip('/')}/vllm/json"
    try:
        shown = resolve.secret_values.masked_url(url)
        body = resolve._http(url, max_bytes=PYPI_LIMIT)
        answer = schema.check(files.json_value(body, shown), PYPI_SCHEMA, shown)
    except files.DataError as exc:
        raise PinError(f"{exc}: the answer is not PyPI's JSON API: check vllm.index_url") from None
    out: dict[str, Sdist] = {}
    for version, release in answer["releases"].items():
        if final(version) is None or str(final(version)) != version:
            continue
        f = next((f for f in release if f["packagetype"] == "sdist" and not f.get("yanked")), None)
        if f is not None:
            out[version] = Sdist(version, urllib.parse.urljoin(url, f["url"]), f["digests"]["sha256"], f["filename"])
    return out


def track_sdist(data: dict, track: str) -> Sdist:
    """The sdist a track pins (versions.json tracks.<track>.vllm.sdist)."""
    vllm = data["tracks"][track]["vllm"]
    url = vllm["sdist"]["url"]
    return Sdist(vllm["version"], url, vllm["sdist"]["sha256"], url.rsplit("/", 1)[-1])


def new_releases(data: dict, sdists: dict[str, Sdist], up_to: str | None = None) -> list[Sdist]:
    """The newest release of each line newer than the newest track (none after up_to), oldest first."""
    newest = release_key(data["tracks"][model.track_names(data)[0]]["vllm"]["version"])
    limit = release_key(up_to) if up_to else None
    lines: dict[tuple[int, int], Sdist] = {}
    for version, sdist in sdists.items():
        key = release_key(version)
        line = key.release[:2]
        if line <= newest.release[:2] or (limit and key > limit):
            continue
        if line not in lines or key > release_key(lines[line].version):
            lines[line] = sdist
    return [lines[k] for k in sorted(lines)]


def fetch(sdist: Sdist, cache: Path) -> Path:
    """The sdist archive in cache (downloaded once), its sha256 checked against PyPI's."""
    try:
        archive = files.inside(cache, sdist.filename, "the file name PyPI lists")
    except files.RefusedError as exc:
        raise PinError(f"vLLM {sdist.version}'s sdist: {exc}: download refused") from None
    cache.mkdir(parents=True, exist_ok=True)
    if archive.is_file() and _sha256(archive) == sdist.sha256:
        return archive
    partial = archive.with_name(archive.name + ".part")
    with partial.open("wb") as f:
        resolve._http(sdist.url, sink=f.write, max_bytes=resolve.DOWNLOAD_LIMIT)
    if _sha256(partial) != sdist.sha256:
        partial.unlink()
        raise PinError(f"{sdist.url}: sha256 differs from the one PyPI lists ({sdist.sha256}): download refused")
    partial.replace(archive)
    return archive


def unpack(archive: Path, dest: Path, keep=lambda path: True) -> Path:
    """The sdist's files whose path below its top folder `keep` accepts, unpacked into dest (the top
    folder left out). Each path is joined name by name through files.inside, so a member named ../
    (or /, or with an empty part) stops it in one line with nothing written outside dest; only
    folders and regular files are taken (a link or a device stops it), modes are 0644 or 0755. Into a
    tree already there, a symbolic link or a file that is not a regular one on a member's path stops it.
    Independent of tarfile's extraction filters (absent from Python 3.11 before 3.11.4)."""
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                path = member.name.split("/", 1)[1] if "/" in member.name else ""
                if not path.strip("/") or not keep(path):
                    continue
                if not (member.isfile() or member.isdir()):
                    raise PinError(f"{archive.name}: the member {member.name[:200]!r} is neither a file nor a "
                                   "folder: not an sdist to unpack")
                target = dest
                try:
                    for part in path.split("/"):  # tarfile gives a folder's name without its trailing /
                        target = files.inside(target, part, "a member's path part")
                        if target.is_symlink():  # already there (a kept tree): it could lead outside dest
                            raise files.RefusedError(f"{target} is a symbolic link")
                except files.RefusedError as exc:
                    raise PinError(f"{archive.name}: the member {member.name[:200]!r} is no path inside the "
                                   f"sdist ({exc}): not an sdist to unpack") from None
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                if target.exists() and not target.is_file():  # a FIFO would block the write, a folder fail it
                    raise PinError(f"{archive.name}: {target} is there and is no regular file: remove it, then "
                                   "unpack again")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                target.chmod(0o755 if member.mode & 0o100 else 0o644)
    except (tarfile.TarError, EOFError) as exc:
        raise PinError(f"{archive}: not a readable sdist ({exc})") from None
    except OSError as exc:
        raise PinError(f"{archive.name}: cannot be unpacked into {dest} ({exc.strerror or exc})") from None
    return dest


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def dockerfile_args(text: str) -> dict[str, str]:
    """ARG defaults of a Dockerfile (quotes and trailing comments dropped; the first of each name)."""
    found: dict[str, str] = {}
    for m in re.finditer(r'^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)', text, re.M):
        found.setdefault(m.group(1), m.group(2).strip('"'))
    return found


def read_release(archive: Path, version: str) -> Release:
    """The files the pins job needs, read from an sdist archive (nothing is unpacked to disk)."""
    release = Release(version, None, None)
    try:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                parts = member.name.split("/", 1)
                if len(parts) != 2 or not member.isfile():
                    continue
                path = parts[1]
                wanted = (path == "vllm/_version.py" or path == "cmake/external_projects/triton_kernels.cmake"
                          or re.fullmatch(r"requirements/[\w./-]+\.txt", path)
                          or re.fullmatch(r"docker/Dockerfile\.rocm[\w.-]*", path))
                if not wanted:
                    continue
                handle = tar.extractfile(member)
                text = io.TextIOWrapper(handle, encoding="utf-8", errors="replace").read() if handle else ""
                if path == "vllm/_version.py":
                    m = re.search(r"commit_id\s*=\s*'g?([0-9a-f]{7,40})'", text)
                    release.commit_prefix = m.group(1) if m else None
                elif path.endswith("triton_kernels.cmake"):
                    m = re.search(r'VLLM_TARGET_DEVICE STREQUAL "rocm".*?set\(TRITON_KERNELS_TAG "([0-9a-f]{40})"\)',
                                  text, re.S)
                    release.triton_kernels_commit = m.group(1) if m else None
                else:
                    release.files[path] = text
                    if re.fullmatch(r"docker/Dockerfile\.rocm(_\w+)?_base", path):
                        release.base_dockerfiles[path] = dockerfile_args(text)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PinError(f"{archive}: not a readable sdist ({exc})") from None
    return release


def image_parts(ref: str) -> tuple[str, str, str | None]:
    """(name, tag, digest or None) of an image reference name:tag[@sha256:...] (tag: latest by default)."""
    ref, _, digest = ref.partition("@")
    colon = ref.rfind(":")
    name, tag = (ref[:colon], ref[colon + 1:]) if colon > ref.rfind("/") else (ref, "latest")
    return name, tag, digest or None


def same_image(upstream: str | None, base_image: dict) -> bool:
    """Whether an upstream BASE_IMAGE is base_image: name and tag equal, the digests too where both have one."""
    if not upstream:
        return False
    name, tag, digest = image_parts(upstream)
    ours = base_image.get("digest")
    return (name, tag) == (base_image["name"], base_image["tag"]) and (digest is None or ours is None or digest == ours)


def choose_base(release: Release, base_image: dict) -> tuple[str, bool]:
    """(the upstream base Dockerfile the new track follows, whether it is the ROCm stack of base_image)."""
    same = sorted(p for p, args in release.base_dockerfiles.items() if same_image(args.get("BASE_IMAGE"), base_image))
    if same:
        return same[0], True
    if "docker/Dockerfile.rocm_base" in release.base_dockerfiles:
        return "docker/Dockerfile.rocm_base", False
    raise PinError(f"vLLM {release.version} ships no docker/Dockerfile.rocm*_base: add its track by hand")


# ARGs of upstream's TheRock base: the release index (never the nightly one) and PyTorch's versions.
THEROCK_INDEX_ARG = "ROCM_RELEASE_WHEELS_MULTIARCH_URL"
THEROCK_ABOUT = ("TheRock ROCm wheels of this track, from its release index alone (upstream's base also consults the "
                 "nightly index; this one never does): PyTorch's versions, from which with the SDK version and "
                 "gpu_archs python3 -m tools.pins therock derives what the track installs, and the sha256 of their "
                 "hash lock, made on a host that reaches the index.")
THEROCK_TORCH_ARGS = {name: f"{name.upper()}_VERSION" for name in model.TORCH_WHEELS}
# ARGs of upstream's TheRock base naming the Triton it builds from source (a short commit, the version).
THEROCK_TRITON_ARGS = {"repository": "TRITON_REPO", "commit": "TRITON_BRANCH", "version": "TRITON_VERSION"}


def therock_triton(version: str, base_path: str, args: dict[str, str], kernels_commit: str | None) -> dict:
    """The Triton a therock track builds from source, as upstream's base names it: repository, version and commit."""
    found = {key: args.get(arg, "").strip() for key, arg in THEROCK_TRITON_ARGS.items()}
    missing = [THEROCK_TRITON_ARGS[key] for key, value in found.items() if not value]
    bad = not found["repository"].startswith("https://") or not re.fullmatch(r"[0-9a-f]{7,40}", found["commit"])
    if missing or bad:
        why = "missing: " + ", ".join(missing) if missing else "not an https repository and a hex commit"
        raise PinError(f"vLLM {version}'s {base_path} builds Triton from {found['repository']!r} at "
                       f"{found['commit']!r} ({why}): add its track by hand")
    full = kernels_commit if kernels_commit and kernels_commit.startswith(found["commit"]) else None
    return {"repository": found["repository"], "commit": full, "version": found["version"],
            "unresolved": [] if full else ["commit"]}


def therock_pins(version: str, base_path: str, args: dict[str, str], kernels_commit: str | None = None) -> dict:
    """A therock track's TheRock section, from upstream's base Dockerfile ARGs (its lock unresolved)."""
    index = args.get(THEROCK_INDEX_ARG, "")
    torch = {name: args.get(arg, "") for name, arg in THEROCK_TORCH_ARGS.items()}
    missing = [arg for name, arg in THEROCK_TORCH_ARGS.items() if not torch[name]]
    problem = model.therock_index_problem(index)
    if problem or missing:
        raise PinError(f"vLLM {version}'s {base_path} installs TheRock from {THEROCK_INDEX_ARG}="
                       f"{resolve.secret_values.masked_url(index)!r} ({problem or 'a release index'}), "
                       f"PyTorch versions ({'missing: ' + ', '.join(missing) if missing else 'present'}): "
                       "add its track by hand")
    return {"about": THEROCK_ABOUT, "index_url": index, "torch": torch, "lock_sha256": None,
            "triton": therock_triton(version, base_path, args, kernels_commit), "unresolved": ["lock_sha256"]}


def track_of(version: str) -> str:
    return "{}.{}".format(*release_key(version).release)


@dataclass
class Proposal:
    track: str
    version: str
    aiter_tag: str
    base_dockerfile: str
    same_stack: bool
    notes: list[str]


def add_track(data: dict, sdist: Sdist, release: Release) -> Proposal:
    """Add the release as a track to data (the new default where its stack is built here)."""
    newest = model.track_names(data)[0]
    base_path, same = choose_base(release, model.section(data, "base_image", newest))
    args = release.base_dockerfiles[base_path]
    tag = args.get("AITER_BRANCH")
    if not tag or not tag.startswith("v") or final(tag, post=True) is None:
        raise PinError(f"vLLM {release.version}'s {base_path} names no AITER release tag (AITER_BRANCH={tag!r}): "
                       "add its track by hand")
    notes: list[str] = []
    stack: dict = {}
    if not same and args.get("ROCM_SDK_VERSION") and args.get("BASE_IMAGE"):
        # upstream's base installs TheRock ROCm as wheels on a plain image: the track records that stack, its
        # base image (with the digest upstream names) and the SDK version
        image, image_tag, digest = image_parts(args["BASE_IMAGE"])
        stack = {"stack": model.THEROCK_STACK,
                 "base_image": {"name": image, "tag": image_tag, "digest": digest,
                                "unresolved": [] if digest else ["digest"]},
                 "rocm": {"version": args["ROCM_SDK_VERSION"]},
                 "therock": therock_pins(release.version, base_path, args, release.triton_kernels_commit)}
        notes.append(f"vLLM {release.version}'s {base_path} builds on TheRock ROCm {args['ROCM_SDK_VERSION']} "
                     f"(wheels on {args['BASE_IMAGE']}): the track records that stack; its TheRock lock "
                     f"({model.LOCKS_DIR / model.therock_lock_name(track_of(release.version))}, "
                     "python3 -m tools.pins therock prints its input) is made on a host that reaches TheRock's index")
    elif not same:
        shared = model.section(data, "base_image", newest)
        notes.append(f"vLLM {release.version} has no base Dockerfile for {shared['name']}:{shared['tag']}; "
                     f"{base_path} builds on {args.get('BASE_IMAGE')}: the track keeps the shared ROCm stack "
                     "until its own rocm, base_image and pytorch are added")
    name = track_of(release.version)
    if not release.triton_kernels_commit:
        raise PinError(f"vLLM {release.version}: cmake/external_projects/triton_kernels.cmake names no ROCm "
                       "triton_kernels commit: add its track by hand")
    vllm = {"version": release.version, "tag": f"v{release.version}", "commit": None, "unresolved": ["commit"],
            "sdist": {"url": sdist.url, "sha256": sdist.sha256},
            "triton_kernels_commit": release.triton_kernels_commit}
    if release.commit_prefix:
        vllm["commit_prefix"] = release.commit_prefix
    else:
        notes.append(f"vLLM {release.version}'s sdist records no commit id: commit_prefix left out")
    data["tracks"][name] = {
        "about": f"vLLM {name} on the ROCm stack of its {base_path}, with the AITER that file names "
                 "(proposed by python3 -m tools.pins discover).",
        "upstream_base_dockerfile": base_path,
        "aiter": tag,
        "vllm": vllm,
        **stack,
    }
    if tag not in data["aiter"]["pins"]:
        pins = ["commit", "ck_commit", "hipkittens_commit", "requirements_lock_sha256"]
        data["aiter"]["pins"][tag] = {"tag": tag, **dict.fromkeys(pins), "unresolved": pins}
    if stack.get("stack", model.ROCM_IMAGE_STACK) in model.BUILT_STACKS:
        data["default_track"] = name
    else:
        notes.append(f"the default track stays {data['default_track']}: track {name}'s images cannot be built here yet")
    return Proposal(name, release.version, tag, base_path, same, notes)


def newer_aiter_tags(data: dict, tags: list[str]) -> list[str]:
    """One line per track whose AITER tag is older than the newest release tag of AITER."""
    releases = sorted((t for t in tags if _aiter_key(t)), key=_aiter_key)
    if not releases:
        return []
    newest = releases[-1]
    lines = []
    for name in model.track_names(data):
        tag = data["aiter"]["pins"][data["tracks"][name]["aiter"]]["tag"]
        if _aiter_key(tag) and _aiter_key(tag) < _aiter_key(newest):
            lines.append(f"track {name} builds AITER {tag}; AITER has {newest} (not taken: a track follows the AITER "
                         "its vLLM names; try it with AITER_PIN)")
    return lines


def _aiter_key(tag: str) -> Version | None:
    """An AITER release tag (vX.Y.Z or vX.Y.Z.postN) as a version; None for any other tag."""
    return final(tag, post=True) if tag.startswith("v") else None


def aiter_tags(repository: str) -> list[str]:
    out = resolve._git("ls-remote", "--tags", "--", repository, url=repository)
    return sorted({line.split("refs/tags/", 1)[1].removesuffix("^{}") for line in out.splitlines()
                   if "refs/tags/" in line})


def summary(old: Release, new: Release, proposal: Proposal) -> str:
    """Markdown: the new track and what changed upstream between the two releases' files."""
    lines = [f"### vLLM {new.version}: track {proposal.track}",
             "",
             f"- AITER {proposal.aiter_tag} (named by `{proposal.base_dockerfile}` of the sdist)",
             f"- the ROCm stack of the newest track: {'yes' if proposal.same_stack else 'no'}",
             *[f"- {note}" for note in proposal.notes],
             "",
             f"Changed upstream since vLLM {old.version} (requirement files and ROCm Dockerfiles):", ""]
    changed = [p for p in sorted(set(old.files) | set(new.files)) if old.files.get(p, "") != new.files.get(p, "")]
    for path in changed:
        a, b = old.files.get(path, ""), new.files.get(path, "")
        diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), f"{old.version}/{path}",
                                         f"{new.version}/{path}", lineterm="", n=1))
        more = [f"... {len(diff) - SUMMARY_LINES} more lines"] if len(diff) > SUMMARY_LINES else []
        lines += [f"<details><summary>{path}</summary>", "", "```diff", *diff[:SUMMARY_LINES], *more, "```", "",
                  "</details>", ""]
    if not changed:
        lines.append("(none)")
    return "\n".join(lines) + "\n"
