"""`resolve`: turn tags into commits, the CK submodule commit, the HipKittens commit AITER
names, the base image digest, the Triton distribution torch requires and wheel sha256 sums.
Needs the network (git remotes, a container registry, the wheel index); run it on a connected
machine and commit the result.

Every git and HTTP call is bounded in time: PINS_TIMEOUT seconds (default 60) without an
answer is an error naming the URL."""
from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import socket
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import model
from .model import PinError


def timeout() -> float:
    value = os.environ.get("PINS_TIMEOUT", "60")
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise PinError(f"PINS_TIMEOUT={value!r}: must be a positive number of seconds")
    return seconds


def _git(*args: str, cwd: str | None = None, url: str = "") -> str:
    limit = timeout()
    # lowSpeed*: a server that accepts the connection and then stalls is cut off as well.
    cmd = ["git", "-c", "http.lowSpeedLimit=1", "-c", f"http.lowSpeedTime={max(1, int(limit))}", *args]
    where = url or next((a for a in args if "://" in a), "")
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=limit,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except subprocess.TimeoutExpired:
        raise PinError(f"git {args[0]} {where}: no answer within {limit:g}s: check the network or proxy "
                       f"(or raise PINS_TIMEOUT)") from None
    except OSError as exc:
        raise PinError(f"cannot run git ({exc.strerror}): install git") from None
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit status {proc.returncode}"
        raise PinError(f"git {args[0]} {where} failed: {last}")
    return proc.stdout


def tag_commit(repository: str, tag: str) -> str:
    """The commit a tag names (annotated tags peeled)."""
    out = _git("ls-remote", repository, f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}")
    refs = dict(reversed(line.split("\t")) for line in out.splitlines() if "\t" in line)
    commit = refs.get(f"refs/tags/{tag}^{{}}") or refs.get(f"refs/tags/{tag}")
    if not commit:
        raise PinError(f"{repository} has no tag {tag!r}: check the tag in versions.json")
    return commit


HIPKITTENS_FILE = "aiter/jit/core.py"


def aiter_commit_facts(repository: str, commit: str, ck_path: str) -> tuple[str, str]:
    """(CK submodule commit, HipKittens commit or "none") that an AITER commit records: the
    submodule entry at ck_path, and the HipKittens commit aiter/jit/core.py names for its
    prebuild clone. Fetches that one commit (blobs on demand where the server allows)."""
    with tempfile.TemporaryDirectory(prefix="pins-") as tmp:
        _git("init", "--quiet", tmp)
        _git("remote", "add", "origin", repository, cwd=tmp)
        try:
            _git("fetch", "--quiet", "--depth", "1", "--filter=blob:none", "origin", commit, cwd=tmp, url=repository)
        except PinError:  # servers that do not allow fetching a bare commit or filters
            _git("fetch", "--quiet", "origin", "+refs/tags/*:refs/tags/*", "+refs/heads/*:refs/heads/*",
                 cwd=tmp, url=repository)
        out = _git("ls-tree", commit, "--", ck_path, cwd=tmp).split()
        if len(out) < 3 or out[1] != "commit":
            raise PinError(f"{repository}@{commit} has no submodule at {ck_path}: check aiter.ck_submodule_path")
        listed = _git("ls-tree", "--name-only", commit, "--", HIPKITTENS_FILE, cwd=tmp).strip()
        source = _git("show", f"{commit}:{HIPKITTENS_FILE}", cwd=tmp, url=repository) if listed else ""
    return out[2], hipkittens_named(source)


def hipkittens_named(source: str) -> str:
    """The commit AITER's core.py names next to the HipKittens repository URL ("none": none)."""
    m = re.search(r"HipKittens\.git.{0,200}?\b([0-9a-f]{40})\b", source, re.S)
    return m.group(1) if m else "none"


def submodule_commit(repository: str, commit: str, path: str) -> str:
    """The commit a superproject commit records for the submodule at path."""
    return aiter_commit_facts(repository, commit, path)[0]


