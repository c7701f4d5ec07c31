"""A loopback server is always reached directly, never through the environment's proxy (Docker hands
its client's http_proxy/HTTP_PROXY/all_proxy into containers): every request of the runtime goes
through rocm_vllm_runtime.web (the one HTTP door; the pin tool's own client asks its is_loopback).

Every entry point is driven with all proxy variables naming a local fake proxy that answers every
request as a healthy server would: the health probe (the compose health check, as a command),
bench readiness, accuracy readiness, the registry check of ci/test-machine/registry.sh, the pin
tool's client, and the environment vLLM's and lm-eval's clients run in. The proxy must receive
nothing (so never the Authorization header), and with no server running every check must fail
instead of reporting the proxy's answer. An architecture test keeps urlopen and its kin in
rocm_vllm_runtime.web."""
from __future__ import annotations

import ast
import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from owner_scan import python_files

from rocm_vllm_runtime import accuracy, bench, health, web

ROOT = Path(__file__).resolve().parents[1]
KEY = "sekret-api-key-123"
PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def _serve(record: list, redirect_to: str = "") -> http.server.ThreadingHTTPServer:
    """A server on 127.0.0.1 answering as a healthy vLLM server (and a registry's /v2/: 401) would;
    every request line and its headers recorded."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            record.append((self.command, self.path, dict(self.headers)))
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            path = self.path.split("://", 1)[-1].partition("/")[2]  # a proxy is asked for the whole URL
            if redirect_to:
                status, doc = 302, {}
            elif path.startswith("v2"):
                status, doc = 401, {}
            elif path == "v1/models":
                status, doc = 200, {"data": [{"id": "tiny"}]}
            elif path == "v1/completions":
                status, doc = 200, {"choices": [{"text": "x"}]}
            else:
                status, doc = 200, {}
            body = json.dumps(doc).encode()
            self.send_response(status)
            if redirect_to:
                self.send_header("Location", redirect_to)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture()
def proxy(monkeypatch):
    """What a fake proxy named by every proxy variable received (it answers as a healthy server)."""
    received: list = []
    server = _serve(received)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    for name in PROXY_VARS:
        monkeypatch.setenv(name, url)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    yield received
    server.shutdown()
    server.server_close()


@pytest.fixture()
def server():
    """(base URL of a healthy server, what it received)."""
    received: list = []
    httpd = _serve(received)
    yield f"http://127.0.0.1:{httpd.server_address[1]}", received
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture()
def nothing() -> str:
    """The base URL of a port where nothing listens."""
    httpd = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = httpd.server_address[1]
    httpd.server_close()
    return f"http://127.0.0.1:{port}"


def test_the_fake_proxy_is_what_urllib_would_use(proxy, nothing):
    """The stand-in is a working proxy: a plain urlopen of a loopback URL reaches it (the defect). A
    fresh opener reads the proxy variables now (urlopen's own is made once per process, by whichever
    test used it first)."""
    with urllib.request.build_opener().open(f"{nothing}/health", timeout=5) as resp:
        assert resp.status == 200
    assert proxy and proxy[0][1] == f"{nothing}/health"


def _health_command(base: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_API_KEY": KEY, **env_extra}
    port = base.rsplit(":", 1)[1]
    return subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.health", "--generate", "--timeout", "5"],
                          env={**env, "SERVE_PORT": port}, capture_output=True, text=True, timeout=60)


def test_health_probe_reaches_the_server_directly(proxy, server, nothing):
    base, received = server
    proc = _health_command(base, {})
    assert proc.returncode == 0, proc.stderr
    assert [r[1] for r in received] == ["/health", "/v1/models", "/v1/completions"]
    assert received[1][2].get("Authorization") == f"Bearer {KEY}"
    proc = _health_command(nothing, {})
    assert proc.returncode == 1 and "no answer" in proc.stderr, proc.stderr
    # in process too, with localhost and ::1-free spellings of the same server
    assert health.problem(base.replace("127.0.0.1", "localhost"), True, KEY, 5) == ""
    assert proxy == [], "the proxy received a loopback request"
    assert KEY not in repr(proxy)


def test_bench_and_accuracy_readiness_reach_the_server_directly(proxy, server, nothing):
    base, received = server
    assert bench.healthy(base) and bench.grace(False, base) == 60.0
    assert accuracy.served_model(base) == "tiny"
    assert not bench.healthy(nothing) and bench.grace(False, nothing) == 5.0
    with pytest.raises(OSError):
        accuracy.served_model(nothing)
    assert received and proxy == []


def test_a_redirect_is_an_answer_never_followed(proxy, nothing):
    received: list = []
    httpd = _serve(received, redirect_to=f"{nothing}/elsewhere")
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        why = health.problem(base, True, KEY, 5)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert "answered HTTP 302" in why, why
    assert len(received) == 1 and proxy == []


def test_the_registry_check_reaches_the_registry_directly(proxy, server, nothing, tmp_path):
    base, received = server
    state = tmp_path / "state"
    state.mkdir()

    def status(url: str) -> int:
        (state / "port").write_text(url.rsplit(":", 1)[1] + "\n")
        return subprocess.run(["bash", str(ROOT / "ci/test-machine/registry.sh"), "status"], timeout=60,
                              env={**os.environ, "REGISTRY_STATE": str(state)}, capture_output=True).returncode

    assert status(base) == 0 and received[-1][1] == "/v2/"
    assert status(nothing) == 1  # the proxy would have answered 401
    assert proxy == []


def test_the_pin_tools_client_connects_directly_to_loopback(proxy):
    from tools.pins import resolve  # noqa: PLC0415

    for url in ("http://127.0.0.1:9/simple/", "http://localhost:9/x", "http://[::1]:9/x"):
        assert resolve._pool(url)[1] == "", url
    assert "through the proxy" in resolve._pool("http://mirror.example/simple/")[1]


def test_in_process_clients_run_with_loopback_in_no_proxy(proxy, server):
    """vllm bench serve (aiohttp, trust_env) and lm-eval (requests) read proxies from the environment:
    they run inside web.direct(), where the environment's own lookup bypasses the proxy for the server."""
    base, received = server
    with web.direct():
        with urllib.request.build_opener().open(f"{base}/v1/models", timeout=5) as resp:
            assert resp.status == 200
        for host in ("127.0.0.1", "localhost"):
            assert urllib.request.proxy_bypass_environment(host), host
    assert "no_proxy" not in os.environ and proxy == []


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.9.8.7", True), ("127.1", True), ("2130706433", True), ("0x7f.1", True),
    ("localhost", True), ("LOCALHOST.", True), ("api.localhost", True), ("::1", True), ("[::1]", True),
    ("::ffff:127.0.0.1", True), ("0.0.0.0", True), ("::", True),
    ("128.0.0.1", False), ("10.0.0.1", False), ("mirror.example", False), ("localhost.example", False),
    ("127.0.0.1.nip.io", False), ("::2", False), ("fade.cafe", False), ("", False),
])
def test_what_is_loopback(host, loopback):
    assert web.is_loopback(host) is loopback


