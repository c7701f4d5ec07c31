"""The one supervisor of child processes (an architecture test, tests/test_one_owner.py, fails on any
other spawn in the product). Standard library only.

Every child runs in a process group of its own. What leaves the group (a helper in a session of its
own, a daemon that forked twice) is found all the same: each child carries a mark in its environment
(ROCM_VLLM_SUPERVISED, handed down), its descendants are followed through /proc, and this process is
the subreaper of what it starts (PR_SET_CHILD_SUBREAPER). An orphan it adopts that way is its
children's, mark or not: it is ended with the child that stops while no other runs, at the latest at
exit. docs/self-tests.md tells the same from the user's side.

`forward_signals()` (bench, accuracy, selftest, and as a pytest plugin the suites) turns SIGTERM,
SIGINT and SIGHUP into `Terminated` in the main thread; each child's `with` block then sends that
signal to the child's group, waits its grace period, kills what is left, and the command exits with
128 + the signal's number. A signal during that clean-up is passed on to the child, cuts its grace
period to 5 s, and takes its course once everything is stopped. Signals are held while a child is
started and while its grace period is chosen, so none comes between a child's start and its stop.

    with children.started(command, log=path) as proc: ...   # a server for the length of a block
    children.run(command)                                   # a command to its end (pytest)
    children.output(argv, timeout_s)                        # a tool's output (amd-smi, rocminfo)

Each also takes `cwd`, and where an output of the child goes when not to its default (`started`
with no log: `stdout`, `stderr`; `run`: `stdout`; `output`: `stderr`), in subprocess's forms.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The marks of the children a process descends from, separated by spaces (one per supervisor above it).
SUPERVISED_ENV = "ROCM_VLLM_SUPERVISED"
# A signal during a child's grace period: the rest of that period is cut to this.
SIGNALLED_GRACE_S = 5.0
# A tool that has exited: how long its output pipes may stay open after it (a helper it left holds them).
PIPES_AFTER_EXIT_S = 2.0
KILL_WITHIN_S = 30.0
# children.output at its limit: how long what it started may take to die of SIGKILL before it returns.
UNKILLABLE_S = 1.0
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


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


@contextlib.contextmanager
def _signals_held() -> Iterator[list[int]]:
    """For the length of a clean-up, FORWARDED signals are noted (in the list yielded) instead of
    acting; the first is raised again at the end, to the handler that was in place before."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held  # signals are handled in the main thread only
        return
    before = {sig: handler for sig in FORWARDED if (handler := signal.getsignal(sig)) is not None}
    for sig in before:
        signal.signal(sig, lambda signum, frame: held.append(signum))  # noqa: ARG005
    try:
        yield held
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# ------------------------------------------------------- what a child started, however it detached

@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    group: int  # its process group
    session: int
    start: str  # start time in clock ticks since boot: with the pid, one process
    zombie: bool


def _stat(pid: int) -> _Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return _Proc(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[19].decode(),
                     fields[0] == b"Z")
    except (OSError, IndexError, ValueError):
        return None


def _processes() -> dict[int, _Proc]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    found = (_stat(int(name)) for name in names if name.isdigit())
    return {p.pid: p for p in found if p is not None}


