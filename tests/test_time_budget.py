"""The test session's time report and budget (the repository's conftest.py): the slowest tests,
the time per test folder and per lane are printed, and a session over PYTEST_TIME_BUDGET seconds fails with a
line naming the setting, even when every test passed. Driven on a small session of its own, with
the repository's conftest.py and pytest.ini."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def session(tmp_path: Path, budget: str | None) -> subprocess.CompletedProcess[str]:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text((ROOT / "pytest.ini").read_text().replace("testpaths =", "# testpaths ="))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(1.2)\n")
    (tmp_path / "sub" / "test_lane.py").write_text(
        "import time\n\nimport pytest\n\n\n@pytest.mark.docker\ndef test_in_the_docker_lane():\n    time.sleep(0.1)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_TIME_BUDGET", "PYTEST_ADDOPTS", "CI")}
    if budget is not None:
        env["PYTEST_TIME_BUDGET"] = budget
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "sub"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_session_over_its_budget_fails_naming_the_setting(tmp_path):
    proc = session(tmp_path, "1")
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout[-2000:]
    assert "2 passed" in proc.stdout
    assert "over its budget of 1s (PYTEST_TIME_BUDGET)" in proc.stdout, proc.stdout[-2000:]


def test_within_the_budget_the_time_is_reported_with_the_slowest_tests_and_folders(tmp_path):
    proc = session(tmp_path, None)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "slowest 30 durations" in proc.stdout and "sub/test_slow.py::test_slow" in proc.stdout
    assert "time per test folder" in proc.stdout and "s  sub\n" in proc.stdout
    lanes = proc.stdout.split("time per lane", 1)[1].split("\n=", 1)[0].splitlines()[1:]
    (lane,) = lanes  # one process: one lane, which ran the Docker test too
    total, name, docker = re.fullmatch(r"\s*([\d.]+)s  (\S+) \(Docker tests ([\d.]+)s\)", lane).groups()
    assert name == "main" and float(total) >= 1.3 and 1.2 > float(docker) >= 0.1, lane
    assert "of its 1500s budget (PYTEST_TIME_BUDGET)" in proc.stdout


@pytest.mark.parametrize("bad", ["abc", "-5", "nan", "1.5"])
def test_a_bad_budget_stops_before_any_test(tmp_path, bad):
    proc = session(tmp_path, bad)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-1000:] + proc.stderr[-1000:]
    assert "PYTEST_TIME_BUDGET" in proc.stderr and "test_slow" not in proc.stdout


def test_no_budget(tmp_path):
    proc = session(tmp_path, "0")
    assert proc.returncode == 0 and "no budget: PYTEST_TIME_BUDGET=0" in proc.stdout, proc.stdout[-1000:]
