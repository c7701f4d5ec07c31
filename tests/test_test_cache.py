"""The kept test environments (ci/test-machine/test-cache.sh, called by .ci/run): an earlier test venv
is removed only when this script made it (its marker inside) and no test command uses it (the
command holds the venv's lock while it runs). A user's own venv-* in a shared cache folder, a
symbolic link, and another checkout's venv in use are kept."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci" / "test-machine" / "test-cache.sh"

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) not installed")


def cache(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def users_venv(path: Path) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (path / "bin" / "python").write_text("mine\n")
    return path


def test_prune_removes_only_environments_it_made_and_nobody_uses(tmp_path):
    keep = tmp_path / "venv-current"
    assert cache("make", str(keep)).returncode == 0
    old = tmp_path / "venv-old"
    assert cache("make", str(old)).returncode == 0
    (old / "pyvenv.cfg").write_text("home = /usr/bin\n")
    mine = users_venv(tmp_path / "venv-mine")
    elsewhere = users_venv(tmp_path / "elsewhere")
    (tmp_path / "venv-link").symlink_to(elsewhere)
    (tmp_path / "venv-file").write_text("mine\n")

    result = cache("prune", str(tmp_path), str(keep))
    assert result.returncode == 0, result.stderr
    assert not old.exists()
    assert keep.is_dir() and (mine / "bin" / "python").read_text() == "mine\n"
    assert (tmp_path / "venv-link").is_symlink() and (elsewhere / "bin" / "python").is_file()
    assert (tmp_path / "venv-file").read_text() == "mine\n"
    assert f"removing an earlier test venv: {old}" in result.stdout


def test_a_venv_in_use_by_another_checkout_is_kept_until_its_tests_end(tmp_path):
    other = tmp_path / "venv-other-checkout"
    assert cache("make", str(other)).returncode == 0
    started = tmp_path / "started"
    tests = subprocess.Popen(["bash", str(SCRIPT), "use", str(other), "bash", "-c",
                              f"touch {started}; sleep 600"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert tests.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        result = cache("prune", str(tmp_path), str(tmp_path / "venv-mine"))
        assert result.returncode == 0, result.stderr
        assert other.is_dir(), "a venv was removed while another checkout's tests used it"
        assert "in use" in result.stdout
    finally:
        os.killpg(tests.pid, signal.SIGTERM)  # the test command and what it started
        tests.wait(30)
    assert cache("prune", str(tmp_path), str(tmp_path / "venv-mine")).returncode == 0
    assert not other.exists()


def test_use_runs_the_command_and_passes_its_status(tmp_path):
    venv = tmp_path / "venv-a"
    assert cache("make", str(venv)).returncode == 0
    assert cache("use", str(venv), "bash", "-c", "exit 7").returncode == 7


def test_make_does_not_claim_a_folder_it_did_not_make(tmp_path):
    mine = users_venv(tmp_path / "venv-mine")
    result = cache("make", str(mine))
    assert result.returncode == 0
    assert cache("prune", str(tmp_path), str(tmp_path / "venv-other")).returncode == 0
    assert (mine / "bin" / "python").read_text() == "mine\n"


def test_ci_run_goes_through_the_cache_script():
    text = (ROOT / ".ci" / "run").read_text()
    assert "test-cache.sh prune" in text and "test-cache.sh use" in text
    assert "rm -" not in text and "rm \"" not in text
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
