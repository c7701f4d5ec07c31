"""The runtime's one door for HTTP requests: ``request`` (the health probe, bench and accuracy
readiness, the smoke suite's server, the test machine's registry check), and ``direct_env`` for
the HTTP clients of libraries it runs in process (vllm bench serve, lm-eval).

A loopback URL (127.0.0.0/8 in any spelling the resolver takes, ::1 and IPv4-mapped loopback,
localhost and names under .localhost, and 0.0.0.0/:: which reach this host too) is always reached
directly, never through the environment's proxy (http_proxy, HTTPS_PROXY, all_proxy, ...: Docker
hands its client's proxy settings into containers), whatever no_proxy says: a proxy never sees a
request meant for a local server, nor its Authorization header, and never answers for it. Other
URLs go as urllib takes them from the environment (its proxy, no_proxy). Redirects are never
followed: a request that carries an API key is not sent on elsewhere, and a 3xx is the answer.

    python3 -m rocm_vllm_runtime.web [--timeout SECONDS] URL

prints the HTTP status URL answers a GET with (exit 0), or exits 1 with one line saying why there
was no answer.
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence

# What a loopback-only client lists in no_proxy (its libraries read names, not networks).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.0/8")
_LEGACY_IPV4 = re.compile(r"(?i)[0-9a-fx.]+")


def is_loopback(host: str) -> bool:
    """Whether a URL's host reaches this machine: 127.0.0.0/8 (also as 127.1, 2130706433 or
    0x7f.1, as the resolver reads them), ::1, ::ffff:127.x.y.z, localhost, *.localhost, 0.0.0.0, ::."""
    name = host.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])
    except ValueError:
        if not _LEGACY_IPV4.fullmatch(name):
            return False
        try:
            packed = socket.inet_aton(name)
        except OSError:
            return False
        return packed[0] == 127 or packed == bytes(4)
    mapped = getattr(address, "ipv4_mapped", None)
    return any(a is not None and (a.is_loopback or a.is_unspecified) for a in (address, mapped))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201, PLR0913
        return None  # the 3xx reaches the caller as an HTTPError with its status


def request(url: str, data: bytes | None = None, headers: Mapping[str, str] | None = None,
            method: str | None = None, timeout: float = 10.0):  # noqa: ANN201 (an http.client response)
    """urlopen(url) for the runtime: a loopback host directly, never through a proxy; no redirect
    followed. Raises urllib.error.HTTPError for a 3xx, 4xx or 5xx answer (it has .code and can be
    read), URLError/OSError/TimeoutError for no answer, ValueError for a URL with credentials."""
    req = urllib.request.Request(url, data=data, headers=dict(headers or {}), method=method)
    if "@" in req.host:
        raise ValueError("a URL with credentials: the runtime sends none in a URL")
    host = urllib.parse.urlsplit(f"//{req.host}").hostname or ""
    proxies = {} if is_loopback(host) else None  # None: the environment's, as urllib reads them
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies), _NoRedirect())
    return opener.open(req, timeout=timeout)


def direct_env(env: Mapping[str, str]) -> dict[str, str]:
    """env with the loopback names added to no_proxy and NO_PROXY (one value for both), for HTTP
    clients that take their proxy from the environment (aiohttp with trust_env, requests)."""
    given = [v.strip() for k in ("no_proxy", "NO_PROXY") for v in env.get(k, "").split(",") if v.strip()]
    value = ",".join(dict.fromkeys([*given, *LOOPBACK_NAMES]))
    return {**env, "no_proxy": value, "NO_PROXY": value}


@contextlib.contextmanager
def direct() -> Iterator[None]:
    """This process's environment as ``direct_env`` makes it, for the time of the block."""
    before = {k: os.environ.get(k) for k in ("no_proxy", "NO_PROXY")}
    os.environ.update(direct_env(os.environ))
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    timeout = 10.0
    if len(args) == 3 and args[0] == "--timeout":
        from . import numeric  # noqa: PLC0415

        try:
            timeout = numeric.duration("--timeout", args[1])
        except numeric.SettingError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        args = args[2:]
    if len(args) != 1:
        print("usage: python3 -m rocm_vllm_runtime.web [--timeout SECONDS] URL", file=sys.stderr)
        return 2
    from .secret_values import masked_url  # noqa: PLC0415

    try:
        with request(args[0], timeout=timeout) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
        exc.close()
    except (OSError, ValueError) as exc:
        print(f"{masked_url(args[0])}: no answer ({masked_url(str(getattr(exc, 'reason', exc)))})", file=sys.stderr)
        return 1
    print(status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