def _marked(pid: int, mark: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:  # gone, or another user's
        return False
    prefix = f"{SUPERVISED_ENV}=".encode()
    return any(mark.encode() in entry[len(prefix):].split()
               for entry in environ.split(b"\0") if entry.startswith(prefix))


def _adopted(p: _Proc, me: _Proc) -> bool:
    """An orphan re-parented to this process (the subreaper) from what a child started: a child of this
    process in another session (every child starts in a session of its own, and nothing it starts can
    come back to this one) that is not a running child itself."""
    return p.ppid == me.pid and p.session != me.session and p.pid not in _running


def _members(root: int | None, mark: str, known: Mapping[int, str], adopt: bool) -> dict[int, _Proc]:
    """Processes of the child `root` other than itself: those of its process group, those carrying its
    mark, those known before (the same process: same start time), with `adopt` every orphan this
    process adopted (none of its other children runs, so they are the child's, mark or not), and every
    descendant of these and of the root."""
    procs = _processes()
    me = procs.get(os.getpid())
    found = {pid: p for pid, p in procs.items() if (root is not None and p.group == root)
             or (mark and _marked(pid, mark)) or (pid in known and p.start == known[pid])
             or (adopt and me is not None and _adopted(p, me))}
    kids: dict[int, list[_Proc]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p)
    todo = [*([] if root is None else [root]), *found]
    while todo:
        for p in kids.get(todo.pop(), ()):
            if p.pid not in found:
                found[p.pid] = p
                todo.append(p.pid)
    if root is not None:
        found.pop(root, None)
    found.pop(os.getpid(), None)
    return found


def _kill(p: _Proc, sig: int) -> None:
    """Signal the process `p` stands for, not one that took its pid since (through a pidfd where the
    kernel has them, 5.3+; before, checked just before the signal)."""
    try:
        fd = os.pidfd_open(p.pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd_open (ENOSYS)
        fd = -1
    try:
        now = _stat(p.pid)
        if now is not None and now.start == p.start:
            if fd < 0:
                os.kill(p.pid, sig)
            else:
                signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        if fd >= 0:
            os.close(fd)


def _reap(p: _Proc) -> None:
    """An orphan re-parented to this process (the subreaper) that has ended: gone for good."""
    if p.ppid == os.getpid():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p.pid, os.WNOHANG)


_running: dict[int, tuple[subprocess.Popen, str]] = {}  # pid of a running child -> it, its mark
_serial = itertools.count(1)
_subreaper = False


def _become_subreaper() -> None:
    """Orphans of what this process starts are re-parented to it (Linux 3.4+), not to init, and are
    ended when it exits."""
    global _subreaper
    if _subreaper:
        return
    _subreaper = True
    atexit.register(_end_all)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(ctypes.c_int(PR_SET_CHILD_SUBREAPER), ctypes.c_ulong(1), ctypes.c_ulong(0),
                   ctypes.c_ulong(0), ctypes.c_ulong(0))


def stop(proc: subprocess.Popen, grace_s: float | Callable[[], float] = 60.0,
         kill_within_s: float = KILL_WITHIN_S) -> None:
    """Send the child's process group the signal this process received (SIGTERM when none), SIGKILL
    to what is left of it after `grace_s` (a number, or a function asked once signals are held: a
    health check may tell), and to all the child started outside its group; return once all of it is
    gone (or after `kill_within_s` more). Once this process was told to stop, or is told meanwhile, the grace
    period is 5 s at most; such a signal is passed on to the group and takes its course at the end.
    With no other child running, every orphan this process adopted is ended too."""
    with _signals_held() as held:
        mark = _running.pop(proc.pid, (proc, ""))[1]
        adopt = not _running
        known = {p.pid: p.start for p in _members(proc.pid, mark, {}, adopt).values()}
        try:
            _terminate(proc, _grace(grace_s, held), held)
        finally:
            _kill_rest(proc.pid, mark, known, adopt, proc, kill_within_s)


def _grace(grace_s: float | Callable[[], float], held: list[int]) -> float:
    """Seconds the child may take to stop: `grace_s`, 5 s at most once this process is told to stop
    (a function is then not asked)."""
    if _received or held:
        return SIGNALLED_GRACE_S if callable(grace_s) else min(grace_s, SIGNALLED_GRACE_S)
    grace = grace_s() if callable(grace_s) else grace_s
    return min(grace, SIGNALLED_GRACE_S) if held else grace


def _terminate(proc: subprocess.Popen, grace_s: float, held: list[int]) -> None:
    """The group's signal, and up to `grace_s` for the child to end; a signal held meanwhile is passed
    on and cuts what is left of the period to 5 s."""
    if proc.poll() is not None or not _signal_group(proc.pid, _received or (held[0] if held else signal.SIGTERM)):
        return
    deadline, passed_on = time.monotonic() + grace_s, len(held)
    while proc.poll() is None:
        if len(held) > passed_on:
            passed_on = len(held)
            _signal_group(proc.pid, held[-1])
            deadline = min(deadline, time.monotonic() + SIGNALLED_GRACE_S)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(min(left, 0.1))


def _kill_rest(root: int | None, mark: str, known: dict[int, str], adopt: bool,
               proc: subprocess.Popen | None = None, within_s: float = KILL_WITHIN_S) -> None:
    """SIGKILL to the child `root` (its process `proc`), to what is left of its group and to all it
    started (see _members), until a look finds none of it running (a zombie that is not this process's
    to reap counts as ended) or `within_s` have passed (a process in uninterruptible sleep, a tool
    stuck in a driver, is left to the clean-up at exit); what was re-parented to this process is
    reaped."""
    deadline = time.monotonic() + within_s
    while True:
        members = _members(root, mark, known, adopt)
        known.update((p.pid, p.start) for p in members.values())
        for p in members.values():
            _reap(p)
        alive = [p for p in members.values() if not p.zombie]
        if root is not None:
            _signal_group(root, signal.SIGKILL)
        for p in alive:
            _kill(p, signal.SIGKILL)
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.0))
        if (not alive and (proc is None or proc.returncode is not None)) or time.monotonic() > deadline:
            break
        time.sleep(0.05)


