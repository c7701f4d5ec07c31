"""The engine tests' premise, on vLLM 0.32's real CPU platform code: with AMX tiles
(faked by tests/fake_amx for the platform only) vLLM picks AMX_MLA for an MLA model unless
CPU_MLA is named, so naming CPU_MLA is what keeps every engine test on CPU_MLA."""

from __future__ import annotations

import json
import subprocess
import sys

from engine_setup import AMX_MLA_BACKEND, engine_env

CPU_MLA_BACKEND = "vllm.v1.attention.backends.mla.cpu_mla.CPUMLABackend"

PROBE = """
import json, torch
from vllm.platforms.cpu import CpuPlatform
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig
config = AttentionSelectorConfig(head_size=576, dtype=torch.float32, kv_cache_dtype="auto", block_size=16, use_mla=True)
print(json.dumps({"kernels_see_amx": torch.cpu._is_amx_tile_supported(),
                  "auto": CpuPlatform.get_attn_backend_cls(None, config),
                  "named": CpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CPU_MLA, config)}))
"""


def probe(**env: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env=engine_env(VLLM_TARGET_DEVICE="cpu", **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def real_amx() -> bool:
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def test_faked_amx_makes_vllm_pick_amx_mla_unless_cpu_mla_is_named():
    seen = probe()
    assert seen["auto"] == AMX_MLA_BACKEND
    assert seen["named"] == CPU_MLA_BACKEND
    # Kernels keep the real CPU's instruction set (no AMX instructions on a CPU without them).
    assert seen["kernels_see_amx"] == real_amx()


def test_without_the_fake_the_choice_follows_the_real_cpu():
    seen = probe(ROCM_VLLM_FAKE_AMX="0")
    assert seen["auto"] == (AMX_MLA_BACKEND if real_amx() else CPU_MLA_BACKEND)
    assert seen["named"] == CPU_MLA_BACKEND
