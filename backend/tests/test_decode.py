"""The backend's decode path (planning + the decode call, reference kernel) equals an
independent dense MLA computation."""

from __future__ import annotations

import pytest
import torch

from mla_cases import KV_LORA_RANK, MATRIX, TOLERANCE, DecodeCase, dense_mla, dense_of, make
from vllm_aiter_mla.reference import NON_PERSISTENT, PERSISTENT
from vllm_aiter_mla.decode import mla_decode, pad_heads
from vllm_aiter_mla.kernels import load_kernels
from vllm_aiter_mla.persistent import allocate_work, plan_work
from vllm_aiter_mla.planning import DecodePlanBuffers, plan_decode, plan_decode_into

REFERENCE = load_kernels("reference")


def run_backend_decode(case: DecodeCase, persistent: bool, decode_heads: int | None = None, split_q: bool = False,
                       mode: str = PERSISTENT):
    if persistent:
        buffers = DecodePlanBuffers.allocate(80, case.block_table.shape[1] + 2, case.block_size, "cpu")
        plan = plan_decode_into(buffers, case.block_table, case.seq_lens_t, case.query_start_loc)
    else:
        plan = plan_decode(case.block_table, case.seq_lens_t, case.query_start_loc, case.block_size)
    qlen = max(case.q_lens)
    heads = decode_heads or case.num_heads
    work = None
    if mode == PERSISTENT:
        work = allocate_work(REFERENCE, 80, qlen, heads, case.dtype, case.dtype, "cpu")
        plan_work(REFERENCE, work, plan, qlen)
    q = case.absorbed_q()
    if split_q:
        q = (q[..., :KV_LORA_RANK], q[..., KV_LORA_RANK:])
    return mla_decode(
        q,
        case.kv_cache,
        plan,
        kernels=REFERENCE,
        kv_lora_rank=KV_LORA_RANK,
        scale=case.scale,
        max_seqlen_q=qlen,
        decode_heads=heads,
        out_dtype=case.dtype,
        work=work,
    )


# alloc-plan + non-persistent decode, plan buffers + persistent decode.
PLAN_MATRIX = [(persistent, mode, *m) for persistent, mode in ((False, NON_PERSISTENT), (True, PERSISTENT))
               for m in MATRIX]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("persistent,mode,case_id,q_lens,seq_lens,block_size,heads", PLAN_MATRIX,
                         ids=[f"{'buffers' if m[0] else 'alloc'}-{m[1]}-{m[2]}" for m in PLAN_MATRIX])
def test_backend_decode_matches_dense(case_id, q_lens, seq_lens, block_size, heads, dtype, persistent, mode):
    case = make(DecodeCase(q_lens, seq_lens, block_size, heads, dtype), seed=11)
    out = run_backend_decode(case, persistent, mode=mode)
    assert out.shape == (sum(q_lens), heads, KV_LORA_RANK) and out.dtype == dtype
    torch.testing.assert_close(case.project_out(out), dense_of(case, seed=11), atol=TOLERANCE[dtype],
                               rtol=TOLERANCE[dtype])


# the head counts vLLM's built-in pads to: the next multiple of 16, or 24 natively
@pytest.mark.parametrize("heads,mode,decode_heads", [
    (8, PERSISTENT, 16), (8, NON_PERSISTENT, 16), (12, NON_PERSISTENT, 16), (24, NON_PERSISTENT, 32),
    (24, PERSISTENT, 24), (100, PERSISTENT, 112), (36, NON_PERSISTENT, 48),
])
def test_padded_head_counts_give_the_unpadded_result(heads, mode, decode_heads):
    case = make(DecodeCase([2, 2, 2], [9, 70, 33], 16, heads, torch.float32), seed=3)
    out = run_backend_decode(case, persistent=True, decode_heads=decode_heads, split_q=True, mode=mode)
    assert out.shape == (6, heads, KV_LORA_RANK)
    torch.testing.assert_close(case.project_out(out), dense_mla(case), atol=1e-5, rtol=1e-5)


def test_pad_heads_appends_zero_heads():
    q = torch.randn(3, 32, 576)
    padded = pad_heads(q, 128)
    assert padded.shape == (3, 128, 576)
    assert torch.equal(padded[:, :32], q) and not padded[:, 32:].any()
    assert pad_heads(q, 32) is q


def test_decode_catches_wrong_slot():
    """The dense oracle sees a plan that is one slot off (the comparison can fail)."""
    case = make(DecodeCase([1, 1], [40, 25], 16, 16, torch.float32), seed=5)
    plan = plan_decode(case.block_table, case.seq_lens_t, case.query_start_loc, 16)
    shifted = type(plan)(plan.qo_indptr, plan.kv_indptr, plan.kv_indices + 1, plan.kv_last_page_lens)
    out = mla_decode(case.absorbed_q(), case.kv_cache, shifted, kernels=REFERENCE, kv_lora_rank=KV_LORA_RANK,
                     scale=case.scale, max_seqlen_q=1, decode_heads=16, out_dtype=torch.float32)
    assert not torch.allclose(case.project_out(out), dense_mla(case), atol=1e-3)


def test_decode_rejects_mismatched_row_size():
    case = make(DecodeCase([1], [4], 16, 16, torch.float32))
    plan = plan_decode(case.block_table, case.seq_lens_t, case.query_start_loc, 16)
    with pytest.raises(ValueError, match="row size"):
        mla_decode(case.absorbed_q()[..., :520], case.kv_cache, plan, kernels=REFERENCE, kv_lora_rank=KV_LORA_RANK,
                   scale=case.scale, max_seqlen_q=1, decode_heads=16, out_dtype=torch.float32)


def test_scales_are_passed_only_for_fp8():
    """AITER builds without fp8 MLA have no q_scale/kv_scale parameters."""
    seen = []

    def kernel(*args, **kwargs):
        seen.append(sorted(k for k in kwargs if k in ("q_scale", "kv_scale")))

    kernels = type(REFERENCE)("spy", kernel)
    case = make(DecodeCase([1], [4], 16, 16, torch.float32))
    plan = plan_decode(case.block_table, case.seq_lens_t, case.query_start_loc, 16)
    common = dict(kernels=kernels, kv_lora_rank=KV_LORA_RANK, scale=case.scale, max_seqlen_q=1, decode_heads=16,
                  out_dtype=torch.float32)
    mla_decode(case.absorbed_q(), case.kv_cache, plan, **common)
    mla_decode(case.absorbed_q(), case.kv_cache, plan, q_scale=torch.ones(1), kv_scale=torch.ones(1), **common)
    assert seen == [[], ["kv_scale", "q_scale"]]
