"""The pin tool's own environment: `python3 -m ci.pins` on a Python without its libraries makes a
virtual environment from the hash lock ci/locks/pins.txt once and runs in it; what the tool imports
beyond the standard library is what ci/pins/requirements.in names (and so what the lock holds)."""
from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ci.pins import env

ROOT = Path(__file__).resolve().parents[1]


def bare(*args, cache: Path, **extra) -> subprocess.CompletedProcess:
    """python -S (no site-packages: none of the tool's libraries) -m ci.pins ARGS."""
    return subprocess.run([sys.executable, "-S", "-m", "ci.pins", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "XDG_CACHE_HOME": str(cache), **extra})


def test_a_bare_python_gets_the_environment_once_and_runs_in_it(tmp_path):
    first = bare("tracks", "--json", cache=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "ci.pins: making its environment in" in first.stderr and "ci/locks/pins.txt" in first.stderr
    again = bare("tracks", "--json", cache=tmp_path)
    assert again.returncode == 0 and "making its environment" not in again.stderr, again.stderr
    assert again.stdout == first.stdout and again.stdout.startswith("[")
    lock = (ROOT / env.LOCK).read_bytes()
    assert (tmp_path / "rocm-vllm-pins" / f"env-{hashlib.sha256(lock).hexdigest()[:16]}" / "installed").is_file()


def test_an_environment_without_the_libraries_stops_in_one_line(tmp_path):
    lock = (ROOT / env.LOCK).read_bytes()
    home = tmp_path / "rocm-vllm-pins" / f"env-{hashlib.sha256(lock).hexdigest()[:16]}"
    proc = bare("verify", cache=tmp_path, CI_PINS_ENV=str(home))
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"error: {home} lacks jsonschema, packaging, urllib3: remove that folder "
                                        "and run again"], proc.stderr


def test_the_tool_imports_only_what_its_lock_is_made_from():
    named = {line.split("#")[0].strip() for line in (ROOT / "ci/pins/requirements.in").read_text().splitlines()}
    imported = set()
    for path in (ROOT / "ci/pins").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    outside = {name for name in imported if name not in sys.stdlib_module_names and name != "__future__"}
    # jsonschema: through rocm_vllm_runtime.schema (problems), which the tool validates with
    assert outside | {"jsonschema"} == set(env.NEEDED) == named - {"", *env.TOOLS}, (outside, named)
    assert set(env.TOOLS) <= named


def test_without_uv_the_tool_runs_in_its_environment_which_has_uv(tmp_path, monkeypatch):
    """`resolve --write` on a fresh machine (the libraries there, uv not): the tool counts uv as
    missing and runs in its environment, whose lock installs uv beside its Python (where
    ci/pins/locks.py looks first), instead of stopping at the PyTorch and TheRock locks."""
    lock = (ROOT / env.LOCK).read_bytes()
    home = tmp_path / "rocm-vllm-pins" / f"env-{hashlib.sha256(lock).hexdigest()[:16]}"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CI_PINS_ENV", str(home))  # already in it: ensure says what it lacks
    monkeypatch.setenv("PATH", str(tmp_path / "no-uv-here"))
    monkeypatch.setattr(env.sys, "executable", str(tmp_path / "bin" / "python3"))
    with pytest.raises(SystemExit) as stopped:
        env.ensure(["resolve", "--write"])
    assert str(stopped.value) == f"error: {home} lacks uv: remove that folder and run again"
    assert re.search(r"^uv==[0-9.]+ \\$", lock.decode(), re.M), "ci/locks/pins.txt installs no uv"
