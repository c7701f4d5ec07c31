"""`ci/test-machine/docker-engine.sh`'s settings: DOCKER_ENGINE_TIMEOUT (how long a start waits for the
engine to answer and a stop for it to end) is a whole number of seconds from 1 to 3600 (empty: 60), else one line
naming it, exit 2, before anything is started or stopped. The engine itself: test_docker_engine_prune.py."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci/test-machine/docker-engine.sh"


def _stop(tmp_path: Path, timeout: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_ENGINE_ROOT": str(tmp_path / "engine"), "DOCKER_ENGINE_TIMEOUT": timeout,
           "DOCKER_ENGINE_NO_INSTALL": "1"}
    return subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("timeout", ["abc", "0", "08", "-5", "+5", " 5", "1e3", "1.5", "3601", "4000",
                                     "99999999999999999999"])
def test_a_timeout_that_is_no_whole_number_of_seconds_is_one_line(tmp_path, timeout):
    proc = _stop(tmp_path, timeout)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"docker-engine: error: DOCKER_ENGINE_TIMEOUT='{timeout}' is not a whole number of "
                           "seconds from 1 to 3600 (default 60)\n")
    assert not (tmp_path / "engine").exists()


@pytest.mark.parametrize("timeout", ["1", "60", "3600", ""])
def test_a_timeout_in_range_or_empty_is_taken(tmp_path, timeout):
    proc = _stop(tmp_path, timeout)
    assert proc.returncode == 0, proc.stderr
    assert "no engine started here" in proc.stderr
