"""What `resolve` needs to reach, and whether it can: before any git, registry or index call,
every distinct host (or the proxy in front of it) is tried once, all at the same time, within
PINS_CONNECT_TIMEOUT seconds (default 5). An item whose host does not answer fails at once, in one
line naming the host and why, instead of waiting PINS_TIMEOUT for each request: on a machine
without the network, resolve reports every item within seconds. Standard library only.

A route is what a connection to the source goes through: the host itself, or the HTTP proxy the
client would use (git: `git config http.proxy`, else the environment's https_proxy, http_proxy,
all_proxy and no_proxy). Through a proxy, an https source is tried with CONNECT, as the clients
do, so a proxy that refuses or cannot reach the host is named too. ssh remotes and local paths
are not tried (ssh has its own connection timeout; a path needs no network)."""
from __future__ import annotations

import base64
import ipaddress
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

from . import resolve
from .resolve import numbers, secrets

DEFAULT_PORTS = {"http": 80, "https": 443, "git": 9418}
# Where Docker Hub's images (a name without a registry host) are served.
DOCKER_HUB = ("docker.io", "registry-1.docker.io")


def connect_timeout() -> float:
    return resolve.seconds("PINS_CONNECT_TIMEOUT", "5")


@dataclass(frozen=True)
class Source:
    """What an item reads: a git remote ("git"), an image on a registry ("registry"; address is the
    image reference, registry the host[:port] it is read from), a wheel index ("index") or TheRock's
    wheel index ("therock")."""
    kind: str
    address: str
    registry: str = ""

    def describe(self) -> str:
        """What the source is, its credentials masked."""
        address = secrets.masked_url(self.address)
        if self.kind == "git":
            return f"the git remote {address} (commits)"
        if self.kind == "registry":
            return f"the container registry {secrets.masked_url(self.registry)} (the digest of {address})"
        if self.kind == "therock":
            return f"TheRock's wheel index {address} (the TheRock lock)"
        return f"the PyTorch wheel index {address} (the PyTorch lock)"


@dataclass(frozen=True)
class Route:
    host: str
    port: int
    proxy: tuple[str, int] | None = None
    proxy_auth: str = ""
    tunnel: bool = False  # through the proxy with CONNECT (an https source)

    def __str__(self) -> str:
        where = f"{self.host}:{self.port}"
        return f"{where} through the proxy {self.proxy[0]}:{self.proxy[1]}" if self.proxy else where


def registry_host(image: str, registry: str | None = None) -> str:
    """The registry an image name is read from: --registry, the host its name starts with, else
    Docker Hub."""
    if registry:
        return registry.rstrip("/")
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB[0]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _git_proxy(url: str) -> str | None:
    """git's own proxy setting for url (`http.proxy`, by URL match): None when unset, "" when set
    empty (no proxy)."""
    try:
        proc = subprocess.run(["git", "config", "--get-urlmatch", "http.proxy", url], capture_output=True,
                              text=True, timeout=connect_timeout())
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _proxy_route(host: str, port: int, scheme: str, proxy: str | None) -> Route:
    if not proxy:
        return Route(host, port)
    try:
        parts = numbers.url("the proxy", proxy if "://" in proxy else f"http://{proxy}",
                            ("http", "https", "socks4", "socks4a", "socks5", "socks5h"))
    except numbers.SettingError:
        return Route(host, port)  # not a proxy URL: the client goes without one too
    if parts.scheme not in ("http", "https"):  # SOCKS: the proxy itself is what must answer
        return Route(host, port, (parts.host, parts.port or 1080))
    auth = ""
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    proxy_port = parts.port or DEFAULT_PORTS[parts.scheme]
    return Route(host, port, (parts.host, proxy_port), auth, tunnel=scheme == "https" and parts.scheme == "http")


def _env_proxy(scheme: str, host: str, port: int) -> str | None:
    proxies = urllib.request.getproxies_environment()
    if urllib.request.proxy_bypass_environment(f"{host}:{port}", proxies):
        return None
    return proxies.get(scheme) or proxies.get("all")


