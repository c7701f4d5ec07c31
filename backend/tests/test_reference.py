"""The reference kernels implement AITER's contracts: checked against an independent
dense MLA computation (and plain causal attention for the prefill kernel)."""

from __future__ import annotations

import math

import pytest
import torch

from mla_cases import KV_LORA_RANK, LATENT, MATRIX, TOLERANCE, DecodeCase, dense_of, make
from vllm_aiter_mla import reference

MODES = ["persistent", "non-persistent"]


def work_kwargs(qo_indptr, kv_indptr, last, heads: int, qlen: int) -> dict:
    """Persistent-mode work buffers, sized and filled through the reference's own
    get_mla_metadata_info_v1 / get_mla_metadata_v1 (as the backend does with AITER's)."""
    names = ("work_meta_data", "work_indptr", "work_info_set", "reduce_indptr", "reduce_final_map",
             "reduce_partial_map")
    specs = reference.get_mla_metadata_info_v1(len(kv_indptr) - 1, qlen, heads, torch.bfloat16, torch.bfloat16, False)
    work = {n: torch.empty(shape, dtype=dtype) for n, (shape, dtype) in zip(names, specs)}
    reference.get_mla_metadata_v1(qo_indptr, kv_indptr, last, heads, 1, True, work["work_meta_data"],
                                  work["work_info_set"], work["work_indptr"], work["reduce_indptr"],
                                  work["reduce_final_map"], work["reduce_partial_map"], max_seqlen_qo=qlen,
                                  uni_seqlen_qo=qlen)
    return work


def mode_kwargs(mode: str, qo_indptr, kv_indptr, last, heads: int, qlen: int) -> dict:
    return work_kwargs(qo_indptr, kv_indptr, last, heads, qlen) if mode == "persistent" else {}