def resolve_aiter(data: dict, name: str, force: bool = False) -> list[str]:
    aiter = data["aiter"]
    pin = model.aiter_pin(data, name)
    commit = tag_commit(aiter["repository"], pin["tag"])
    ck, hipkittens = aiter_commit_facts(aiter["repository"], commit, aiter["ck_submodule_path"])
    return _set(pin, f"aiter.pins.{name}", {"commit": commit, "ck_commit": ck, "hipkittens_commit": hipkittens}, force)


def resolve_vllm(data: dict, force: bool = False) -> list[str]:
    vllm = data["vllm"]
    commit = tag_commit(vllm["repository"], vllm["tag"])
    prefix = vllm.get("commit_prefix")
    if prefix and not commit.startswith(prefix):
        raise PinError(f"vllm tag {vllm['tag']} is {commit}, which does not start with vllm.commit_prefix "
                       f"{prefix}: the tag moved or the prefix is wrong")
    return _set(vllm, "vllm", {"commit": commit}, force)


class _Response:
    def __init__(self, headers, body: bytes):
        self.headers, self.body = headers, body


def _http(url: str, headers: dict | None = None, method: str = "GET", sink=None) -> _Response:
    """One HTTP request, bounded by PINS_TIMEOUT per read; the body is read here (or fed to
    sink in chunks). HTTP errors other than 401 and every network failure become one-line
    PinErrors naming the URL; a 401 is raised as HTTPError for the token dance."""
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout()) as resp:
            if sink is None:
                return _Response(resp.headers, resp.read())
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                sink(chunk)
            return _Response(resp.headers, b"")
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise
        raise PinError(f"{url}: HTTP {exc.code} {exc.reason}: check the name/tag/version in versions.json") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise PinError(f"{url}: no answer within {timeout():g}s: check the network or proxy (or raise "
                           "PINS_TIMEOUT)") from None
        raise PinError(f"{url}: {reason}: check the network, proxy or CA bundle (SSL_CERT_FILE)") from None
    except (TimeoutError, socket.timeout):
        raise PinError(f"{url}: no answer within {timeout():g}s: check the network or proxy (or raise "
                       "PINS_TIMEOUT)") from None
    except OSError as exc:
        raise PinError(f"{url}: {exc.strerror or exc}: check the network or proxy") from None


def image_digest(name: str, tag: str, registry: str | None = None) -> str:
    """The digest of name:tag (the manifest list / index when there is one) from a v2 registry."""
    first, _, rest = name.partition("/")
    if registry is None:
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry, name = f"https://{first}", rest
        else:
            registry = "https://registry-1.docker.io"
            name = name if "/" in name else f"library/{name}"
    accept = ", ".join([
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ])
    headers = {"Accept": accept}
    url = f"{registry}/v2/{name}/manifests/{tag}"
    try:
        resp = _http(url, headers, "HEAD")
    except urllib.error.HTTPError as exc:
        challenge = exc.headers.get("WWW-Authenticate", "")
        if exc.code != 401 or not challenge.lower().startswith("bearer"):
            raise PinError(f"{url}: HTTP {exc.code}") from None
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        query = urllib.parse.urlencode({"service": params.get("service", ""),
                                        "scope": params.get("scope", f"repository:{name}:pull")})
        if "realm" not in params:
            raise PinError(f"{url}: the registry asks for a token but names no realm: pass --registry")
        realm = f"{params['realm']}?{query}"
        try:
            token = json.loads(_http(realm).body)
        except ValueError:
            raise PinError(f"{realm}: the token answer is not JSON") from None
        headers["Authorization"] = f"Bearer {token.get('token') or token.get('access_token')}"
        try:
            resp = _http(url, headers, "HEAD")
        except urllib.error.HTTPError as exc2:
            raise PinError(f"{url}: HTTP {exc2.code} with a token: the image is private or the name is wrong") from None
    digest = resp.headers.get("Docker-Content-Digest")
    if not digest or not model.DIGEST_RE.match(digest):
        raise PinError(f"{url}: the registry gave no sha256 digest")
    return digest