# urlopen and its kin: the names that open an HTTP connection.
OPENERS = {"urlopen", "build_opener", "OpenerDirector", "HTTPConnection", "HTTPSConnection", "urlretrieve"}
# Their other owner: the pin tool's client (tests/test_network_reads.py holds tools/pins to it).
ELSEWHERE = {"tools/pins/resolve.py"}


def openers(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in OPENERS:
                lines.append(node.lineno)
    return lines


def test_only_the_web_module_opens_http_connections():
    owner = "runtime/src/rocm_vllm_runtime/web.py"
    found = {}
    for area in ("runtime/src", "backend/src", "ci", "docker", "tools", "deploy"):
        for path in sorted(python_files(ROOT / area)):
            rel = path.relative_to(ROOT).as_posix()
            if rel == owner or rel in ELSEWHERE or "/tests/" in rel or path.name == "conftest.py":
                continue
            if lines := openers(path.read_text()):
                found[rel] = lines
    assert not found, f"HTTP requests outside rocm_vllm_runtime.web (use web.request): {found}"
    assert openers((ROOT / owner).read_text())
    assert openers("import urllib.request as u\nu.urlopen('http://x')\nfrom http.client import HTTPConnection\n"
                   "HTTPConnection('h')\n") == [2, 4]
    scripts = [p.relative_to(ROOT).as_posix() for area in ("ci", "docker") for p in (ROOT / area).rglob("*.sh")
               if "urlopen" in p.read_text() or "curl " in p.read_text()]
    assert not scripts, f"shell scripts reaching HTTP without rocm_vllm_runtime.web: {scripts}"
