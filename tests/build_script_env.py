"""What the build scripts of docker/ import beyond the standard library
(docker/requirements-scripts.txt: `packaging`), installed into a test's fresh Python
environment hash-checked, as install_torch.sh installs it in the image's torch stage."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT_REQUIREMENTS = Path(__file__).resolve().parents[1] / "docker/requirements-scripts.txt"


def install_script_requirements(python: Path, wheelhouse: Path) -> None:
    """Install the scripts' requirements into the environment of `python` (which may have no
    pip); their wheels are downloaded once into `wheelhouse` (needs PyPI the first time)."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    if not any(wheelhouse.glob("*.whl")):
        proc = subprocess.run([*pip, "download", "--quiet", "--no-deps", "--require-hashes",
                               "-r", SCRIPT_REQUIREMENTS, "-d", wheelhouse], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    proc = subprocess.run([*pip, "install", "--quiet", "--no-index", "--find-links", wheelhouse, "--no-deps",
                           "--require-hashes", "--target", purelib, "-r", SCRIPT_REQUIREMENTS],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def wheelhouse(tmp_path_factory) -> Path:
    """One download folder for the whole test session."""
    path = tmp_path_factory.getbasetemp() / "script-wheels"
    path.mkdir(exist_ok=True)
    return path