def resolve_base_image(data: dict, registry: str | None = None, force: bool = False) -> list[str]:
    base = data["base_image"]
    return _set(base, "base_image", {"digest": image_digest(base["name"], base["tag"], registry)}, force)


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append(dict(attrs))


def wheel_links(index_url: str, package: str) -> list[tuple[str, str, dict]]:
    """(filename, absolute url, attributes) of every wheel on a PEP 503 simple-index page."""
    page = f"{index_url.rstrip('/')}/{canonicalize_name(package)}/"
    parser = _Links()
    parser.feed(_http(page).body.decode(errors="replace"))
    out = []
    for attrs in parser.links:
        href = attrs.get("href", "")
        url = urllib.parse.urljoin(page, href)
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        if filename.endswith(".whl"):
            out.append((filename, url, attrs))
    return out


def pypi_links(index_url: str, package: str, version: str) -> list[tuple[str, str, dict]]:
    """(filename, url#sha256=..., attributes) of every wheel of one release, from PyPI's JSON API
    (index_url: its base, https://pypi.org/pypi). Yanked files are left out."""
    url = f"{index_url.rstrip('/')}/{canonicalize_name(package)}/json"
    try:
        releases = json.loads(_http(url).body).get("releases", {})
    except ValueError:
        raise PinError(f"{url}: the answer is not JSON: check ray.index_url") from None
    files = next((f for v, f in releases.items() if _same_version(v, version)), None)
    if files is None:
        raise PinError(f"{url}: {package} has no release {version}: check the version in versions.json")
    return [(f["filename"], f"{f['url']}#sha256={f['digests']['sha256']}", {})
            for f in files if f.get("filename", "").endswith(".whl") and not f.get("yanked")]


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def platform_tags(platform: dict) -> list[str]:
    """Platform tags a glibc system (versions.json platform) accepts, most specific first, as pip
    orders them: manylinux_2_N down to 2_5 with the legacy aliases beside their glibc, then
    linux_<machine> (the PyTorch index's tag)."""
    machine = platform["machine"]
    newest = int(platform["glibc"].split(".")[1])
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for minor in range(newest, 4, -1):
        tags.append(f"manylinux_2_{minor}_{machine}")
        if minor in legacy:
            tags.append(f"{legacy[minor]}_{machine}")
    return tags + [f"linux_{machine}"]


def supported_tags(python: str, platform: dict) -> list[Tag]:
    """The wheel tags CPython `python` (e.g. "3.12") accepts on `platform`, preferred first."""
    version = tuple(int(x) for x in python.split("."))
    platforms = platform_tags(platform)
    return [*cpython_tags(version, platforms=platforms), *compatible_tags(version, platforms=platforms)]


def pick_wheel(links, package: str, version: str, python: str, platform: dict):
    """The link of the wheel of package==version that pip would install on CPython `python` on
    `platform`: filenames parsed with packaging (build tags, compressed tag sets, normalised
    names and versions); among several, the one with the most preferred tag."""
    accepted = {tag: rank for rank, tag in enumerate(supported_tags(python, platform))}
    best = None
    for link in links:
        try:
            name, found, build, tags = parse_wheel_filename(link[0])
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if name != canonicalize_name(package) or not _same_version(str(found), version):
            continue
        ranks = [accepted[t] for t in tags if t in accepted]
        if ranks and (best is None or (min(ranks), _build_order(build)) < best[0]):
            best = ((min(ranks), _build_order(build)), link)
    if best is None:
        where = f"CPython {python}, glibc {platform['glibc']} {platform['machine']}"
        raise PinError(f"no {package}=={version} wheel for {where} (cp{python.replace('.', '')}) on the index: "
                       "check the version, python.version / ray.pythons and platform in versions.json")
    return best[1]


