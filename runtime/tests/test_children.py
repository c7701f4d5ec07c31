"""Child processes have one supervisor (rocm_vllm_runtime.children): each child in its own process
group; SIGTERM, SIGINT and SIGHUP to the command are forwarded to it, and nothing it started is
left running when the command ends. Checked through the real entry points (bench, selftest)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SLEEPER = "import os, time, pathlib, sys; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(600)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of an exited child counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for_pid(proc: subprocess.Popen, pid_file: Path) -> int:
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return int(pid_file.read_text())


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BENCH = textwrap.dedent("""
    import sys
    from rocm_vllm_runtime import bench
    bench.server_command = lambda *a, **kw: [sys.executable, "-c", {sleeper!r}, {pid_file!r}]
    sys.exit(bench.main(["--backends", "cpu-vllm", "--port", "{port}", "--out-dir", {out!r},
                         "--start-timeout", "600"]))
""")


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_bench_stops_its_server(tmp_path, sig):
    pid_file = tmp_path / "server.pid"
    script = BENCH.format(sleeper=SLEEPER, pid_file=str(pid_file), port=_free_port(), out=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    server = _wait_for_pid(proc, pid_file)
    time.sleep(0.5)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert _gone(server), f"the server outlived {sig.name} to bench"
    assert proc.returncode == 128 + sig, (proc.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_selftest_stops_its_pytest(tmp_path, sig):
    suites = tmp_path / "suites"
    suites.mkdir()
    pid_file = tmp_path / "pytest.pid"
    (suites / "test_selector.py").write_text(textwrap.dedent(f"""
        import os, time
        def test_waits():
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(600)
    """))
    env = {**os.environ, "SELFTEST_SUITES": str(suites)}
    proc = subprocess.Popen([sys.executable, "-m", "rocm_vllm_runtime.selftest", "selector"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pytest_pid = _wait_for_pid(proc, pid_file)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert _gone(pytest_pid), f"selftest's pytest outlived {sig.name} to selftest"
    assert proc.returncode == 128 + sig, (proc.returncode, out, err)


def test_run_leaves_no_grandchild_behind(tmp_path):
    """A child that started one of its own and exited: the group is stopped when the child ends."""
    from rocm_vllm_runtime import children  # noqa: PLC0415

    pid_file = tmp_path / "grandchild.pid"
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}, {str(pid_file)!r}])"
    code += "; import time\nwhile True:\n  time.sleep(0.1)\n  import pathlib\n"
    code += f"  if pathlib.Path({str(pid_file)!r}).is_file() and pathlib.Path({str(pid_file)!r}).read_text(): break"
    assert children.run([sys.executable, "-c", code]) == 0
    assert _gone(int(pid_file.read_text()), 10.0)


def test_output_of_a_tool_that_hangs_ends_at_its_deadline():
    from rocm_vllm_runtime import children  # noqa: PLC0415

    t0 = time.monotonic()
    result = children.output(["sleep", "30"], timeout_s=1.0)
    assert result.timed_out and time.monotonic() - t0 < 10
    assert children.output([sys.executable, "-c", "print('hi')"]).stdout == "hi\n"
    assert children.output(["no-such-tool-here"]).error


def test_a_signal_to_selftest_stops_what_its_suite_started(tmp_path):
    """The bench and accuracy suites start servers (each in its own process group) from inside
    pytest: those are stopped too, not only pytest."""
    suites = tmp_path / "suites"
    suites.mkdir()
    pid_file = tmp_path / "server.pid"
    (suites / "test_bench.py").write_text(textwrap.dedent(f"""
        import sys, time
        from rocm_vllm_runtime import children
        def test_serves(tmp_path):
            with children.started([sys.executable, "-c", {SLEEPER!r}, {str(pid_file)!r}], tmp_path / "log"):
                time.sleep(600)
    """))
    env = {**os.environ, "SELFTEST_SUITES": str(suites)}
    proc = subprocess.Popen([sys.executable, "-m", "rocm_vllm_runtime.selftest", "bench"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server = _wait_for_pid(proc, pid_file)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=90)
    assert _gone(server), "the server a suite started outlived SIGTERM to selftest"
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out, err)
