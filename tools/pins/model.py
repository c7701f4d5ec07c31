"""The versions file: loading, release tracks and the build args it defines.

An unresolved pin is JSON null, listed in its object's "unresolved"; build files render it as UNRESOLVED,
which the build refuses unless ALLOW_UNRESOLVED=1. Each vLLM release line is an entry of "tracks"; what
tracks share is written once at the top level, and a track may replace one of TRACK_OVERRIDES with its own.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from rocm_vllm_runtime import files, numeric, secret_values

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "versions.json"
DOCKERFILES = ("Dockerfile.rocm_base", "Dockerfile.rocm")

UNRESOLVED = "UNRESOLVED"
# Keys whose values are git repositories, and https URLs (patterns: versions.schema.json).
REPOSITORY_KEYS = ("repository", "hipkittens_repository")
URL_KEYS = ("index_url", "url")
# Shared sections a track may replace with its own (a track on another ROCm release).
TRACK_OVERRIDES = ("rocm", "base_image", "pytorch")
# The ROCm stack a track's images build on: a ROCm container image (upstream up to vLLM 0.33), or TheRock,
# ROCm as pip wheels on a plain ubuntu image (upstream's only stack from vLLM 0.34); ROCM_STACK picks it.
ROCM_IMAGE_STACK = "rocm-image"
THEROCK_STACK = "therock"
STACKS = (ROCM_IMAGE_STACK, THEROCK_STACK)
BUILT_STACKS = (ROCM_IMAGE_STACK, THEROCK_STACK)
# The shared sections (TRACK_OVERRIDES) a stack does not use: a therock track takes PyTorch from its
# TheRock lock, not from a pytorch section.
UNUSED_SECTIONS = {THEROCK_STACK: ("pytorch",)}
LOCKS_DIR = Path("docker/locks")
# The PyTorch wheels a track installs; their Triton is the one torch requires (its lock holds it).
TORCH_WHEELS = ("torch", "torchvision", "torchaudio")
# Words of a host label or path segment naming a TheRock channel other than its releases
# (rocm.nightlies.amd.com, upstream's nightly.repo.amd.com, rocm.prereleases.amd.com).
THEROCK_NOT_RELEASE = ("nightly", "nightlies", "prerelease", "prereleases")


def therock_index_problem(url: str) -> str | None:
    """What is wrong with a TheRock index URL (https, a host, no credentials, query or fragment, nothing
    naming a nightly or pre-release once percent-decoded), or None."""
    import unicodedata  # noqa: PLC0415
    import urllib.parse  # noqa: PLC0415

    if secret_values.userinfo_spans(url):
        return "an index with credentials (a committed file never holds them)"
    try:
        parts = numeric.url("index_url", url, schemes=("https",))
    except numeric.SettingError:
        return "not an https:// index with a host (and a TCP port, where it names one)"
    if parts.query or parts.fragment:
        return "an index with a query or fragment"
    where = f"{parts.host}/{parts.path}"
    for _ in range(8):  # %256E is %6E is n
        where = urllib.parse.unquote(where)
    words = re.split(r"[^a-z0-9]+", unicodedata.normalize("NFKC", where).casefold())
    if any(w in THEROCK_NOT_RELEASE or w.startswith("nightl") for w in words):
        return "a nightly index (or a pre-release one): the release index only"
    return None


def therock_requirements(sdk_version: str, torch: dict[str, str], gpu_archs: list[str]) -> list[str]:
    """What a therock track installs from TheRock's release index, as upstream's base does but for this
    project's GPU archs only: the SDK, the PyTorch wheels, and each arch's device wheels."""
    wanted = [f"rocm[libraries,devel]=={sdk_version}", *torch_requirements(torch)]
    for arch in gpu_archs:
        wanted += [f"rocm[device-{arch}]=={sdk_version}", f"torch[device-{arch}]=={torch['torch']}",
                   f"torchvision[device-{arch}]=={torch['torchvision']}"]
    return wanted


def torch_requirements(torch: dict[str, str]) -> list[str]:
    return [f"{name}=={torch[name]}" for name in TORCH_WHEELS]


def therock_lock_name(track: str) -> str:
    return f"therock-{track}.txt"


# requirements_lock_sha256 of an AITER commit without requirements.txt: nothing to lock or install.
NO_REQUIREMENTS = "none"
_LOCK_FILE_PART_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._+-]*\Z")


def aiter_lock_name(tag: str) -> str:
    """aiter-<tag>.txt, the lock of AITER `tag`'s own requirements; PinError for a tag that cannot name a file."""
    if not _LOCK_FILE_PART_RE.match(tag):
        raise PinError(f"aiter tag {tag!r} cannot name a lock file in {LOCKS_DIR} (letters, digits and . _ + -): "
                       "fix the tag in versions.json")
    return f"aiter-{tag}.txt"


