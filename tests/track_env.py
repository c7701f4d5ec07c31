"""A Python environment with one release track's vLLM as Python only: the track's sdist (checked
against versions.json) installed with VLLM_TARGET_DEVICE=empty (no compiled extensions, the
requirements of requirements/common.txt), beside the tests' CPU torch, the backend and the
runtime (editable). Enough for vLLM's selection code, its MLA classes and this backend's adapters;
not for a vLLM engine (no CPU kernels).

Made once per track in TRACK_ENV_DIR (default .venv-tracks/<track>) and reused while its inputs
(the sdist, the requirement files, this file) are unchanged; needs PyPI the first time. The
backend and runtime are installed editable from the checkout that uses it (again when a kept
environment was made for another checkout: .ci/run keeps it outside the clone).
The build tools come from the sdist's own pyproject.toml (its torch pin left out: the tests' CPU
torch stands in).

Installed with uv (the test environment's, tests/requirements.lock): on a machine with nothing
kept, three track environments of about a hundred packages each are made in one test run, and
uv's parallel downloads and shared cache take a fraction of pip's time. uv reads none of pip's settings:
the sources and network settings pip would use are passed to it by tools/uv_pip.py, as for the test
environment (ci/test.sh)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tools.pins.locks import uv_command
from cache_lock import held
from tools.uv_pip import pip_settings, pip_sources, torch_sources, uv_environment
from vllm_sdist import sdist_source, versions

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ("tests/requirements-torch.txt", "tests/requirements-track.txt", "tests/track_env.py")


def env_dir(track: str) -> Path:
    return Path(os.environ.get("TRACK_ENV_DIR") or ROOT / ".venv-tracks") / track


def _key(track: str) -> str:
    digest = hashlib.sha256(versions()["tracks"][track]["vllm"]["sdist"]["sha256"].encode())
    # the interpreter it is made from (this one's base: .ci/run's PYTHON, through the test venv)
    digest.update(f"{sys.base_prefix} {sys.version}".encode())
    for name in INPUTS:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def build_requirements(src: Path) -> list[str]:
    """The sdist's [build-system] requires, without torch (the environment's CPU torch builds it)."""
    requires = tomllib.loads((src / "pyproject.toml").read_text())["build-system"]["requires"]
    return [r for r in requires if Requirement(r).name.lower() != "torch"]


def uv_install(python: Path) -> list:
    """uv pip install into the environment of `python`, quietly."""
    return [*uv_command(), "pip", "install", "--quiet", "--python", python]


def _run(cmd: list, what: str, **kw) -> None:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-4000:]}"


def track_python(track: str) -> Path:
    """The Python of the track's environment, made or refreshed first when needed (one lane at a
    time: another waits, then finds it made)."""
    path = env_dir(track)
    with held(path.parent / f".{track}.lock"):
        return _track_python(track, path)


def _track_python(track: str, path: Path) -> Path:
    python = path / "bin" / "python"
    marker = path / ".ready"
    key = _key(track)
    if marker.is_file() and marker.read_text().strip() == key and python.exists():
        _install_own_packages(path, python)
        return python
    src = sdist_source(track)
    _run([sys.executable, "-m", "venv", "--clear", "--without-pip", path], "venv")
    install = uv_install(python)
    pip = pip_settings()
    local, env = pip_sources(pip), uv_environment(os.environ, pip)
    _run([*install, *torch_sources(pip), "-r", ROOT / "tests/requirements-torch.txt"], "uv pip install torch",
         env=env, timeout=1800)
    _run([*install, *local, "-r", ROOT / "tests/requirements-track.txt", *build_requirements(src)],
         "uv pip install the test and build requirements", env=env, timeout=1800)
    with tempfile.TemporaryDirectory(prefix="vllm-src-") as tmp:
        # a copy: the build writes into its source tree (vllm/_version.py, build/), the cache stays as unpacked
        copy = Path(shutil.copytree(src, Path(tmp) / src.name))
        # bytecode for the whole environment (uv compiles all of site-packages): a test process run
        # with PYTHONDONTWRITEBYTECODE would otherwise compile vLLM and torch from source each time
        _run([*install, *local, "--no-build-isolation", "--compile-bytecode", copy],
             f"uv pip install vLLM {src.name} (VLLM_TARGET_DEVICE=empty)",
             env={**env, "VLLM_TARGET_DEVICE": "empty"}, timeout=1800)
    marker.write_text(key + "\n")
    _install_own_packages(path, python)
    return python


def track_environ(track: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a process of the track's Python runs with: ``environ`` (default this one's) with
    vLLM's cache folder in the track's environment. vLLM keeps one record per model class there (its
    model-class inspection, a child process that imports vLLM, about 10 s of CPU), keyed by the
    model file's hash: in a folder shared with other releases each release's record replaces the
    other's, and every process of the next one inspects the class again."""
    return {**(os.environ if environ is None else environ), "VLLM_CACHE_ROOT": str(env_dir(track) / "vllm-cache")}


def _install_own_packages(path: Path, python: Path) -> None:
    """The backend and the runtime of this checkout, editable. An environment kept outside the
    checkout (TRACK_ENV_DIR, e.g. a CI cache) may have them from another checkout: reinstalled then."""
    owner = path / ".checkout"
    if owner.is_file() and owner.read_text().strip() == str(ROOT):
        return
    _run([*uv_install(python), "--no-deps", "-e", ROOT / "backend", "-e", ROOT / "runtime"],
         "uv pip install the backend and the runtime", env=uv_environment(os.environ, pip_settings()))
    owner.write_text(f"{ROOT}\n")