def _end_all() -> None:
    """At this process's exit: a child still running (a signal came between its start and the stop
    its block owes) is stopped, and every orphan this process adopted is ended."""
    for proc, _ in list(_running.values()):
        stop(proc, SIGNALLED_GRACE_S)
    with _signals_held():
        _kill_rest(None, "", {}, adopt=True)


def _spawn(command: Sequence[str], env: Mapping[str, str] | None = None, **kwargs) -> subprocess.Popen:
    _become_subreaper()
    me = _stat(os.getpid())
    mark = f"{os.getpid()}.{me.start if me else 0}.{next(_serial)}"
    child_env = dict(os.environ if env is None else env)
    child_env[SUPERVISED_ENV] = " ".join(filter(None, [os.environ.get(SUPERVISED_ENV, ""), mark]))
    proc = subprocess.Popen(list(command), env=child_env, start_new_session=True, **kwargs)
    _running[proc.pid] = (proc, mark)
    return proc


@contextlib.contextmanager
def _supervised(command: Sequence[str], env: Mapping[str, str] | None, grace_s: float | Callable[[], float],
                kill_within_s: float | Callable[[], float] = KILL_WITHIN_S, **kwargs) -> Iterator[subprocess.Popen]:
    """The one lifetime of every child: started with signals held (none comes between its start and
    the stop it is owed), stopped when the block ends, whatever ends it (see stop)."""
    proc = None
    try:
        with _signals_held():
            proc = _spawn(command, env, **kwargs)
        yield proc
    finally:
        if proc is not None:
            stop(proc, grace_s, kill_within_s() if callable(kill_within_s) else kill_within_s)


@contextlib.contextmanager
def started(command: Sequence[str], log: Path | None, env: Mapping[str, str] | None = None,
            grace_s=lambda: 60.0, *, cwd: Path | str | None = None, stdout=None,
            stderr=None) -> Iterator[subprocess.Popen]:
    """A child for the length of the block, its stdout and stderr in `log` (with log None: where
    `stdout` and `stderr` say, this process's own streams by default: a log followed on the user's
    terminal); stopped at the block's end (`grace_s()`: seconds it may take, asked then with signals
    held; not asked once this process is told to stop: 5 s), whatever ended the block."""
    with open(log, "wb") if log is not None else contextlib.nullcontext() as out:
        streams = {"stdout": stdout, "stderr": stderr} if out is None else {"stdout": out, "stderr": subprocess.STDOUT}
        with _supervised(command, env, grace_s, cwd=cwd, **streams) as proc:
            yield proc


