"""`resolve`: turn tags into commits, the CK submodule commit, the base image digest and
wheel sha256 sums. Needs the network (git remotes, a container registry, the wheel index);
run it on a connected machine and commit the result."""
from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import subprocess
import tempfile
import urllib.parse
import urllib.request

from . import model
from .model import PinError


def _git(*args: str, cwd: str | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    if proc.returncode != 0:
        raise PinError(f"git {' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return proc.stdout


def tag_commit(repository: str, tag: str) -> str:
    """The commit a tag names (annotated tags peeled)."""
    out = _git("ls-remote", repository, f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}")
    refs = dict(reversed(line.split("\t")) for line in out.splitlines() if "\t" in line)
    commit = refs.get(f"refs/tags/{tag}^{{}}") or refs.get(f"refs/tags/{tag}")
    if not commit:
        raise PinError(f"{repository} has no tag {tag!r}: check the tag in versions.json")
    return commit


def submodule_commit(repository: str, commit: str, path: str) -> str:
    """The commit a superproject commit records for the submodule at path (fetches one commit, no blobs)."""
    with tempfile.TemporaryDirectory(prefix="pins-") as tmp:
        _git("init", "--quiet", tmp)
        try:
            _git("fetch", "--quiet", "--depth", "1", "--filter=blob:none", repository, commit, cwd=tmp)
        except PinError:  # servers that do not allow fetching a bare commit or filters
            _git("fetch", "--quiet", repository, "+refs/tags/*:refs/tags/*", "+refs/heads/*:refs/heads/*", cwd=tmp)
        out = _git("ls-tree", commit, "--", path, cwd=tmp).split()
    if len(out) < 3 or out[1] != "commit":
        raise PinError(f"{repository}@{commit} has no submodule at {path}: check aiter.ck_submodule_path")
    return out[2]


def resolve_aiter(data: dict, name: str, force: bool = False) -> list[str]:
    aiter = data["aiter"]
    pin = model.aiter_pin(data, name)
    commit = tag_commit(aiter["repository"], pin["tag"])
    ck = submodule_commit(aiter["repository"], commit, aiter["ck_submodule_path"])
    return _set(pin, f"aiter.pins.{name}", {"commit": commit, "ck_commit": ck}, force)


def resolve_vllm(data: dict, force: bool = False) -> list[str]:
    vllm = data["vllm"]
    commit = tag_commit(vllm["repository"], vllm["tag"])
    prefix = vllm.get("commit_prefix")
    if prefix and not commit.startswith(prefix):
        raise PinError(f"vllm tag {vllm['tag']} is {commit}, which does not start with vllm.commit_prefix "
                       f"{prefix}: the tag moved or the prefix is wrong")
    return _set(vllm, "vllm", {"commit": commit}, force)


def _http(url: str, headers: dict | None = None, method: str = "GET"):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    return urllib.request.urlopen(req, timeout=60)


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
        token = json.load(_http(f"{params['realm']}?{query}"))
        headers["Authorization"] = f"Bearer {token.get('token') or token.get('access_token')}"
        resp = _http(url, headers, "HEAD")
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


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_links(index_url: str, package: str) -> list[tuple[str, str, dict]]:
    """(filename, absolute url, attributes) of every wheel on a PEP 503 simple-index page."""
    page = f"{index_url.rstrip('/')}/{re.sub(r'[-_.]+', '-', package).lower()}/"
    parser = _Links()
    parser.feed(_http(page).read().decode())
    out = []
    for attrs in parser.links:
        href = attrs.get("href", "")
        url = urllib.parse.urljoin(page, href)
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        if filename.endswith(".whl"):
            out.append((filename, url, attrs))
    return out


def pick_wheel(links, package: str, version: str, python: str):
    tag = "cp" + python.replace(".", "")
    found = []
    for link in links:
        parts = link[0][:-len(".whl")].split("-")
        if (len(parts) >= 5 and _norm(parts[0]) == _norm(package) and parts[1] == version
                and parts[2] == tag and parts[-1].endswith("x86_64")):
            found.append(link)
    if not found:
        raise PinError(f"no {package}=={version} wheel for {tag} x86_64 on the index: check pytorch.wheels "
                       f"versions, python.version and pytorch.index_url")
    return found[0]


def wheel_sha256(url: str) -> str:
    fragment = urllib.parse.urlsplit(url).fragment
    if fragment.startswith("sha256="):
        return fragment.split("=", 1)[1]
    digest = hashlib.sha256()
    with _http(url) as resp:
        for chunk in iter(lambda: resp.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def required_version(metadata: str, package: str) -> str | None:
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            match = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.-]+)\s*\(?==\s*([^\s;,)]+)", line)
            if match and _norm(match.group(1)) == _norm(package):
                return match.group(2)
    return None


def resolve_wheels(data: dict, force: bool = False) -> list[str]:
    torch = data["pytorch"]
    python = data["python"]["version"]
    changes: list[str] = []
    torch_url = None
    for key in model.WHEEL_KEYS:
        wheel = torch["wheels"][key]
        version = wheel["version"]
        if version is None:
            if torch_url is None:
                raise PinError(f"pytorch.wheels.{key}.version is unresolved and torch's metadata is not available")
            with _http(torch_url.split("#")[0] + ".metadata") as resp:
                version = required_version(resp.read().decode(), wheel["package"])
            if version is None:
                raise PinError(f"torch's metadata does not pin {wheel['package']}: set pytorch.wheels.{key}.version")
        filename, url, _ = pick_wheel(wheel_links(torch["index_url"], wheel["package"]), wheel["package"], version, python)
        if key == "torch":
            torch_url = url
        changes += _set(wheel, f"pytorch.wheels.{key}", {"version": version, "sha256": wheel_sha256(url)}, force)
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


def sync_dockerfiles(data: dict, root=model.REPO_ROOT) -> list[str]:
    """Rewrite the defaults of versions-defined ARGs in the Dockerfiles; returns what changed."""
    expected = model.build_args(data)
    changes = []
    for name in model.DOCKERFILES:
        path = root / name
        if not path.exists():
            continue
        lines = path.read_text().splitlines(keepends=True)
        for i, line in enumerate(lines):
            match = re.match(r"^(\s*ARG\s+)([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|\S*)(.*)$", line, re.S)
            if match and match.group(2) in expected:
                value = match.group(3).strip("\"'")
                new = expected[match.group(2)]
                if value != new:
                    quoted = f'"{new}"' if (" " in new or match.group(3).startswith('"')) else new
                    lines[i] = f"{match.group(1)}{match.group(2)}={quoted}{match.group(4)}"
                    changes.append(f"{name}:{i + 1}: ARG {match.group(2)}={expected[match.group(2)]}")
        path.write_text("".join(lines))
    return changes