def section_path(data: dict, key: str, name: str) -> str:
    """Where versions.json holds the shared section `key` the track sees: tracks.<name>.<key> (its own), else <key>."""
    return f"tracks.{name}.{key}" if key in TRACK_OVERRIDES and key in data["tracks"][name] else key


def pytorch_lock_name(data: dict, name: str) -> str:
    """The PyTorch lock's file name, after the section it is made from (shared: pytorch.txt)."""
    return f"pytorch-{name}.txt" if "pytorch" in data["tracks"][name] else "pytorch.txt"


def track_stack(data: dict, name: str) -> str:
    return data["tracks"][name].get("stack", ROCM_IMAGE_STACK)


def therock_track_names(data: dict) -> list[str]:
    return [name for name in track_names(data) if track_stack(data, name) == THEROCK_STACK]


def built_track_names(data: dict) -> list[str]:
    """The tracks whose images this repository builds (their stack is in BUILT_STACKS), newest first."""
    return [name for name in track_names(data) if track_stack(data, name) in BUILT_STACKS]


# The backend's supported vLLM range, derived from the tracks (verify holds the file to it).
BACKEND_INIT = Path("backend/src/vllm_aiter_mla/__init__.py")
_SUPPORTED_RE = re.compile(r'^SUPPORTED_VLLM = "([^"]*)"$', re.M)


class PinError(Exception):
    """A problem with the versions file; the message names the field to change."""


def load(path: Path | str = VERSIONS_FILE) -> dict:
    """A file of a JSON object (bounded, a key given twice refused): PinError in one line."""
    try:
        data = files.read_json(path)
    except OSError as exc:
        raise PinError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    except files.DataError as exc:
        raise PinError(str(exc)) from None
    if not isinstance(data, dict):
        raise PinError(f"{path}: a versions file is a JSON object, this is a {type(data).__name__}")
    return data


def canonical(data: dict) -> str:
    """The one layout of the versions file, which every writer writes and verify holds it to."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def dump(data: dict, path: Path | str = VERSIONS_FILE) -> None:
    write_files({Path(path): canonical(data)})


def recorded_files(data: dict, path: Path, root: Path = REPO_ROOT) -> tuple[list[str], dict[Path, str]]:
    """(Dockerfile changes, {path: text}) of recording data: the versions file, the Dockerfiles' ARG defaults
    and the backend's range, for one all-or-nothing write_files."""
    docker_changes, texts = global_arg_updates(data, root)
    texts[Path(path)] = canonical(data)
    texts.update(backend_range_update(data, root))
    return docker_changes, texts


def backend_range_update(data: dict, root: Path = REPO_ROOT) -> dict[Path, str]:
    """{backend __init__.py: its text with SUPPORTED_VLLM kept within the tracks}, or {} when it is. The range
    never grows by itself (a new track stays outside until widened by hand); one that no longer fits moves."""
    path, declared = backend_supported_vllm(root)
    if declared is None or declared in backend_ranges(data).values():
        return {}
    wanted = supported_vllm(data, covered_track(data, declared))
    return {path: _SUPPORTED_RE.sub(f'SUPPORTED_VLLM = "{wanted}"', path.read_text(), count=1)}


