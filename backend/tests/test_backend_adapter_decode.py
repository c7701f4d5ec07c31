"""The vLLM adapter's decode entry (shared by the ROCm and CPU-development impls):
KV-cache dtypes as vLLM hands them over, fp8 scales passed through."""

from __future__ import annotations

import types

import pytest
import torch

from mla_cases import KV_LORA_RANK, DecodeCase, dense_mla, make
from vllm_aiter_mla.backend import DecodeKernelsMixin
from vllm_aiter_mla.kernels import load_kernels
from vllm_aiter_mla.planning import plan_decode


class Impl(DecodeKernelsMixin):
    def __init__(self, case: DecodeCase):
        self._kernels = load_kernels("reference")
        self._decode_heads = case.num_heads
        self.kv_lora_rank = KV_LORA_RANK
        self.scale = case.scale


def _run(case: DecodeCase, kv_cache: torch.Tensor, q, layer) -> torch.Tensor:
    plan = plan_decode(case.block_table, case.seq_lens_t, case.query_start_loc, case.block_size)
    return Impl(case)._decode(q, kv_cache, plan, max(case.q_lens), torch.bfloat16, layer)


def test_bf16_cache_and_split_query():
    case = make(DecodeCase([4, 4, 4], [17, 90, 41], 16, 16, torch.bfloat16), seed=2)
    q = case.absorbed_q()
    out = _run(case, case.kv_cache, (q[..., :KV_LORA_RANK], q[..., KV_LORA_RANK:]), layer=None)
    torch.testing.assert_close(case.project_out(out), dense_mla(case), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("as_uint8", [True, False], ids=["uint8-storage", "fp8-dtype"])
def test_fp8_cache_quantises_query_and_passes_scales(as_uint8):
    fp8 = torch.float8_e4m3fn
    case = make(DecodeCase([2, 2, 2], [9, 64, 33], 16, 16, torch.float32), seed=4)
    q_scale, k_scale = torch.tensor([0.05]), torch.tensor([0.01])
    kv8 = (case.kv_cache / k_scale).to(fp8)
    layer = types.SimpleNamespace(_q_scale=q_scale, _k_scale=k_scale)
    q = case.absorbed_q().to(torch.bfloat16)
    out = _run(case, kv8.view(torch.uint8) if as_uint8 else kv8, (q[..., :KV_LORA_RANK], q[..., KV_LORA_RANK:]), layer)
    # The same computation on the dequantised cache, without fp8 anywhere.
    case.kv_cache = kv8.float() * k_scale
    expected = dense_mla(case)
    assert out.dtype == torch.bfloat16
    err = (case.project_out(out) - expected).abs().max()
    assert err < 0.1, f"fp8 decode off by {err}"
    # Scales really are applied: ignoring them gives a very different result.
    unscaled = _run(case, kv8, q, types.SimpleNamespace(_q_scale=torch.tensor([1.0]), _k_scale=torch.tensor([1.0])))
    assert (case.project_out(unscaled) - expected).abs().max() > 10 * err
