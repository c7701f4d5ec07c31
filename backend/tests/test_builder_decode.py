"""The metadata builder's decode step and the impl's decode call, on batches shaped as
vLLM 0.32's MLA builder hands them over: vLLM's own decode/prefill split
(``split_decodes_and_prefills`` with uniform decode query lengths), the decode slice of
``query_start_loc_cpu``, ``max_query_len = min(longest query, reorder threshold)``, and
CUDA-graph padding rows (query length 0, sequence length 0). The reference kernel
refuses every call AITER would get wrong; outputs are checked against dense MLA."""

from __future__ import annotations

import types

import pytest
import torch
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from mla_cases import KV_LORA_RANK, DecodeCase, dense_mla, make
from vllm_aiter_mla.reference import NON_PERSISTENT, PERSISTENT
from vllm_aiter_mla.backend import AiterMLAMetadataBuilder, DecodeKernelsMixin
from vllm_aiter_mla.kernels import load_kernels
from vllm_aiter_mla.persistent import allocate_work
from vllm_aiter_mla.planning import DecodePlanBuffers

REFERENCE = load_kernels("reference")
MAX_REQS = 16


def builder(mode: str, block_size: int, max_blocks: int, max_qlen: int, heads: int) -> AiterMLAMetadataBuilder:
    """The real builder class with the state its __init__ derives from a vLLM config."""
    b = object.__new__(AiterMLAMetadataBuilder)
    b._plan_buffers = DecodePlanBuffers.allocate(MAX_REQS, max_blocks, block_size, "cpu")
    b._plan_triton = None
    b._kernels = REFERENCE
    b._work = (allocate_work(REFERENCE, MAX_REQS, max_qlen, heads, torch.float32, torch.float32, "cpu")
               if mode == PERSISTENT else None)
    b.model_config = types.SimpleNamespace(dtype=torch.float32)
    return b


class Impl(DecodeKernelsMixin):
    def __init__(self, heads: int, scale: float):
        self._kernels = REFERENCE
        self._decode_heads = heads
        self.kv_lora_rank = KV_LORA_RANK
        self.scale = scale


def vllm_decode_slice(query_lens: list[int], threshold: int, num_tokens: int):
    """What MLACommonMetadataBuilder.build passes to _build_decode (vLLM 0.32)."""
    qsl = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)
    common = types.SimpleNamespace(max_query_len=max(query_lens), num_reqs=len(query_lens),
                                   num_actual_tokens=num_tokens, query_start_loc_cpu=qsl)
    num_decodes, _, num_decode_tokens, _ = split_decodes_and_prefills(common, threshold, require_uniform=True)
    return num_decodes, qsl[: num_decodes + 1], num_decode_tokens, min(max(query_lens), threshold)


# (id, query lengths of the whole batch, sequence lengths, padded token count or None, threshold)
BATCHES = [
    # MTP (3 speculative tokens): a trimmed draft leaves the first decode row with 1 token; the
    # 4-token rows behind it become prefills, so max_query_len (4) is not the decode rows' length.
    ("trimmed-draft-then-verify", [1, 4, 4, 9], [57, 40, 70, 9], None, 4),
    # Prefix-cache hit with one token left: a 1-token decode row with a long context, beside prefills.
    ("prefix-cache-hit-beside-prefill", [1, 1, 4, 30], [300, 12, 16, 30], None, 4),
    # Plain MTP verify, uniform, mixed with a prefill.
    ("uniform-verify-and-prefill", [4, 4, 4, 6], [9, 40, 70, 6], None, 4),
    ("one-speculative-token", [2, 2, 2], [5, 33, 64], None, 2),
    # Full CUDA graph: padding rows with query length 0 and sequence length 0, token count padded.
    ("padded-graph-batch-qlen4", [4, 4, 0, 0], [40, 70, 0, 0], 16, 4),
    ("padded-graph-batch-qlen2", [2, 0, 0], [17, 0, 0], 6, 2),
    ("padded-graph-batch-qlen1", [1, 1, 1, 0], [3, 90, 17, 0], 4, 1),
]