def route(source: Source) -> Route | None:
    """The connection source needs, or None when it needs none this module can try. Its URL (and
    port) is read by rocm_vllm_runtime.numbers.url: a SettingError names what is wrong."""
    if source.kind == "registry":
        parts = numbers.url("the registry", f"https://{source.registry}", ("https",))
        host = parts.host
        if host == DOCKER_HUB[0]:
            host = DOCKER_HUB[1]
        if not host or (parts.port is None and _loopback(host)):
            return None  # a local registry without a port may answer on http or https: let the client try
        port = parts.port or 443
        # Docker's client (Go) never sends a loopback host through a proxy.
        return _proxy_route(host, port, "https", None if _loopback(host) else _env_proxy("https", host, port))
    if urllib.parse.urlsplit(source.address).scheme not in DEFAULT_PORTS:
        return None  # ssh, file://, a local path
    parts = numbers.url("the URL", source.address, tuple(DEFAULT_PORTS))
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    if parts.scheme == "git":
        return Route(parts.host, port)
    proxy = _git_proxy(source.address) if source.kind == "git" else None
    if proxy is None:
        proxy = _env_proxy(parts.scheme, parts.host, port)
    return _proxy_route(parts.host, port, parts.scheme, proxy)


def _try(r: Route, limit: float) -> str | None:
    """None when r answers within limit seconds, else why not (one phrase)."""
    deadline = time.monotonic() + limit
    host, port = r.proxy or (r.host, r.port)
    try:
        with socket.create_connection((host, port), timeout=limit) as sock:
            if not r.tunnel:
                return None
            auth = f"Proxy-Authorization: Basic {r.proxy_auth}\r\n" if r.proxy_auth else ""
            sock.sendall(f"CONNECT {r.host}:{r.port} HTTP/1.1\r\nHost: {r.host}:{r.port}\r\n{auth}\r\n".encode())
            answer = b""
            while b"\n" not in answer and len(answer) < 4096:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
            status = answer.split(b"\n", 1)[0].decode(errors="replace").strip()
            code = status.split(" ", 2)[1] if status.startswith("HTTP/") and " " in status else ""
            if code.startswith("2"):
                return None
            return f"the proxy answered CONNECT with {status!r}" if status else "the proxy closed the connection"
    except socket.gaierror as exc:
        return f"cannot resolve {host} ({exc.strerror})"
    except (TimeoutError, socket.timeout):
        return f"no connection within {limit:g}s (PINS_CONNECT_TIMEOUT)"
    except OSError as exc:
        return exc.strerror or str(exc)


def unreachable(sources: list[Source]) -> dict[Source, str]:
    """{source: one line saying why it cannot be reached} for the sources that cannot: every
    distinct route tried at once, the whole within PINS_CONNECT_TIMEOUT seconds (a host whose name
    does not resolve in that time counts as not answering)."""
    limit = connect_timeout()
    out = {}
    routes = {}
    for s in dict.fromkeys(sources):
        try:
            routes[s] = route(s)
        except numbers.SettingError as exc:
            out[s] = f"{exc}: check versions.json or --registry"
    found: dict[Route, str | None] = {}
    threads = []
    for r in dict.fromkeys(r for r in routes.values() if r is not None):
        def attempt(r=r) -> None:
            found[r] = _try(r, limit)
        thread = threading.Thread(target=attempt, daemon=True)  # a name lookup cannot be cut short
        thread.start()
        threads.append(thread)
    deadline = time.monotonic() + limit
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0) + 0.5)
    for source, r in routes.items():
        if r is None:
            continue
        why = found.get(r, f"no connection within {limit:g}s (PINS_CONNECT_TIMEOUT)")
        if why is not None:
            out[source] = f"{secrets.masked_url(source.address)}: cannot reach {r}: {why}: check the network or proxy"
    return out
