"""The Triton planner's kernels equal the PyTorch planner on the CPU, run in Triton's
interpreter: every kernel (rows, grouped, tile walk, direct search) and the walk's paths
(tiles inside one request, a request ending in a tile, runs of short requests between long
ones, skipped tiles, padding rows) on grids of 1, 3 and 16 programs (the direct search on
128). A batch planned by another kernel than its family names fails the test. The GPU tests
(test_planning_triton.py) hold the compiled kernels to the same plans and add CUDA graphs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (tests/requirements.lock installs it)")

SCRIPT = Path(__file__).with_name("planner_interpreted.py")


@pytest.mark.parametrize(("family", "programs"), [
    *((family, programs) for family in ("walk", "rows", "grouped") for programs in (1, 3, 16)),
    ("direct", 128),  # the direct search: about one tile per program, so a grid this size
])
def test_kernels_in_the_interpreter_equal_the_pytorch_planner(family, programs):
    path = [str(SCRIPT.parents[1] / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
    run = subprocess.run([sys.executable, str(SCRIPT), str(programs), family], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    # every batch of the family was planned (a family that ran nothing proves nothing)
    assert run.stdout.count("ok: ") >= 1 and "DIFFERENT" not in run.stdout
