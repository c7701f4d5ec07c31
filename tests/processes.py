"""Whether processes a test started have ended, for every test that checks nothing is left behind.

A zombie has ended: where a test's process is a subreaper (rocm_vllm_runtime.children makes it one once
another test of the lane used it), an orphan of a server is re-parented to it and stays a zombie until
reaped, and kill(pid, 0) still finds it. So the state is read from /proc."""
from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def _state_and_group(stat_text: str) -> tuple[str, int]:
    """The state and the process group of /proc/<pid>/stat (the command name before them may hold
    spaces and parentheses)."""
    state, _ppid, group = stat_text[stat_text.rindex(")") + 2:].split()[:3]
    return state, int(group)


def running(pid: int) -> bool:
    """Whether the process runs: it exists and is no zombie."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return _state_and_group(text)[0] != "Z"


def group_running(pgid: int) -> bool:
    """Whether a process of the group runs (a zombie of it has ended)."""
    for stat in PROC.glob("[0-9]*/stat"):
        try:
            state, group = _state_and_group(stat.read_text())
        except OSError:
            continue  # ended meanwhile
        if group == pgid and state != "Z":
            return True
    return False