def backend_ranges(data: dict) -> dict[str, str]:
    """{track: the SUPPORTED_VLLM from the oldest track up to that one}: the ranges the plugin may declare."""
    return {name: supported_vllm(data, name) for name in track_names(data)}


def covered_track(data: dict, declared: str) -> str:
    """The newest track whose release a SUPPORTED_VLLM string admits (the oldest track when none)."""
    names = track_names(data)
    try:
        admits = SpecifierSet(declared or "<0")
    except InvalidSpecifier:
        admits = SpecifierSet("<0")
    inside = [n for n in names if admits.contains(data["tracks"][n]["vllm"]["version"])]
    return inside[0] if inside else names[-1]


def stepped_aside(data: dict, declared: str) -> list[str]:
    """The tracks outside the declared range (newest first): the plugin registers nothing there."""
    names = track_names(data)
    return names[:names.index(covered_track(data, declared))]


def write_files(contents: dict) -> list[Path]:
    """Write every {path: text} all or nothing: each to a temporary file beside it, renamed once all are."""
    todo = {}
    for path, text in contents.items():
        path = Path(os.path.realpath(path))  # a symbolic link is written through: its target changes
        try:
            if path.read_bytes() == text.encode():
                continue
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise PinError(f"{path}: cannot read ({exc.strerror}): fix its permissions") from None
        if path.exists() and not os.access(path, os.W_OK):
            raise PinError(f"{path}: not writable: fix its permissions; nothing was written")
        todo[path] = text
    temps: dict[Path, str] = {}
    try:
        for path, text in todo.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            temps[path] = tmp
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            if path.exists():
                os.chmod(tmp, path.stat().st_mode & 0o7777)
    except OSError as exc:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise PinError(f"{path}: cannot write ({exc.strerror or exc}): free disk space or fix permissions; "
                       "nothing was written") from None
    for path, tmp in temps.items():
        os.replace(tmp, path)
    return list(temps)


def render(value) -> str:
    """A pin as a build-arg string: null becomes the UNRESOLVED sentinel."""
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    return UNRESOLVED if value is None else str(value)


def track_names(data: dict) -> list[str]:
    return sorted(data["tracks"], key=Version, reverse=True)


def track_name(data: dict, name: str | None = None) -> str:
    name = name or data["default_track"]
    if name not in data["tracks"]:
        raise PinError(f"no release track {name!r} in versions.json (tracks: {', '.join(track_names(data))}): "
                       "set TRACK to one of them")
    return name


def track(data: dict, name: str | None = None) -> dict:
    return data["tracks"][track_name(data, name)]


def section(data: dict, key: str, name: str | None = None) -> dict:
    """A shared section (rocm, base_image, pytorch) as the track sees it: its own, else the shared one."""
    own = track(data, name)
    return own[key] if key in TRACK_OVERRIDES and key in own else data[key]


def track_aiter_pin_name(data: dict, name: str | None = None, aiter_name: str | None = None) -> str:
    return aiter_name or track(data, name)["aiter"]


def supported_vllm(data: dict, up_to: str | None = None) -> str:
    """From the oldest track's release up to, not including, the minor release after track ``up_to``
    (default: the newest)."""
    names = track_names(data)
    major, minor = Version(data["tracks"][up_to or names[0]]["vllm"]["version"]).release[:2]
    return f">={data['tracks'][names[-1]]['vllm']['version']},<{major}.{minor + 1}"


def backend_supported_vllm(root: Path = REPO_ROOT) -> tuple[Path, str | None]:
    path = root / BACKEND_INIT
    try:
        m = _SUPPORTED_RE.search(path.read_text())
    except OSError:
        return path, None
    return path, m.group(1) if m else None


def aiter_pin(data: dict, name: str | None = None, track_name_: str | None = None) -> dict:
    aiter = data["aiter"]
    name = track_aiter_pin_name(data, track_name_, name)
    try:
        return aiter["pins"][name]
    except KeyError:
        known = ", ".join(sorted(aiter.get("pins", {})))
        raise PinError(f"aiter.pins has no pin named {name!r} (known: {known}); "
                       "set AITER_PIN or the track's aiter") from None


