"""vLLM's Triton MLA decode of the installed release, called the way the remedy calls it (pages of one
slot, the plan as a per-request table; query length 3 as per-row causal extents where the release has
no verify kernel, as 0.32 and 0.33), equals a dense computation at query lengths 1 and 3, run in
Triton's interpreter on the CPU (about 10 s); vLLM 0.34's decode_attention_fwd_verify too where its
unpacked sdist is already in the test cache (not downloaded here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (tests/requirements.lock installs it)")

SCRIPT = Path(__file__).with_name("remedy_interpreted.py")
OPS = Path("v1/attention/ops/triton_decode_attention.py")


def _installed() -> Path:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    return Path(spec.submodule_search_locations[0]) / OPS


def _cached_034() -> list[str]:
    root = Path(os.environ.get("VLLM_SDIST_CACHE", Path.home() / ".cache" / "rocm-vllm-test"))
    path = root / "vllm-0.34.0" / "vllm" / OPS
    return [str(path)] if path.is_file() else []


def test_vllms_triton_decode_called_the_remedys_way_matches_dense():
    path = [str(SCRIPT.parents[1] / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
    files = [str(_installed()), *_cached_034()]
    run = subprocess.run([sys.executable, str(SCRIPT), *files], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok: ") == 2 * len(files) and "DIFFERENT" not in run.stdout, run.stdout
    if len(files) > 1:
        assert "ok: decode_attention_fwd_verify at query length 3" in run.stdout, run.stdout
    print(run.stdout)
