"""The health probe (rocm_vllm_runtime.health) against HTTP answers a vLLM server gives in each
state; against a real vLLM server in backend/tests/engine/test_server_cpu.py and in the two-node
test, where a lost follower is seen by --generate and not by /health."""
from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading

import pytest

import time

from rocm_vllm_runtime.health import default_url, main, problem


@pytest.fixture()
def server():
    """A server answering as `state` says: health status, completion status, required API key, hang."""
    state = {"health": 200, "completion": 200, "key": "", "hang": False, "trickle": False, "requests": [],
             "models": None}

    class Handler(http.server.BaseHTTPRequestHandler):
        def reply(self, status: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def authorized(self) -> bool:
            if state["key"] and self.headers.get("Authorization") != f"Bearer {state['key']}":
                self.reply(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self) -> None:
            state["requests"].append(("GET", self.path))
            if self.path == "/health" and state["trickle"]:
                # one byte a second: each read answers within any per-read timeout
                self.send_response(200)
                self.send_header("Content-Length", "100")
                self.end_headers()
                for _ in range(100):
                    try:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                    except OSError:
                        return
                    threading.Event().wait(1)
            elif self.path == "/health":
                self.send_response(state["health"])
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/v1/models" and self.authorized():
                self.reply(200, state["models"] if state["models"] is not None else
                           {"object": "list", "data": [{"id": "/opt/models/tiny", "object": "model"}]})

        def do_POST(self) -> None:
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["requests"].append(("POST", self.path, payload))
            if state["hang"]:
                threading.Event().wait(5)
                return
            if self.path == "/v1/completions" and self.authorized():
                if state["completion"] != 200:
                    self.reply(state["completion"], {"error": {"message": "EngineCore encountered an issue"}})
                else:
                    self.reply(200, {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]})

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state["base"] = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield state
    httpd.shutdown()
    httpd.server_close()


def test_healthy_server_passes_both_checks(server):
    assert problem(server["base"], generate=False) == ""
    assert problem(server["base"], generate=True) == ""
    # one token of the served model, greedy
    assert server["requests"][-1] == ("POST", "/v1/completions", {"model": "/opt/models/tiny", "prompt": [1],
                                                                  "max_tokens": 1, "temperature": 0.0})


def test_failed_engine_is_seen_by_health(server):
    server["health"] = 503
    assert "answered HTTP 503" in problem(server["base"], generate=False)


def test_engine_that_cannot_serve_is_seen_only_by_generate(server):
    server["completion"] = 500  # /health still 200, as after a lost follower
    assert problem(server["base"], generate=False) == ""
    why = problem(server["base"], generate=True)
    assert "/v1/completions answered HTTP 500" in why and "lost node" in why


def test_hanging_request_is_bounded(server):
    server["hang"] = True
    why = problem(server["base"], generate=True, timeout=1)
    assert "no answer within 1s" in why


def test_api_key_is_sent_and_a_missing_one_named(server):
    server["key"] = "s3cret"
    assert "set VLLM_API_KEY" in problem(server["base"], generate=True)
    assert problem(server["base"], generate=True, api_key="s3cret") == ""


def test_nothing_listening():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert "no answer" in problem(f"http://127.0.0.1:{port}", generate=False, timeout=2)


def test_cli_exit_status_and_one_line(server):
    assert main(["--url", server["base"], "--generate"], env={}) == 0
    server["completion"] = 500
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.health", "--url", server["base"], "--generate"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("unhealthy: ")


def test_default_url_follows_serve_port():
    assert default_url({}) == "http://127.0.0.1:8000"
    assert default_url({"SERVE_PORT": "8011"}) == "http://127.0.0.1:8011"


def run_probe(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.health", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_timeout_bounds_the_whole_check_against_a_trickling_server(server):
    server["trickle"] = True
    start = time.monotonic()
    proc = run_probe("--url", server["base"], "--timeout", "2")
    assert time.monotonic() - start < 20  # the old per-read timeout waited the whole 100 s body
    assert proc.returncode == 1 and "no complete answer within 2s" in proc.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "-inf", "ten"])
def test_timeouts_that_are_not_positive_seconds_are_refused(value):
    proc = run_probe("--timeout", value)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--timeout" in proc.stderr


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "http://127.0.0.1:8000/health", "ftp://x", "http://"])
def test_urls_without_a_scheme_or_with_a_path_name_the_cause(url):
    proc = run_probe("--url", url)
    assert proc.returncode == 2 and "--url" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("port", ["abc", "0", "70000", "80.5", " 8000"])
def test_a_serve_port_that_is_no_port_is_one_line(port):
    proc = run_probe(env={"SERVE_PORT": port})
    assert proc.returncode == 2 and "SERVE_PORT" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("key", ["s3cret\n", "s3cret\r\n", "s3 cret", "s3cret\t"])
def test_an_api_key_an_http_header_cannot_carry_is_named_never_shown(server, key):
    server["key"] = "s3cret"
    proc = run_probe("--url", server["base"], "--generate", env={"VLLM_API_KEY": key})
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert "VLLM_API_KEY" in proc.stderr and "s3cret" not in proc.stderr and "s3" not in proc.stderr
    assert server["requests"] == []  # nothing sent with a key that cannot be one


# ---- bad input, round 4: numbers, URLs, secrets and answers each read by their one owner ----------

def test_a_url_port_past_65535_never_wraps_onto_a_healthy_server(server):
    """Port N + 65536 is refused (exit 2), not connected to N (where a healthy server answers)."""
    port = int(server["base"].rsplit(":", 1)[1])
    proc = run_probe("--url", f"http://127.0.0.1:{port + 65536}")
    assert proc.returncode == 2 and "--url" in proc.stderr and "not a TCP port" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and server["requests"] == []


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1]:x", "http://127.0.0.1:", "http://127.0.0.1:+80",
                                 "http://127.0.0.1:" + "9" * 5000])
def test_a_url_that_cannot_be_read_is_one_line(url):
    proc = run_probe("--url", url)
    assert proc.returncode == 2 and "--url" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("python3 -m rocm_vllm_runtime.health: error: --url")
    assert len(proc.stderr) < 1000  # argparse's usage + one line, a long value cut short


@pytest.mark.parametrize("value", ["1e10", "99999999", "86401", "1_0"])
def test_a_timeout_past_a_day_or_not_plain_decimal_is_refused(value):
    proc = run_probe("--timeout", value)
    assert proc.returncode == 2 and "--timeout" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("userinfo", ["user:PASSWORD@", "PASSWORD@", "user:PASSWORD:more@"])
def test_credentials_in_the_url_are_never_shown(server, userinfo):
    base = server["base"].replace("http://", f"http://{userinfo}")
    proc = run_probe("--url", base, "--generate")
    assert proc.returncode == 2 and "--url" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "PASSWORD" not in proc.stderr + proc.stdout and "***@" in proc.stderr
    why = problem(base.replace("127.0.0.1", "127.0.0.1.invalid"), generate=False, timeout=2)
    assert why and "PASSWORD" not in why


@pytest.mark.parametrize("answer,what", [([{"id": "m"}], "JSON list"), ("m", "JSON str"), (7, "JSON int"),
                                         ({"data": "m"}, "'data'"), ({"data": [{"name": "m"}]}, '"id"')])
def test_a_models_answer_of_the_wrong_shape_is_one_line_saying_so(server, answer, what):
    server["models"] = answer
    proc = run_probe("--url", server["base"], "--generate", "--timeout", "3")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "/v1/models" in proc.stderr and what in proc.stderr, \
        proc.stderr
    assert "no complete answer" not in proc.stderr
