"""The one supervisor of child processes (an architecture test, tests/test_one_owner.py, fails on any
other spawn in the product). Standard library only.

Every child runs in a process group of its own, so whatever it starts in turn is reached too.
`forward_signals()` (called by each command that starts children: bench, accuracy, selftest, and as
a pytest plugin by the suites selftest runs) turns SIGTERM, SIGINT and SIGHUP into `Terminated` in
the main thread; each child's `with` block then sends
the same signal to the child's group, waits its grace period, kills what is left, and the command
exits with 128 + the signal's number. Nothing a command started is left running when it ends.

    with children.started(command, log=path) as proc: ...   # a server for the length of a block
    children.run(command)                                   # a command to its end (pytest)
    children.output(argv, timeout_s)                        # a tool's output (amd-smi, rocminfo)
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Terminated(SystemExit):
    """One of FORWARDED arrived: raised in the main thread, so every child is stopped first."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


_received: int | None = None


def received() -> int | None:
    """The signal this process was told to stop with, or None."""
    return _received


def forward_signals(interrupt: bool = False) -> None:
    """From now on SIGTERM, SIGINT and SIGHUP raise Terminated in the main thread (exit 128 + signal),
    or KeyboardInterrupt with `interrupt` (pytest's own way to stop a session, tearing its fixtures
    down). Either way each child's `with` block then stops its child with that signal."""
    def handler(signum, frame):  # noqa: ARG001
        global _received
        if _received is None:
            _received = signum
            if interrupt:
                raise KeyboardInterrupt
            raise Terminated(signum)

    for sig in FORWARDED:
        signal.signal(sig, handler)


def pytest_sessionstart(session) -> None:  # noqa: ARG001
    """`pytest -p rocm_vllm_runtime.children` (selftest's suites): a forwarded signal stops the session
    as Ctrl-C does, and the servers a suite started (bench, accuracy) are stopped with it."""
    forward_signals(interrupt=True)


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """Send the child's process group the signal this process received (SIGTERM when none), SIGKILL
    to what is left of it after `grace_s`; return once the group is gone (or after 30 s more)."""
    if proc.poll() is None and _signal_group(proc.pid, _received or signal.SIGTERM):
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)  # the leader gone, others of its group may remain
    proc.wait()
    deadline = time.monotonic() + 30.0
    while _signal_group(proc.pid, 0) and time.monotonic() < deadline:
        _signal_group(proc.pid, signal.SIGKILL)
        time.sleep(0.1)


def _spawn(command: Sequence[str], env: Mapping[str, str] | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(list(command), env=None if env is None else dict(env), start_new_session=True,
                            **kwargs)


@contextlib.contextmanager
def started(command: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
            grace_s=lambda: 60.0) -> Iterator[subprocess.Popen]:
    """A child for the length of the block, its stdout and stderr in `log`; stopped at the block's end
    (`grace_s()`: seconds it may take, asked then), whatever ended the block."""
    with open(log, "wb") as out:
        proc = _spawn(command, env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop(proc, 5.0 if _received else grace_s())


def run(command: Sequence[str], env: Mapping[str, str] | None = None, grace_s: float = 30.0) -> int:
    """Run a command to its end with this process's stdout and stderr; its exit status. The rest of
    its group is stopped when it ends, and all of it on a forwarded signal."""
    proc = _spawn(command, env)
    try:
        return proc.wait()
    finally:
        stop(proc, grace_s)


@dataclass(frozen=True)
class Output:
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    timed_out: bool = False
    error: str = ""  # the tool could not be started


def output(argv: Sequence[str], timeout_s: float = 60.0) -> Output:
    """A tool's output, its whole group killed at `timeout_s`."""
    try:
        proc = _spawn(argv, None, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        return Output(error=exc.strerror or exc.__class__.__name__)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop(proc, 0.0)
        out, err = proc.communicate()
        return Output(out, err, proc.returncode, timed_out=True)
    finally:
        if proc.returncode is None:
            stop(proc, 0.0)
    _signal_group(proc.pid, signal.SIGKILL)
    return Output(out, err, proc.returncode)
