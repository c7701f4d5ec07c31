"""The engine tests' premise, on vLLM 0.32's real CPU platform code: with AMX tiles
(faked by tests/fake_amx for the platform only) vLLM picks AMX_MLA for an MLA model unless
CPU_MLA is named, so naming CPU_MLA is what keeps every engine test on CPU_MLA. With the fake, the
choices are read in the engine runs' own process (engine_driver.py's platform_choices); without it,
in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engine_setup import AMX_MLA_BACKEND, engine_env

HERE = Path(__file__).resolve().parent
CPU_MLA_BACKEND = "vllm.v1.attention.backends.mla.cpu_mla.CPUMLABackend"


def probe(**env: str) -> dict:
    """engine_driver.platform_choices in a process of its own, with ``env``."""
    env = engine_env(VLLM_TARGET_DEVICE="cpu", **env)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
    code = "import json\nimport engine_driver\nprint(json.dumps(engine_driver.platform_choices('float32')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def real_amx() -> bool:
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def test_faked_amx_makes_vllm_pick_amx_mla_unless_cpu_mla_is_named(engine_runs):
    seen = engine_runs.get("cpu_mla")["platform_choices"]
    assert seen["auto"] == AMX_MLA_BACKEND
    assert seen["named"] == CPU_MLA_BACKEND
    # Kernels keep the real CPU's instruction set (no AMX instructions on a CPU without them).
    assert seen["kernels_see_amx"] == real_amx()


def test_without_the_fake_the_choice_follows_the_real_cpu():
    seen = probe(ROCM_VLLM_FAKE_AMX="0")
    assert seen["auto"] == (AMX_MLA_BACKEND if real_amx() else CPU_MLA_BACKEND)
    assert seen["named"] == CPU_MLA_BACKEND
