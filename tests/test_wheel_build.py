"""docker/wheel_build.py, run as the build steps run it (`python3 -B docker/wheel_build.py ...`): the
setuptools probe of build_project_wheel.sh (no build isolation where the image's setuptools builds wheels)
and build_vllm.sh's check of the built vLLM wheel against VLLM_VERSION."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docker" / "wheel_build.py"


def run(*args: str, path: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(path)} if path else None
    return subprocess.run([sys.executable, "-B", str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=60)


def wheels(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


@pytest.mark.parametrize("names, version", [
    (["vllm-0.34.0+rocm10-cp312-cp312-linux_x86_64.whl"], "0.34.0"),
    (["vllm-0.33.0-cp312-cp312-linux_x86_64.whl", "other-1.0-py3-none-any.whl"], "0.33.0"),
])
def test_the_one_wheel_of_the_pinned_release_passes(tmp_path, names, version):
    proc = run("vllm", str(wheels(tmp_path / "out", *names)), version)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"vllm-wheel: OK {names[0]}\n"


@pytest.mark.parametrize("names, version, line", [
    ([], "0.34.0", "expected one vLLM wheel in {out}, found 0"),
    (["vllm-0.34.0-cp312-cp312-linux_x86_64.whl", "vllm-0.34.0+rocm10-cp312-cp312-linux_x86_64.whl"], "0.34.0",
     "expected one vLLM wheel in {out}, found 2"),
    (["vllm-0.34.1+rocm10-cp312-cp312-linux_x86_64.whl"], "0.34.0",
     "built vLLM 0.34.1+rocm10 but versions.json pins VLLM_VERSION=0.34.0: check vllm.tag/commit"),
    (["vllm-0.34.0rc1-cp312-cp312-linux_x86_64.whl"], "0.34.0",
     "built vLLM 0.34.0rc1 but versions.json pins VLLM_VERSION=0.34.0: check vllm.tag/commit"),
    (["vllm-0.34.0.dev5+g62d4bc3c7.rocm10-cp312-cp312-linux_x86_64.whl"], "0.34.0",
     "built vLLM 0.34.0.dev5+g62d4bc3c7.rocm10 but versions.json pins VLLM_VERSION=0.34.0: check vllm.tag/commit"),
])
def test_anything_else_is_one_line_naming_what_differs(tmp_path, names, version, line):
    out = wheels(tmp_path / "out", *names)
    proc = run("vllm", str(out), version)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"vllm-wheel: ERROR: {line.format(out=out)}\n"


def fake(folder: Path, setuptools: str | None, bdist_wheel: bool, wheel: bool) -> Path:
    """Packages that shadow this Python's: setuptools of that version (None: its import fails), its
    bdist_wheel command and the wheel package present or failing to import."""
    missing = "raise ImportError('not installed here')\n"
    command = folder / "setuptools" / "command"
    command.mkdir(parents=True)
    (folder / "setuptools" / "__init__.py").write_text(missing if setuptools is None
                                                       else f"__version__ = {setuptools!r}\n")
    (command / "__init__.py").write_text("")
    (command / "bdist_wheel.py").write_text("" if bdist_wheel else missing)
    (folder / "wheel.py").write_text("" if wheel else missing)
    return folder


@pytest.mark.parametrize("setuptools, bdist_wheel, wheel, builds", [
    ("70.1.0", True, False, True),   # bdist_wheel inside setuptools
    ("69.0.0", False, True, True),   # the oldest taken, with the wheel package
    ("68.2.2", False, True, False),  # too old
    ("69.0.0", False, False, False),  # no bdist_wheel from anywhere
    (None, False, True, False),      # no setuptools
    ("main", True, True, False),     # a version that is no number
])
def test_setuptools_builds_wheels_from_69_with_a_bdist_wheel(tmp_path, setuptools, bdist_wheel, wheel, builds):
    proc = run("setuptools", path=fake(tmp_path / "site", setuptools, bdist_wheel, wheel))
    assert proc.returncode == (0 if builds else 1), proc.stderr
    assert proc.stdout == proc.stderr == ""