def run(command: Sequence[str], env: Mapping[str, str] | None = None, grace_s: float = 30.0, *,
        cwd: Path | str | None = None, stdout=None) -> int:
    """Run a command to its end with this process's stdout and stderr (its stdout elsewhere with
    `stdout`, e.g. subprocess.DEVNULL or sys.stderr); its exit status. The rest of what it started is
    stopped when it ends, and all of it on a forwarded signal."""
    with _supervised(command, env, grace_s, stdout=stdout, cwd=cwd) as proc:
        return proc.wait()


@dataclass(frozen=True)
class Output:
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    timed_out: bool = False
    error: str = ""  # the tool could not be started


def _shown(data: bytes) -> str:
    """Output that is read and shown, never trusted to be UTF-8: a byte that is not becomes U+FFFD."""
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def output(argv: Sequence[str], timeout_s: float = 60.0, *, env: Mapping[str, str] | None = None,
           cwd: Path | str | None = None, stderr=subprocess.PIPE) -> Output:
    """A tool's output within `timeout_s`, reading included: at the deadline the tool and all it
    started are killed. A tool that has exited gets its output back at once; pipes a helper of its
    still holds open are waited for 2 s at most, and the helper is stopped. `stderr` None: the tool's
    stderr goes to this process's (a long tool's progress, seen as it comes; Output.stderr is "")."""
    deadline = time.monotonic() + timeout_s
    read: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    proc = None
    try:
        # what is left when the limit is reached gets 1 s to be killed; the rest is left to the exit
        with _supervised(argv, env, 0.0, lambda: max(deadline - time.monotonic(), 0.0) + UNKILLABLE_S,
                         stdout=subprocess.PIPE, stderr=stderr, cwd=cwd) as proc:
            timed_out = _read(proc, read, deadline)
        # stopped: its group, and what it left running (a helper holding its pipes)
    except OSError as exc:
        if proc is not None:
            raise
        return Output(error=exc.strerror or exc.__class__.__name__)
    finally:
        if proc is not None:
            _drain(proc, read)
    return Output(_shown(b"".join(read["stdout"])), _shown(b"".join(read["stderr"])), proc.returncode,
                  timed_out=timed_out)


def _pipes(proc: subprocess.Popen) -> dict[str, int]:
    return {name: pipe.fileno() for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr))
            if pipe is not None and not pipe.closed}


def _read(proc: subprocess.Popen, read: dict[str, list[bytes]], deadline: float) -> bool:
    """The tool's pipes read into `read` until they close, the deadline passes, or 2 s after the tool
    ended; whether the tool was still running at the deadline."""
    with selectors.DefaultSelector() as pipes:
        for name, fd in _pipes(proc).items():
            pipes.register(fd, selectors.EVENT_READ, name)
        ended = None
        while pipes.get_map():
            now = time.monotonic()
            if ended is None and proc.poll() is not None:
                ended = now
            until = deadline if ended is None else min(deadline, ended + PIPES_AFTER_EXIT_S)
            if now >= until:
                break
            for key, _ in pipes.select(min(until - now, 0.1)):
                data = os.read(key.fd, 65536)
                if data:
                    read[key.data].append(data)
                else:
                    pipes.unregister(key.fd)
    if proc.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(deadline - time.monotonic(), 0.0))
    return proc.returncode is None


def _drain(proc: subprocess.Popen, read: dict[str, list[bytes]]) -> None:
    """What the tool wrote before its end and was not read yet, never waiting; its pipes closed."""
    for name, fd in _pipes(proc).items():
        os.set_blocking(fd, False)
        with contextlib.suppress(BlockingIOError, OSError):
            while data := os.read(fd, 65536):
                read[name].append(data)
        getattr(proc, name).close()