def loop_indices(case: DecodeCase, page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv_indptr / kv_indices / last_page_lens by a plain loop (pages of `page_size`)."""
    indptr, indices, last = [0], [], []
    for b, kv_len in enumerate(case.seq_lens):
        if page_size == 1:
            for p in range(kv_len):
                blk = int(case.block_table[b, p // case.block_size])
                indices.append(blk * case.block_size + p % case.block_size)
            last.append(1)
        else:  # native pages: page = vLLM block
            n = math.ceil(kv_len / page_size)
            indices.extend(int(x) for x in case.block_table[b, :n])
            last.append(kv_len - (n - 1) * page_size)
        indptr.append(len(indices))
    as_t = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    return as_t(indptr), as_t(indices), as_t(last)


MODE_MATRIX = [(mode, *m) for mode in MODES for m in MATRIX]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode,case_id,q_lens,seq_lens,block_size,heads", MODE_MATRIX,
                         ids=[f"{m[0]}-{m[1]}" for m in MODE_MATRIX])
@pytest.mark.parametrize("paging", ["page1", "native-pages"])
def test_mla_decode_reference_matches_dense(case_id, q_lens, seq_lens, block_size, heads, dtype, paging, mode):
    case = make(DecodeCase(q_lens, seq_lens, block_size, heads, dtype))
    page_size = 1 if paging == "page1" else block_size
    kv_indptr, kv_indices, last = loop_indices(case, page_size)
    q = case.absorbed_q()
    o = torch.zeros(q.shape[0], heads, KV_LORA_RANK, dtype=dtype)
    reference.mla_decode_fwd(
        q,
        case.kv_cache.view(-1, page_size, 1, LATENT),
        o,
        case.query_start_loc,
        kv_indptr,
        kv_indices,
        last,
        max(q_lens),
        page_size=page_size,
        sm_scale=case.scale,
        **mode_kwargs(mode, case.query_start_loc, kv_indptr, last, heads, max(q_lens)),
    )
    torch.testing.assert_close(case.project_out(o), dense_of(case, seed=0), atol=TOLERANCE[dtype],
                               rtol=TOLERANCE[dtype])


def test_mla_decode_reference_default_scale_is_one_over_sqrt_576():
    case = make(DecodeCase([1], [33], 16, 16, torch.float32))
    kv_indptr, kv_indices, last = loop_indices(case, 1)
    q = case.absorbed_q()
    outs = []
    for scale in (None, 1.0 / math.sqrt(LATENT)):
        o = torch.empty(1, 16, KV_LORA_RANK)
        reference.mla_decode_fwd(q, case.kv_cache.view(-1, 1, 1, LATENT), o, case.query_start_loc, kv_indptr,
                                 kv_indices, last, 1, sm_scale=scale)
        outs.append(o)
    torch.testing.assert_close(outs[0], outs[1])


def test_mla_decode_reference_rejects_soft_cap():
    case = make(DecodeCase([1], [4], 1, 16, torch.float32))
    kv_indptr, kv_indices, last = loop_indices(case, 1)
    with pytest.raises(ValueError, match="logit_cap"):
        reference.mla_decode_fwd(
            case.absorbed_q(), case.kv_cache.view(-1, 1, 1, LATENT), torch.empty(1, 16, KV_LORA_RANK),
            case.query_start_loc, kv_indptr, kv_indices, last, 1, logit_cap=30.0,
        )


def test_mla_decode_reference_fp8_matches_dequantized():
    fp8 = torch.float8_e4m3fn
    case = make(DecodeCase([2, 2, 2], [5, 40, 17], 16, 16, torch.float32))
    kv_indptr, kv_indices, last = loop_indices(case, 1)
    q = case.absorbed_q()
    q_scale, kv_scale = torch.tensor([0.05]), torch.tensor([0.01])
    q8 = (q / q_scale).to(fp8)
    kv8 = (case.kv_cache / kv_scale).to(fp8)
    o = torch.zeros(q.shape[0], 16, KV_LORA_RANK, dtype=torch.bfloat16)
    reference.mla_decode_fwd(q8, kv8.view(-1, 1, 1, LATENT), o, case.query_start_loc, kv_indptr, kv_indices, last, 2,
                             sm_scale=case.scale, q_scale=q_scale, kv_scale=kv_scale)
    expected = torch.zeros_like(o, dtype=torch.float32)
    reference.mla_decode_fwd(q8.float() * q_scale, (kv8.float() * kv_scale).view(-1, 1, 1, LATENT), expected,
                             case.query_start_loc, kv_indptr, kv_indices, last, 2, sm_scale=case.scale)
    torch.testing.assert_close(o.float(), expected, atol=2e-2, rtol=2e-2)
    # And the quantised result is still close to the unquantised one.
    exact = torch.zeros_like(expected)
    reference.mla_decode_fwd(q, case.kv_cache.view(-1, 1, 1, LATENT), exact, case.query_start_loc, kv_indptr,
                             kv_indices, last, 2, sm_scale=case.scale)
    assert (o.float() - exact).abs().max() < 0.25


def dense_causal_attention(q, k, v, cu_q, cu_k, scale, causal):
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qb = q[cu_q[b] : cu_q[b + 1]].float()
        kb = k[cu_k[b] : cu_k[b + 1]].float()
        vb = v[cu_k[b] : cu_k[b + 1]].float()
        group = qb.shape[1] // kb.shape[1]
        kb, vb = kb.repeat_interleave(group, 1), vb.repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
        if causal:
            ql, kl = qb.shape[0], kb.shape[0]
            mask = torch.arange(kl)[None, :] > (kl - ql + torch.arange(ql)[:, None])
            s = s.masked_fill(mask, float("-inf"))
        lses.append(torch.logsumexp(s, -1))
        outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vb))
    return torch.cat(outs), torch.cat(lses, dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("q_lens,k_lens,heads,kv_heads", [
    ([1, 7, 30], [1, 7, 30], 16, 16),        # prefill of new tokens (q == k)
    ([5, 3, 64], [20, 3, 100], 16, 16),      # queries after a cached context
    ([9, 2], [9, 40], 8, 2),                 # grouped KV heads
])
def test_flash_attn_varlen_reference_matches_dense(q_lens, k_lens, heads, kv_heads, causal, dtype):
    g = torch.Generator().manual_seed(1)
    d_qk, d_v = 192, 128  # DeepSeek prefill: qk head dim 192, v head dim 128 (no padding of v)
    cu_q = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(k_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, d_qk, generator=g).to(dtype)
    k = torch.randn(sum(k_lens), kv_heads, d_qk, generator=g).to(dtype)
    v = torch.randn(sum(k_lens), kv_heads, d_v, generator=g).to(dtype)
    scale = 1 / math.sqrt(d_qk)
    out, lse = reference.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), softmax_scale=scale, causal=causal, return_lse=True
    )
    exp_out, exp_lse = dense_causal_attention(q, k, v, cu_q.tolist(), cu_k.tolist(), scale, causal)
    assert out.shape == (sum(q_lens), heads, d_v) and lse.shape == (heads, sum(q_lens))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), exp_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, exp_lse, atol=tol * 10, rtol=tol)
    plain = reference.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), softmax_scale=scale,
                                             causal=causal)
    torch.testing.assert_close(plain, out)


def _valid_call(heads: int = 16, q_lens=(2, 2, 2), seq_lens=(9, 30, 17), dtype=torch.bfloat16, mode="non-persistent"):
    """A call that satisfies AITER's contract; each refusal test breaks one thing."""
    case = make(DecodeCase(list(q_lens), list(seq_lens), 16, heads, dtype))
    kv_indptr, kv_indices, last = loop_indices(case, 1)
    q = case.absorbed_q()
    qlen = max(q_lens)
    args = dict(q=q, kv_buffer=case.kv_cache.view(-1, 1, 1, LATENT),
                o=torch.zeros(q.shape[0], heads, KV_LORA_RANK, dtype=dtype),
                qo_indptr=case.query_start_loc, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_lens=last,
                max_seqlen_q=qlen, sm_scale=case.scale)
    args.update(mode_kwargs(mode, case.query_start_loc, kv_indptr, last, heads, qlen))
    return args


def _int64(args, name):
    args[name] = args[name].to(torch.int64)


def _fp8(args):
    args["q"] = args["q"].to(torch.float8_e4m3fn)
    args["kv_buffer"] = args["kv_buffer"].to(torch.float8_e4m3fn)


REFUSALS = {
    # name: (call overrides, mutation, expected message part)
    "non-uniform-query-lengths": (dict(q_lens=(1, 3), seq_lens=(9, 30)), lambda a: a.update(max_seqlen_q=2),
                                  "not uniform"),
    "rows-not-requests-x-max-seqlen-q": (dict(q_lens=(1, 4), seq_lens=(9, 30)), None, "rows per request"),
    "fp16-queries": (dict(dtype=torch.float16), None, "float16"),
    "fp8-q-with-bf16-cache": ({}, lambda a: a.update(q=a["q"].to(torch.float8_e4m3fn)), "both q and kv_buffer"),
    "8-heads-unpadded": (dict(heads=8), None, "8 query heads"),
    "20-heads-unpadded": (dict(heads=20), None, "20 query heads"),
    "int64-kv-indices": ({}, lambda a: _int64(a, "kv_indices"), "int32"),
    "int64-qo-indptr": ({}, lambda a: _int64(a, "qo_indptr"), "int32"),
    "non-contiguous-q": ({}, lambda a: a.update(q=a["q"].transpose(0, 1).contiguous().transpose(0, 1)), "contiguous"),
    "kv-index-outside-cache": ({}, lambda a: a.update(kv_indices=a["kv_indices"] + 10_000), "outside the cache"),
    "fewer-keys-than-queries": (dict(seq_lens=(9, 1, 17)), None, "at least max_seqlen_q"),
    "non-zero-output-non-persistent-multi-token": ({}, lambda a: a["o"].fill_(1.0), "zero-filled"),
    "soft-cap": ({}, lambda a: a.update(logit_cap=30.0), "logit_cap"),
    "two-kv-heads": ({}, lambda a: a.update(nhead_kv=2), "one KV head"),
    "stale-persistent-work": (dict(mode="persistent"), lambda a: a["kv_indptr"].__setitem__(-1, a["kv_indptr"][-1] - 1),
                              "planned for another batch"),
    "persistent-work-for-other-heads": (dict(mode="persistent"),
                                        lambda a: a["work_meta_data"].__setitem__(1, 128), "planned for another batch"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_reference_refuses_what_aiters_host_side_contract_refuses(name):
    overrides, mutate, message = REFUSALS[name]
    args = _valid_call(**overrides)
    if mutate is not None:
        mutate(args)
    with pytest.raises(ValueError, match=message):
        reference.mla_decode_fwd(**args)


@pytest.mark.parametrize("mode", MODES)
def test_valid_call_is_accepted(mode):
    """The refusal tests start from a call the reference accepts; the head counts vLLM's built-in
    pads to (multiples of 16, 24 natively), any query length and both dtypes pass."""
    reference.mla_decode_fwd(**_valid_call(mode=mode))
    for heads in (24, 32, 48, 144):
        reference.mla_decode_fwd(**_valid_call(heads=heads, mode=mode))
    reference.mla_decode_fwd(**_valid_call(q_lens=(9, 9), seq_lens=(9, 30), mode=mode))
    fp8 = _valid_call(dtype=torch.float32, mode=mode)
    _fp8(fp8)
    reference.mla_decode_fwd(**fp8)

