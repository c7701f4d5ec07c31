"""The benchmark's and the accuracy gate's servers: waiting for one has a total deadline (a
server that trickles its /health answer cannot hold the wait past it), and SIGTERM stops the
running server before the process exits."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from processes import running

from rocm_vllm_runtime import bench


@pytest.fixture
def trickling_server():
    """A server on loopback that answers every connection one byte per 0.2 s, forever."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()

    def serve():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            def trickle(c=conn):
                try:
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                    while not stop.is_set():
                        c.sendall(b"x")
                        time.sleep(0.2)
                except OSError:
                    pass
            threading.Thread(target=trickle, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    sock.close()


class Running:
    returncode = None

    def poll(self):
        return None


@pytest.mark.parametrize("timeout_s", [1.0, 3.0])
def test_the_wait_for_a_server_ends_at_its_deadline(trickling_server, tmp_path, timeout_s):
    log = tmp_path / "server.log"
    log.write_text("")
    backend = bench.Backend("plugin", "ROCM_AITER_MLA", bench.OURS)
    t0 = time.monotonic()
    problem = bench.start_problem(backend, Running(), trickling_server, log, timeout_s)
    took = time.monotonic() - t0
    assert "not healthy after" in problem
    assert took < timeout_s + 3.0, f"waited {took:.1f}s for a {timeout_s}s deadline"
    t0 = time.monotonic()
    assert not bench.healthy(trickling_server, 1.0)
    assert time.monotonic() - t0 < 2.5


SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from rocm_vllm_runtime import {module} as tool, bench, children
    out = Path(sys.argv[1])
    fake = [sys.executable, "-c", "import os, time, pathlib; "
            "pathlib.Path(%r).write_text(str(os.getpid())); time.sleep(600)" % str(out / "server.pid")]
    bench.server_command = lambda *a, **kw: fake
    children.forward_signals()
    backend = bench.Backend("plugin", "ROCM_AITER_MLA", bench.OURS)
    {call}
""")
CALLS = {
    "bench": "bench.run_backend(backend, [], bench.Load(), 1, out, 600.0)",
    "accuracy": "tool.run_backend(backend, [], [], tool.Settings(), 1, out, 600.0)",
}


_alive = running  # tests/processes.py: a zombie has ended

def sigterm_ends_both(proc: subprocess.Popen, server: int, server_s: float, why: str) -> None:
    """SIGTERM to the tool: it exits by it, and its server is gone within ``server_s`` seconds."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    deadline = time.monotonic() + server_s
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server), why



@pytest.mark.parametrize("module", list(CALLS))
def test_sigterm_stops_the_running_server(module, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(module=module, call=CALLS[module]))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = tmp_path / "server.pid"
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    server = int(pid_file.read_text())
    time.sleep(0.5)
    sigterm_ends_both(proc, server, 30, "the server outlived the SIGTERM'd tool")
    assert Path(tmp_path / f"server-{'accuracy-' if module == 'accuracy' else ''}plugin.log").exists()


# The block has ended (the server never came up) and the supervisor asks whether the server is healthy,
# to choose its grace period: the stand-in health check marks that moment and takes a second, as a
# real one may take up to 5 s. SIGTERM arrives inside it.
GRACE_CHECK = textwrap.dedent("""
    import pathlib, time
    def blocking_health_check(base_url, timeout_s=5.0):
        pathlib.Path({marker!r}).write_text("checking")
        time.sleep(1.0)
        return False
    def never_up(backend, proc, base_url, log, timeout_s):
        while not (out / "server.pid").is_file() or not (out / "server.pid").read_text():
            time.sleep(0.02)
        return "the stand-in server never comes up"
    bench.start_problem = never_up
    bench.healthy = blocking_health_check
""")


@pytest.mark.parametrize("module", list(CALLS))
def test_sigterm_while_the_grace_period_is_chosen_stops_the_server(module, tmp_path):
    marker = tmp_path / "checking"
    call = GRACE_CHECK.format(marker=str(marker)) + CALLS[module]
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(module=module, call=call))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = tmp_path / "server.pid"
    try:
        deadline = time.monotonic() + 30
        while not marker.is_file():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        server = int(pid_file.read_text())
        sigterm_ends_both(proc, server, 10, f"the server outlived SIGTERM to {module} while it chose the grace period")
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid_file.is_file() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
