"""How the engine tests start vLLM on CPU: the same selection on every CPU model."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FAKE_AMX_HOOK = REPO / "tests" / "fake_amx"
CPU_MLA_IMPL = "vllm.v1.attention.backends.mla.cpu_mla.CPUMLAImpl"
OUR_CPU_DEV_IMPL = "vllm_aiter_mla.cpu_dev.CPUDevMLAImpl"
AMX_MLA_BACKEND = "vllm.v1.attention.backends.mla.amx_mla.AMXMLABackend"


def engine_env(**extra: str) -> dict[str, str]:
    """Environment of every vLLM engine these tests start: no AITER_MLA_* of the caller, and
    vLLM's CPU platform told the CPU has AMX tiles (tests/fake_amx), so backend selection is
    that of an AMX machine on every CI machine; the tests name CPU_MLA explicitly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITER_MLA_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAKE_AMX_HOOK), env.get("PYTHONPATH", "")) if p)
    env["ROCM_VLLM_FAKE_AMX"] = "1"
    env.update(extra)
    return env
