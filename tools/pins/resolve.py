"""`resolve`: tags to commits (with the CK and HipKittens commits AITER records) and the base image digest.

Every git, HTTP and registry call of tools.pins goes through _git, _http or image_digest here, bounded in time
as a whole (PINS_TIMEOUT, default 60 s; an HTTP connection PINS_CONNECT_TIMEOUT, default 5 s) however slowly
its server keeps answering: an error names the URL or image, its credentials masked."""
from __future__ import annotations

import os
import re
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import urllib3
from rocm_vllm_runtime import children, files, numeric, secret_values, web

from . import model
from .model import PinError


def seconds(name: str, default: str) -> float:
    """A time limit from the environment variable name, read as every duration setting is."""
    try:
        return numeric.duration(name, os.environ.get(name, default))
    except numeric.SettingError as exc:
        raise PinError(str(exc)) from None


def timeout() -> float:
    return seconds("PINS_TIMEOUT", "60")


def _git(*args: str, cwd: str | None = None, url: str = "") -> str:
    limit = timeout()
    # lowSpeed*: a server that accepts the connection and then stalls is cut off as well.
    cmd = ["git", "-c", "http.lowSpeedLimit=1", "-c", f"http.lowSpeedTime={max(1, int(limit))}", *args]
    where = secret_values.masked_url(url or next((a for a in args if "://" in a), ""))
    proc = children.output(cmd, limit, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"}, cwd=cwd)
    if proc.error:
        raise PinError(f"cannot run git ({proc.error}): install git")
    if proc.timed_out:
        raise PinError(f"git {args[0]} {where}: no answer within {limit:g}s: check the network or proxy "
                       f"(or raise PINS_TIMEOUT)")
    if proc.returncode != 0:
        last = secret_values.masked_url(proc.stderr.strip().splitlines()[-1]) if proc.stderr.strip() else \
            f"exit status {proc.returncode}"
        raise PinError(f"git {args[0]} {where} failed: {last}")
    return proc.stdout


def tag_commit(repository: str, tag: str) -> str:
    """The commit a tag names (annotated tags peeled)."""
    out = _git("ls-remote", "--", repository, f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}", url=repository)
    refs = dict(reversed(line.split("\t")) for line in out.splitlines() if "\t" in line)
    commit = refs.get(f"refs/tags/{tag}^{{}}") or refs.get(f"refs/tags/{tag}")
    if not commit:
        raise PinError(f"{repository} has no tag {tag!r}: check the tag in versions.json")
    return commit


HIPKITTENS_FILE = "aiter/jit/core.py"


def fetch_commit(repository: str, commit: str, repo: str) -> None:
    """One commit of repository fetched into a scratch repository at repo (blobs on demand where allowed)."""
    _git("init", "--quiet", repo)
    _git("remote", "add", "--", "origin", repository, cwd=repo)
    try:
        _git("fetch", "--quiet", "--depth", "1", "--filter=blob:none", "origin", commit, cwd=repo, url=repository)
    except PinError:  # servers that do not allow fetching a bare commit or filters
        _git("fetch", "--quiet", "origin", "+refs/tags/*:refs/tags/*", "+refs/heads/*:refs/heads/*",
             cwd=repo, url=repository)


def fetch_files(repository: str, commit: str, paths: list[str], dest: Path) -> None:
    """The files at paths of one commit (absent ones left out) under dest, fetched without a checkout."""
    repo = str(dest / ".git-scratch")
    fetch_commit(repository, commit, repo)
    for rel in paths:
        listed = _git("ls-tree", "--name-only", commit, "--", rel, cwd=repo).strip()
        if not listed:
            continue
        text = _git("show", f"{commit}:{rel}", cwd=repo, url=repository)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def aiter_commit_facts(repository: str, commit: str, ck_path: str) -> tuple[str, str]:
    """(CK submodule commit at ck_path, HipKittens commit aiter/jit/core.py names or "none") of an AITER commit."""
    with tempfile.TemporaryDirectory(prefix="pins-") as tmp:
        fetch_commit(repository, commit, tmp)
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


def resolve_aiter(data: dict, name: str, force: bool = False) -> list[str]:
    aiter = data["aiter"]
    pin = model.aiter_pin(data, name)
    commit = tag_commit(aiter["repository"], pin["tag"])
    ck, hipkittens = aiter_commit_facts(aiter["repository"], commit, aiter["ck_submodule_path"])
    return _set(pin, f"aiter.pins.{name}", {"commit": commit, "ck_commit": ck, "hipkittens_commit": hipkittens}, force)


def resolve_vllm(data: dict, track: str, force: bool = False) -> list[str]:
    vllm = data["tracks"][track]["vllm"]
    where = f"tracks.{track}.vllm"
    commit = tag_commit(data["vllm"]["repository"], vllm["tag"])
    prefix = vllm.get("commit_prefix")
    if prefix and not commit.startswith(prefix):
        raise PinError(f"vllm tag {vllm['tag']} is {commit}, which does not start with {where}.commit_prefix "
                       f"{prefix}: the tag moved or the prefix is wrong")
    return _set(vllm, where, {"commit": commit}, force)


# The most bytes of one answer: a JSON answer in memory, or a download fed to a sink (an sdist).
BODY_LIMIT = 64 << 20
DOWNLOAD_LIMIT = 2 << 30


# The most redirects one request follows (a mirror answering 302); past it, one line.
REDIRECTS = 5


def _pool(url: str) -> tuple[urllib3.PoolManager, str]:
    """(the client for url, how it connects): through the environment's proxy, as pip and git take it
    (scheme optional; user:password@ in it sent as Proxy-Authorization, percent-escapes decoded, as
    pip and curl send it); a loopback host (rocm_vllm_runtime.web.is_loopback) always directly. A
    proxy setting urllib3 cannot use is one line, its password masked."""
    host = numeric.url("the URL", url).host
    proxy = urllib.request.getproxies().get(url.split("://", 1)[0])
    if proxy and not web.is_loopback(host) and not urllib.request.proxy_bypass(host):
        shown = secret_values.masked_url(proxy)
        try:
            parsed = urllib3.util.parse_url(proxy if "://" in proxy else f"http://{proxy}")
            headers = None
            if parsed.auth:
                user, _, password = parsed.auth.partition(":")
                headers = urllib3.make_headers(proxy_basic_auth=f"{urllib.parse.unquote(user)}:"
                                                                f"{urllib.parse.unquote(password)}")
            plain = parsed._replace(auth=None).url
            return urllib3.ProxyManager(plain, proxy_headers=headers), f" through the proxy {shown}"
        except (urllib3.exceptions.HTTPError, ValueError) as exc:
            raise PinError(f"the proxy setting {shown} for {url.split('://', 1)[0]} is no proxy URL urllib3 can "
                           f"use ({type(exc).__name__}): give http://[user:password@]host:port") from None
    return urllib3.PoolManager(), ""


def _http(url: str, sink=None, max_bytes: int = BODY_LIMIT) -> bytes:
    """One HTTP GET finished within PINS_TIMEOUT as a whole; its body (or fed to sink), at most max_bytes."""
    limit, connect = timeout(), seconds("PINS_CONNECT_TIMEOUT", "5")
    shown = secret_values.masked_url(url)
    try:
        pool, via = _pool(url)
    except numeric.SettingError as exc:
        raise PinError(str(exc)) from None
    outcome: list = []
    expired = threading.Event()

    def request() -> None:
        try:
            resp = pool.request("GET", url, preload_content=False, timeout=urllib3.Timeout(
                connect=connect, read=limit, total=limit), retries=urllib3.Retry(
                total=None, connect=0, read=0, status=0, other=0, redirect=REDIRECTS, raise_on_status=False))
            if 300 <= resp.status < 400:  # a redirect not followed (no Location): its body is no answer
                raise PinError(f"{shown}: HTTP {resp.status} {resp.reason} without a place to follow: check the "
                               "mirror")
            if resp.status >= 400:
                raise PinError(f"{shown}: HTTP {resp.status} {resp.reason}: check the name/tag/version in "
                               "versions.json")
            chunks, size = [], 0
            for chunk in resp.stream(1 << 20):
                size += len(chunk)
                if size > max_bytes:
                    raise PinError(f"{shown}: the answer is longer than {max_bytes} bytes: not what is expected there")
                if expired.is_set():
                    return
                chunks.append(chunk) if sink is None else sink(chunk)
            outcome.append(b"".join(chunks))
        except Exception as exc:  # noqa: BLE001 -- handed to the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=request, daemon=True)
    worker.start()
    worker.join(limit)  # a server that trickles its headers or body is left behind at the deadline
    expired.set()
    found = outcome[0] if outcome else urllib3.exceptions.ReadTimeoutError(None, url, "")
    if isinstance(found, bytes):
        return found
    if isinstance(found, PinError):
        raise found
    if isinstance(found, urllib3.exceptions.MaxRetryError):  # what the request's one try met
        if isinstance(found.reason, urllib3.exceptions.ResponseError):
            raise PinError(f"{shown}: more than {REDIRECTS} redirects: check the mirror")
        found = found.reason or found
    why = (f"no connection within {connect:g}s (PINS_CONNECT_TIMEOUT)"
           if isinstance(found, urllib3.exceptions.ConnectTimeoutError) else
           f"no complete answer within {limit:g}s (PINS_TIMEOUT)"
           if isinstance(found, urllib3.exceptions.ReadTimeoutError) else
           f"TLS failed ({found}), check the CA bundle (SSL_CERT_FILE)"
           if isinstance(found, urllib3.exceptions.SSLError)
           else secret_values.masked_url(" ".join(str(found).split())))
    raise PinError(f"{shown}{via}: {why}: check the network or proxy")


def image_ref(name: str, tag: str, registry: str | None = None) -> str:
    """name:tag, on `registry` (a host[:port], e.g. a mirror) instead of the one the name implies."""
    if registry:
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            name = rest
        return f"{registry.rstrip('/')}/{name}:{tag}"
    return f"{name}:{tag}"


def image_digest(ref: str) -> str:
    """The digest of ref (its index where it has one), by `docker buildx imagetools inspect` (`docker login`)."""
    docker = os.environ.get("DOCKER") or "docker"
    argv = [docker, "buildx", "imagetools", "inspect", ref, "--format", "{{json .Manifest}}"]
    proc = children.output(argv, timeout())
    if proc.error:
        raise PinError(f"cannot run {docker} ({proc.error}): resolve base-image reads the digest with `docker buildx "
                       "imagetools inspect` (install Docker with buildx, or set DOCKER)")
    if proc.timed_out:
        raise PinError(f"{ref}: no answer within {timeout():g}s: check the network or proxy (or raise "
                       "PINS_TIMEOUT)")
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise PinError(f"{ref}: {why}: check the image name and tag in versions.json base_image, `docker login` "
                       "for a private registry, and the network")
    try:
        digest = files.json_value(proc.stdout, ref).get("digest")
    except (files.DataError, AttributeError):
        digest = None
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise PinError(f"{ref}: docker buildx imagetools inspect gave no sha256 digest")
    return digest


def resolve_base_image(data: dict, registry: str | None = None, force: bool = False,
                       track: str | None = None) -> list[str]:
    own = data["tracks"][track] if track else {}
    base, where = (own["base_image"], f"tracks.{track}.base_image") if "base_image" in own else \
        (data["base_image"], "base_image")
    return _set(base, where, {"digest": image_digest(image_ref(base["name"], base["tag"], registry))}, force)


def _set(node: dict, path: str, values: dict, force: bool) -> list[str]:
    """Set an item's values, all or none (a moved pin leaves the item as it was)."""
    for field, new in values.items():
        old = node.get(field)
        if old is not None and old != new and not force:
            raise PinError(f"{path}.{field} is {old} but upstream now gives {new}: the pin moved; "
                           f"check why, then rerun with --force to take the new value")
    changes = []
    for field, new in values.items():
        old = node.get(field)
        if old == new:
            continue
        node[field] = new
        if field in node.get("unresolved", []):
            node["unresolved"].remove(field)
        changes.append(f"{path}.{field}: {old} -> {new}")
    return changes