def image_ref(base: dict, allow_unresolved: bool = False) -> str:
    """name:tag@digest. An unresolved digest gives name:tag@sha256:UNRESOLVED (an invalid
    reference, so a build fails at FROM) unless allow_unresolved, which drops the digest."""
    ref = f"{render(base['name'])}:{render(base['tag'])}"
    if base.get("digest"):
        return f"{ref}@{base['digest']}"
    return ref if allow_unresolved else f"{ref}@sha256:{UNRESOLVED}"


def pytorch_pins(data: dict, name: str) -> dict:
    """The track's pytorch section; empty on a stack that takes PyTorch elsewhere (therock: its lock)."""
    unused = "pytorch" in UNUSED_SECTIONS.get(track_stack(data, name), ())
    return {} if unused else section(data, "pytorch", name)


def build_args(data: dict, aiter_name: str | None = None, allow_unresolved: bool = False,
               track_name_: str | None = None) -> dict[str, str]:
    """Every build arg of one track (default: default_track), as the Dockerfiles and the bake file name them;
    a list is ';'-joined (GPU_ARCHS) or space-joined (AITER_REQUIRED_MODULES), another stack's pin is ""."""
    name = track_name(data, track_name_)
    own = data["tracks"][name]["vllm"]
    aiter, pin = data["aiter"], aiter_pin(data, aiter_name, name)
    torch = pytorch_pins(data, name)
    therock = data["tracks"][name]["therock"] if track_stack(data, name) == THEROCK_STACK else {}
    triton = therock.get("triton", {})
    modules = aiter["required_modules"]
    args = {
        "VLLM_TRACK": name,
        "VLLM_VERSION": own["version"],
        "ROCM_STACK": track_stack(data, name),
        "ROCM_IMAGE": image_ref(section(data, "base_image", name), allow_unresolved),
        "ROCM_VERSION": section(data, "rocm", name)["version"],
        "PYTHON_VERSION": data["python"]["version"],
        "SOURCE_DATE_EPOCH": data["source_date_epoch"],
        "GPU_ARCHS": data["gpu_archs"],
        "AITER_REPOSITORY": aiter["repository"],
        "AITER_TAG": pin["tag"],
        "AITER_COMMIT": pin["commit"],
        "CK_COMMIT": pin["ck_commit"],
        "CK_SUBMODULE_PATH": aiter["ck_submodule_path"],
        "HIPKITTENS_REPOSITORY": aiter["hipkittens_repository"],
        "HIPKITTENS_COMMIT": pin["hipkittens_commit"],
        "AITER_REQUIRED_MODULES": None if modules is None else " ".join(modules),
        "AITER_REQUIREMENTS_LOCK": aiter_lock_name(pin["tag"]),
        "AITER_REQUIREMENTS_LOCK_SHA256": pin["requirements_lock_sha256"],
        "PYTORCH_INDEX_URL": torch["index_url"] if torch else "",
        "PYTORCH_LOCK": pytorch_lock_name(data, name) if torch else "",
        "PYTORCH_LOCK_SHA256": torch["lock_sha256"] if torch else "",
        **{f"{wheel.upper()}_VERSION": torch["torch"][wheel] if torch else "" for wheel in TORCH_WHEELS},
        "THEROCK_INDEX_URL": therock.get("index_url", ""),
        "THEROCK_LOCK": therock_lock_name(name) if therock else "",
        "THEROCK_LOCK_SHA256": therock.get("lock_sha256", ""),
        "TRITON_REPOSITORY": triton.get("repository", ""),
        "TRITON_COMMIT": triton.get("commit", ""),
        "TRITON_VERSION": triton.get("version", ""),
        "VLLM_REPOSITORY": data["vllm"]["repository"],
        "VLLM_TAG": own["tag"],
        "VLLM_COMMIT": own["commit"],
        "TRITON_KERNELS_REPOSITORY": data["vllm"]["triton_kernels"]["repository"],
        "TRITON_KERNELS_COMMIT": own["triton_kernels_commit"],
        "TRITON_KERNELS_PATH": data["vllm"]["triton_kernels"]["path"],
    }
    return {arg: render(value) for arg, value in args.items()}


