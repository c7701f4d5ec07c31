"""ruff over the repository's Python, with the repository's configuration (ruff.toml)."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff_binary():
    found = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(found).exists():
        pytest.fail("ruff not installed: pip install -r tests/requirements.txt")
    return found


def ruff_check(*args, stdin=None):
    return subprocess.run([ruff_binary(), "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=300)


def test_ruff_check_is_clean():
    proc = ruff_check(".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_check_can_fail():
    """A file under the repository's configuration with an unused import, an undefined name and
    a line over the configured length: each is reported, with a non-zero exit."""
    text = "import os\n\n\ndef f():\n    return undefined_name\n\n\nx = '" + "a" * 130 + "'\n"
    proc = ruff_check("--stdin-filename", "tests/lint_probe.py", "-", stdin=text)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for code in ("F401", "F821", "E501"):
        assert code in proc.stdout, (code, proc.stdout)


def test_pre_commit_runs_the_pinned_ruff():
    pin = re.search(r"^ruff==(\S+)$", (ROOT / "tests/requirements.txt").read_text(), re.M)
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    assert pin, "tests/requirements.txt: pin ruff (ruff==VERSION)"
    assert "repo: https://github.com/astral-sh/ruff-pre-commit" in config
    rev = re.search(r"^\s*rev:\s*(\S+)\s*$", config, re.M)
    assert rev and rev.group(1) == f"v{pin.group(1)}", \
        f".pre-commit-config.yaml: set rev to v{pin.group(1)} (the ruff pin of tests/requirements.txt)"
