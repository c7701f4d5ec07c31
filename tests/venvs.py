"""Python environments for the tests of the build scripts, as `python -m venv` makes them, pip included,
without ensurepip's cost at each (about 5 s of CPU an environment, 35 of them a session).

The first environment with pip a test process asks for is made by ensurepip; each later one is made without
pip and gets a copy of that one's pip (the package and its metadata: `python -m pip`, as every build script
and test calls it, works the same; no `bin/pip` launcher, whose first line would name the first one's Python)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

_FIRST: list[Path] = []  # the environment ensurepip made, whose pip the later ones copy


def _site_packages(env: Path) -> Path:
    found = sorted((env / "lib").glob("python3*/site-packages"))
    if len(found) != 1:
        raise RuntimeError(f"{env}: expected one lib/python3*/site-packages, found {found}")
    return found[0]


def make_venv(path: Path) -> Path:
    """An environment at `path` (made, with its parents) of this Python, with pip. Returns its python."""
    template = _FIRST[0] if _FIRST and (_FIRST[0] / "bin/python").exists() else None
    argv = [sys.executable, "-m", "venv", *(["--without-pip"] if template else []), str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    if template is None:
        _FIRST.append(path)
    else:
        target = _site_packages(path)
        for item in _site_packages(template).glob("pip*"):
            shutil.copytree(item, target / item.name, symlinks=True)
    return path / "bin/python"
