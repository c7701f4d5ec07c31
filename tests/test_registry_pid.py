"""ci/test-machine/registry.sh signals only the docker-registry it started: its pid file holds the pid
and the start time the process had then, and a number another process holds since (a stale pid file
after a reboot or a crash) is never signalled. A zombie registry counts as stopped. No docker-registry
is needed: `stop` is driven against stand-in processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci/test-machine/registry.sh"


def _start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def _stop(state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REGISTRY_STATE": str(state), "TMPDIR": str(state.parent), "REGISTRY_NO_INSTALL": "1"}
    return subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not the registry, holding the number a stale pid file names."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("recorded", ["pid only", "another start time"])
def test_stop_never_signals_another_process_that_holds_the_pid_files_number(tmp_path, bystander, recorded):
    state = tmp_path / "state"
    state.mkdir()
    start = int(_start_time(bystander.pid))
    line = f"{bystander.pid}\n" if recorded == "pid only" else f"{bystander.pid} {start - 1}\n"
    (state / "registry.pid").write_text(line)
    stopped = _stop(state)
    assert stopped.returncode == 0, stopped.stderr
    time.sleep(0.2)
    assert bystander.poll() is None, f"registry.sh stop signalled pid {bystander.pid}, which it never started"
    assert not (state / "registry.pid").exists()


def test_stop_ends_the_process_it_recorded(tmp_path, bystander):
    state = tmp_path / "state"
    state.mkdir()
    (state / "registry.pid").write_text(f"{bystander.pid} {_start_time(bystander.pid)}\n")
    t0 = time.monotonic()
    stopped = _stop(state)
    assert stopped.returncode == 0, stopped.stderr
    assert bystander.wait(5) == -15 and time.monotonic() - t0 < 5
    assert not (state / "registry.pid").exists()


def test_a_zombie_registry_counts_as_stopped(tmp_path):
    """A registry that exited and waits to be reaped by its parent (a test process that adopted it):
    stop neither waits out its grace period nor fails."""
    state = tmp_path / "state"
    state.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (state / "registry.pid").write_text(f"{proc.pid} {_start_time(proc.pid)}\n")
        proc.stdin.close()  # it exits; not reaped until proc.wait() below
        deadline = time.monotonic() + 10
        while open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        t0 = time.monotonic()
        stopped = _stop(state)
        assert stopped.returncode == 0, stopped.stderr
        assert time.monotonic() - t0 < 5, "stop waited on a zombie"
    finally:
        proc.wait()