def _build_order(build) -> tuple:
    """Higher build numbers first, as pip prefers them."""
    return (-build[0], build[1]) if build else (0, "")


def wheel_sha256(url: str) -> str:
    fragment = urllib.parse.urlsplit(url).fragment
    if fragment.startswith("sha256="):
        return fragment.split("=", 1)[1]
    digest = hashlib.sha256()
    _http(url, sink=digest.update)
    return digest.hexdigest()


def _exact_requirements(metadata: str):
    """(name, version) of each Requires-Dist with an exact == version in a wheel's METADATA."""
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if len(pins) == 1:
            yield canonicalize_name(req.name), pins[0]


def required_version(metadata: str, package: str) -> str | None:
    return next((v for name, v in _exact_requirements(metadata) if name == canonicalize_name(package)), None)


def triton_requirement(metadata: str) -> tuple[str, str] | None:
    """(distribution, version) of the Triton a torch wheel's metadata requires with ==
    (pytorch-triton-rocm, triton-rocm, triton, ... by release)."""
    return next(((name, v) for name, v in _exact_requirements(metadata) if "triton" in name), None)


def resolve_wheels(data: dict, force: bool = False) -> list[str]:
    """torch first; Triton's distribution name and version from torch's own metadata (PEP 658
    .metadata file beside the wheel); then every wheel's sha256."""
    torch = data["pytorch"]
    python = data["python"]["version"]
    changes: list[str] = []
    torch_url = None
    for key in model.WHEEL_KEYS:
        wheel = torch["wheels"][key]
        if key == "triton":
            metadata_url = torch_url.split("#")[0] + ".metadata"
            found = triton_requirement(_http(metadata_url).body.decode(errors="replace"))
            if found is None:
                raise PinError(f"{metadata_url}: torch requires no Triton with ==: set pytorch.wheels.triton "
                               "package and version by hand")
            changes += _set(wheel, "pytorch.wheels.triton", {"package": found[0], "version": found[1]}, force)
        if wheel["package"] is None or wheel["version"] is None:
            raise PinError(f"pytorch.wheels.{key}: package and version must be set to resolve its sha256")
        filename, url, _ = pick_wheel(wheel_links(torch["index_url"], wheel["package"]), wheel["package"],
                                      wheel["version"], python, data["platform"])
        if key == "torch":
            torch_url = url
        changes += _set(wheel, f"pytorch.wheels.{key}", {"sha256": wheel_sha256(url)}, force)
    return changes


def resolve_ray(data: dict, force: bool = False) -> list[str]:
    """The sha256 of each Ray wheel (ray.wheels) for every Python in ray.pythons, from PyPI's JSON
    API: the wheel pip would install there (versions.json platform)."""
    ray = data["ray"]
    changes: list[str] = []
    for key in model.RAY_WHEELS:
        wheel = ray["wheels"][key]
        links = pypi_links(ray["index_url"], wheel["package"], wheel["version"])
        sha256 = {python: wheel_sha256(pick_wheel(links, wheel["package"], wheel["version"], python,
                                                  data["platform"])[1])
                  for python in sorted(ray["pythons"])}
        changes += _set(wheel, f"ray.wheels.{key}", {"sha256": sha256}, force)
    return changes


def _set(node: dict, path: str, values: dict, force: bool) -> list[str]:
    changes = []
    for field, new in values.items():
        old = node.get(field)
        if old == new:
            continue
        if old is not None and not force:
            raise PinError(f"{path}.{field} is {old} but upstream now gives {new}: the pin moved; "
                           f"check why, then rerun with --force to take the new value")
        node[field] = new
        if field in node.get("unresolved", []):
            node["unresolved"].remove(field)
        changes.append(f"{path}.{field}: {old} -> {new}")
    return changes