def unresolved_pins(data: dict, aiter_name: str | None = None, track_name_: str | None = None) -> list[str]:
    """Dotted paths of every unresolved pin; with track_name_ or aiter_name, only those that track builds."""
    found: list[str] = []

    def walk(node, path):
        if isinstance(node, dict):
            for field in node.get("unresolved", []) or []:
                found.append(f"{path}.{field}" if path else field)
            for key, value in node.items():
                if key != "unresolved":
                    walk(value, f"{path}.{key}" if path else key)

    walk(data, "")
    if track_name_ is not None:
        name = track_name(data, track_name_)
        aiter_name = track_aiter_pin_name(data, name, aiter_name)
        found = [p for p in found if not p.startswith("tracks.") or p.startswith(f"tracks.{name}.")]
        overridden = [k for k in TRACK_OVERRIDES if k in data["tracks"][name]]
        overridden += UNUSED_SECTIONS.get(track_stack(data, name), ())
        found = [p for p in found if p.split(".", 1)[0] not in overridden]
    if aiter_name is not None:
        own = f"aiter.pins.{aiter_name}."
        found = [p for p in found if not p.startswith("aiter.pins.") or p.startswith(own)]
    return found


# A global ARG as the pin tool reads and writes it: one name, an optional (quoted) default, one line;
# tests/test_dockerfiles_static.py holds this reading equal to BuildKit's own parser's.
_GLOBAL_ARG_RE = re.compile(r"""^(\s*ARG\s+)([A-Za-z_][A-Za-z0-9_]*)(?:=("[^"]*"|'[^']*'|[^\s"']*))?(\s*)$""",
                            re.IGNORECASE)
_FROM_RE = re.compile(r"^\s*FROM\s", re.IGNORECASE)


def _global_lines(text: str):
    """(index, line, match) of the lines before the first FROM; match: a global ARG, or None."""
    for i, line in enumerate(text.splitlines(keepends=True)):
        if _FROM_RE.match(line):
            return
        yield i, line, _GLOBAL_ARG_RE.match(line)


def global_arg_defaults(text: str) -> dict[str, tuple[int, str | None]]:
    """{name: (line number, default)} of the ARGs before the first FROM (a stage re-declares one by name)."""
    return {m.group(2): (i + 1, None if m.group(3) is None else _unquote(m.group(3)))
            for i, _, m in _global_lines(text) if m}


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" else value


def _quote(value: str) -> str:
    if '"' in value:
        if "'" in value:
            raise PinError(f"{value!r}: a build-arg default cannot hold both quote characters: change the pin")
        return f"'{value}'"
    return f'"{value}"' if " " in value else value


def global_arg_updates(data: dict, root: Path = REPO_ROOT) -> tuple[list[str], dict[Path, str]]:
    """(what changes, {path: new text}) of the build files' pins: the Dockerfiles' global ARG defaults (every
    other byte stays) and docker-bake.pins.json, rendered again (tools/pins/render.py)."""
    from . import render  # noqa: PLC0415  (render reads this module)

    expected = build_args(data)
    changes: list[str] = []
    texts: dict[Path, str] = {}
    for name in DOCKERFILES:
        path = root / name
        if not path.exists():
            continue
        try:
            text = path.read_text()
        except OSError as exc:
            raise PinError(f"{path}: cannot read ({exc.strerror}): fix its permissions") from None
        lines = text.splitlines(keepends=True)
        for i, line, m in _global_lines(text):
            if m and m.group(2) in expected and m.group(3) is not None:
                new = expected[m.group(2)]
                if _unquote(m.group(3)) != new:
                    lines[i] = f"{m.group(1)}{m.group(2)}={_quote(new)}{m.group(4)}"
                    changes.append(f"{name}:{i + 1}: ARG {m.group(2)}={new}")
        texts[path] = "".join(lines)
    rendered = render.update(data, root)
    changes += [f"{render.BAKE_PINS}: rendered from versions.json" for _ in rendered]
    return changes, texts | rendered
