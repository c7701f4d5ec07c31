"""Result files: written whole or not at all, through a symbolic link to its target, never two
outputs into one file. Standard library only."""
from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path


class OutputError(OSError):
    """A result file cannot be written; the message names the option and the path."""


def target_of(path: str | Path) -> Path:
    """The file a write to path changes: a symbolic link's target (followed to the end)."""
    return Path(os.path.realpath(path))


def check_outputs(outputs: Mapping[str, str | None]) -> str:
    """'' when every given output (option -> path) names a file of its own; else one line."""
    seen: dict[Path, str] = {}
    for option, path in outputs.items():
        if not path:
            continue
        target = target_of(path)
        if target in seen:
            return (f"{seen[target]} and {option} name the same file ({target}): give each output a path of "
                    "its own")
        if target.is_dir():
            return f"{option} {path} is a directory: give a file path"
        seen[target] = option
    return ""


def writable_problem(option: str, path: str) -> str:
    """'' when `path` can be written as a file (its folder is created; nothing there is changed);
    else one line naming the option. A directory there is check_outputs' to name."""
    target = Path(path)
    existed = os.path.lexists(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a"):
            pass
    except OSError as exc:
        return f"cannot write {option} {path} ({exc.strerror or exc}): choose a writable path"
    if not existed:
        target.unlink()
    return ""


def directory_problem(option: str, path: str) -> str:
    """'' when `path` is (or can be made) a folder files can be written in; else one line."""
    target = Path(path)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return f"{option} {path} is a file, not a folder: give a folder"
    except OSError as exc:
        return f"cannot make {option} {path} ({exc.strerror or exc}): choose a writable folder"
    if not os.access(target, os.W_OK | os.X_OK):
        return f"cannot write in {option} {path}: choose a writable folder"
    return ""


def outputs_problem(outputs: Mapping[str, str | None], folders: Mapping[str, str | None] | None = None) -> str:
    """'' when every result file (option -> path) can be written, each to a file of its own, and
    every output folder (option -> path) can take files; else the first problem as one line.
    Every command that writes results checks this before it starts its work, so a bad path
    never costs a run."""
    problems = [check_outputs(outputs)]
    problems += [writable_problem(o, p) for o, p in outputs.items() if p]
    problems += [directory_problem(o, p) for o, p in (folders or {}).items() if p]
    return next((p for p in problems if p), "")


def write_text(path: str | Path, text: str) -> Path:
    """Write text to path atomically (a temporary file beside the target, then a rename): a reader
    sees the old file or the new one, never part of it. A symbolic link is written through (its
    target changes, the link stays). Returns the file written."""
    target = target_of(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def write_result(prog: str, option: str, path: str, text: str) -> bool:
    """write_text, with a failure said in one line (`prog: error: ...`) instead of a traceback;
    False when the file could not be written."""
    try:
        write_text(path, text)
    except OSError as exc:
        print(f"{prog}: error: cannot write {option} {path} ({exc.strerror or exc}): choose a writable path",
              file=sys.stderr, flush=True)
        return False
    return True
