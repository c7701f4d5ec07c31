"""ci/test-machine/disk-space.sh: the free-space lines .ci/run prints first and last, and the
warning when the checkout's file system has less free than a run from scratch writes."""
import os
import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "ci/test-machine/disk-space.sh"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_report_names_each_folder_a_run_writes_to(tmp_path) -> None:
    tmp, engine = tmp_path / "tmp", tmp_path / "engine"
    tmp.mkdir()
    engine.mkdir()
    proc = _run("report", "start", TMPDIR=str(tmp), DOCKER_ENGINE_ROOT=str(engine))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.rsplit("(", 1)[1].rstrip(")") for line in lines] == [str(SCRIPT.parents[2]), str(tmp), str(engine)]
    assert all(line.startswith("disk (start): ") and " free on " in line for line in lines), lines


def test_report_leaves_out_an_engine_root_not_made_yet(tmp_path) -> None:
    proc = _run("report", "end", TMPDIR=str(tmp_path), DOCKER_ENGINE_ROOT=str(tmp_path / "absent"))
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2 and "absent" not in proc.stdout


def test_free_names_the_file_system_holding_a_folder(tmp_path) -> None:
    proc = _run("free", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    source = subprocess.run(["df", "--output=source", str(tmp_path)], capture_output=True, text=True,
                            check=True).stdout.split()[-1]
    assert re.fullmatch(rf"[0-9.,]+[KMGTP]? free on {re.escape(source)}", proc.stdout.strip()), proc.stdout


def test_free_without_a_folder_prints_usage() -> None:
    proc = _run("free")
    assert proc.returncode == 2 and "usage:" in proc.stderr and proc.stdout == ""


def test_check_warns_below_the_bound_and_goes_on() -> None:
    proc = _run("check", CI_DISK_NEED_GB="999999999")
    assert proc.returncode == 0
    assert proc.stderr.startswith("warning: ") and "CI_DISK_NEED_GB" in proc.stderr
    assert "No space left on device" in proc.stderr


def test_check_is_silent_above_the_bound() -> None:
    proc = _run("check", CI_DISK_NEED_GB="0")
    assert proc.returncode == 0 and proc.stderr == ""


@pytest.mark.parametrize("value", ["2x", "-1", "1.5", " 20"])
def test_check_refuses_a_bound_that_is_not_whole_gigabytes(value) -> None:
    proc = _run("check", CI_DISK_NEED_GB=value)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: CI_DISK_NEED_GB must be a whole number of GB, got '{value}'"


def test_unknown_command_prints_usage() -> None:
    proc = _run("space")
    assert proc.returncode == 2 and "usage:" in proc.stderr