def run_step(mode: str, query_lens, seq_lens, padded_tokens, threshold, heads=16, block_size=16):
    num_tokens = padded_tokens or sum(query_lens)
    num_decodes, qsl_cpu, num_decode_tokens, max_query_len = vllm_decode_slice(query_lens, threshold, num_tokens)
    dec_q = [n for n in query_lens[:num_decodes] if n > 0]
    live = len(dec_q)
    case = make(DecodeCase(dec_q, seq_lens[:live], block_size, heads, torch.float32), seed=7)
    # Padding rows: zero block-table rows, sequence length 0, random query rows.
    table = torch.zeros(num_decodes, case.block_table.shape[1] + 1, dtype=torch.int32)
    table[:live, : case.block_table.shape[1]] = case.block_table
    seq = torch.tensor(seq_lens[:num_decodes], dtype=torch.int32)
    q = torch.cat([case.absorbed_q(), torch.randn(num_decode_tokens - sum(dec_q), heads, case.kv_cache.shape[-1])])
    b = builder(mode, block_size, table.shape[1], threshold, heads)
    meta = b._build_decode(table, seq, int(seq.max()), qsl_cpu, qsl_cpu, num_decode_tokens, max_query_len, None)
    impl = Impl(heads, case.scale)
    out, _ = impl.forward_mqa(q, case.kv_cache, types.SimpleNamespace(decode=meta), layer=None)
    return case, meta, out


@pytest.mark.parametrize("mode", (PERSISTENT, NON_PERSISTENT))
@pytest.mark.parametrize("batch_id,query_lens,seq_lens,padded,threshold", BATCHES, ids=[b[0] for b in BATCHES])
def test_decode_rows_match_dense(batch_id, query_lens, seq_lens, padded, threshold, mode):
    case, meta, out = run_step(mode, query_lens, seq_lens, padded, threshold)
    live_rows = sum(case.q_lens)
    assert meta.max_query_len == max(case.q_lens)
    torch.testing.assert_close(case.project_out(out[:live_rows]), dense_mla(case), atol=1e-5, rtol=1e-5)


def test_max_seqlen_q_is_the_decode_rows_own_length():
    """vLLM's max_query_len here is 4 (min(9, threshold 4)); the decode row has 1 token."""
    _, meta, _ = run_step(PERSISTENT, [1, 4, 4, 9], [57, 40, 70, 9], None, 4)
    assert meta.max_query_len == 1
    assert meta.plan.qo_indptr.tolist() == [0, 1]


def test_padding_rows_become_uniform_rows():
    _, meta, _ = run_step(NON_PERSISTENT, [4, 4, 0, 0], [40, 70, 0, 0], 16, 4)
    assert meta.plan.qo_indptr.tolist() == [0, 4, 8, 12, 16]
    assert meta.plan.kv_indptr.tolist() == [0, 40, 110, 114, 118]


def test_persistent_work_is_planned_for_each_step():
    b = builder(PERSISTENT, 16, 8, 4, 16)
    seq = torch.tensor([40, 70], dtype=torch.int32)
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    qsl = torch.tensor([0, 4, 8], dtype=torch.int32)
    meta = b._build_decode(table, seq, 70, qsl, qsl, 8, 4, None)
    assert meta.work is b._work
    first = meta.work.work_meta_data.clone()
    b._build_decode(table, seq + 3, 73, qsl, qsl, 8, 4, None)
    assert not torch.equal(first, meta.work.work_meta_data)


def test_non_persistent_multi_token_output_is_zero_filled(monkeypatch):
    """Uninitialised memory (NaN here) must not reach the non-persistent multi-token kernel,
    which may leave output lanes unwritten: the reference refuses a non-zero output."""
    real_empty = torch.empty

    def dirty_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", dirty_empty)
    case, _, out = run_step(NON_PERSISTENT, [4, 4, 0, 0], [40, 70, 0, 0], 16, 4)
    torch.testing.assert_close(case.project_out(out[:8]), dense_mla(case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lens,tokens,expected", [
    ([4, 4, 4], 12, 4), ([1], 1, 1), ([4, 4, 0, 0], 16, 4), ([1, 1, 0], 3, 1),
    ([2, 3], 5, None),  # decode rows of different lengths: no layout AITER can read
    ([4, 4, 0, 0], 8, None),  # padding rows without padded tokens
])
def test_decode_query_len(lens, tokens, expected):
    from vllm_aiter_mla.planning import decode_query_len

    qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    if expected is None:
        with pytest.raises(ValueError, match="cannot be laid out"):
            decode_query_len(qsl, tokens)
    else:
        assert decode_query_len(qsl, tokens) == expected
