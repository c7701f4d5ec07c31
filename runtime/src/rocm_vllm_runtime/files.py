"""Result files: written whole or not at all, through a symbolic link to its target, never two
outputs into one file. Standard library only."""
from __future__ import annotations

import os
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
