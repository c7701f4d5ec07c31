"""Stand-ins for vLLM's Triton MLA decode (``decode_attention_fwd``, ``decode_attention_fwd_verify`` of
``vllm/v1/attention/ops/triton_decode_attention.py``) on the CPU: pure PyTorch, holding every call to
the functions' contract as vLLM 0.32-0.34 define it (a 4-D [pages, page size, 1 head, 576] cache, V its
first 512 columns, an int32 table of a row per row of q (verify: per request), int32 lengths, a float32
[rows, heads, splits, 513] workspace whose splits equal ``num_kv_splits``), then computing the answer
densely; ``scaled`` multiplies it (a wrong remedy)."""

from __future__ import annotations

import torch

from vllm_aiter_mla.remedy import TritonDecode


def _attend(q, k_buffer, table, lens, sm_scale, k_scale, o, lv):
    rows = k_buffer.reshape(-1, k_buffer.shape[-1])  # the rows a call reads converted, not the whole cache
    factor = k_scale.float() if k_scale is not None else 1.0
    for r in range(q.shape[0]):
        n = int(lens[r])
        keys = rows[table[r, :n].long()].float() * factor
        p = (torch.einsum("hd,kd->hk", q[r].float(), keys) * sm_scale).softmax(-1)
        o[r] = (p @ keys[:, :lv]).to(o.dtype)


def _check(q, k_buffer, v_buffer, o, table, lens, page_size):
    assert k_buffer.dim() == 4 and k_buffer.shape[-2] == 1 and page_size == k_buffer.shape[1] == 1, k_buffer.shape
    assert v_buffer.shape[-1] == o.shape[-1] == 512 and v_buffer.data_ptr() == k_buffer.data_ptr()
    assert table.dtype == torch.int32 and table.dim() == 2 and lens.dtype == torch.int32
    # queries reach the kernel dequantised (never fp8); float32 ones too (tl.dot takes them): the CPU
    # development mode's float32 engine runs call it so
    assert q.dtype == o.dtype and q.dtype in (torch.bfloat16, torch.float16, torch.float32), q.dtype


def triton_standin(factor: float = 1.0, verify: bool = True, splits: int = 4) -> TritonDecode:
    def decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits, num_kv_splits,
                             sm_scale, page_size=1, logit_cap=0.0, k_scale=None, v_scale=None, is_mla=False):
        _check(q, k_buffer, v_buffer, o, req_to_token, b_seq_len, page_size)
        assert is_mla and num_kv_splits == attn_logits.shape[2] and attn_logits.shape[-1] == 513
        assert req_to_token.shape[0] == b_seq_len.shape[0] == q.shape[0]  # one table row per query row
        _attend(q, k_buffer, req_to_token, b_seq_len, sm_scale, k_scale, o, v_buffer.shape[-1])
        o.mul_(factor)

    def decode_attention_fwd_verify(q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens, qlen,
                                    attn_logits, num_kv_splits, sm_scale, page_size, k_scale=None):
        _check(q, k_buffer, v_buffer, o, req_to_token, seq_lens, page_size)
        assert q.shape[0] == qlen * seq_lens.shape[0] == qlen * req_to_token.shape[0] and real_seq_lens is None
        assert num_kv_splits == 1 or attn_logits.shape[2] == num_kv_splits
        table = req_to_token.repeat_interleave(qlen, 0)
        lens = (seq_lens[:, None] + torch.arange(1 - qlen, 1, dtype=torch.int32)).flatten()
        _attend(q, k_buffer, table, lens, sm_scale, k_scale, o, v_buffer.shape[-1])
        o.mul_(factor)

    name = "Triton stand-in" + ("" if factor == 1.0 else f" x{factor}")
    return TritonDecode(name, decode_attention_fwd, decode_attention_fwd_verify if verify else None, splits)
