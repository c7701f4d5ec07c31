"""The remedy for a decode call AITER gets wrong: vLLM's own Triton MLA decode of the running release.

A call measured wrong, not finite or raising (``measure``) is not handed to vLLM's built-in (which
makes the same AITER call, with the same fault) but served by ``decode_attention_fwd`` (and, where
the release has it, ``decode_attention_fwd_verify`` for query lengths above 1: vLLM 0.34) of
``vllm/v1/attention/ops/triton_decode_attention.py``, on the same cache read as pages of one slot,
once that kernel passed the same measurement.

How the calls are made (vLLM's ``triton_mla.py`` makes them so): the cache [rows, 576] is passed as
``[rows, 1, 1, 576]`` (page size 1, one latent head) and its first 512 columns as V; each request's
slots come from the own plan (``kv_indptr``/``kv_indices``) as a table of one row per request
(``slot_table``). Query length 1: ``decode_attention_fwd``. Longer, where the release has the verify
kernel: ``decode_attention_fwd_verify`` with the per-request table and lengths (it applies the
causal limit itself); else ``decode_attention_fwd`` with the table repeated per query row and each
row's own extent ``seq_len - qlen + 1 + t``. fp8 caches: queries in bf16 (an fp8 query is
dequantised by ``q_scale``), the cache dequantised in the kernel by ``kv_scale``.

Plain PyTorch; the Triton functions are passed in (``TritonDecode``).
``upstream_kernels.load_triton_decode`` is the one place they are imported from vLLM, lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .decode import output_buffer, pad_heads
from .persistent import device_key
from .planning import DecodePlan

NAME = "vLLM's Triton MLA decode"
MIN_KEYS_PER_SPLIT = 512  # vLLM's triton_mla.py: a power-of-two split count, about 512 keys a split
MAX_VERIFY_SPLITS = 8  # verify_num_kv_splits' default cap


@dataclass(frozen=True)
class TritonDecode:
    """vLLM's Triton MLA decode functions (or a stand-in honouring their contract), and the static
    split count every call is made with (a captured graph replays it)."""

    name: str
    decode_attention_fwd: Callable[..., object]
    decode_attention_fwd_verify: Callable[..., object] | None = None
    kv_splits: int = 4

    def function(self, qlen: int) -> str:
        """The Triton function that serves query length ``qlen``."""
        return "decode_attention_fwd_verify" if self.verifies(qlen) else "decode_attention_fwd"

    def verifies(self, qlen: int) -> bool:
        return qlen > 1 and self.decode_attention_fwd_verify is not None

    def rows_per_request(self, qlen: int) -> int:
        """Table rows per request: one, or one per query row (decode_attention_fwd with per-row extents)."""
        return 1 if self.verifies(qlen) else qlen


def kv_splits(max_keys: int, compute_units: int) -> int:
    """vLLM's TRITON_MLA split count for requests of up to ``max_keys`` keys: the next power of two of
    ``max_keys / 512``, at most twice the GPU's compute units."""
    ideal = max(1, max_keys // MIN_KEYS_PER_SPLIT)
    return max(1, min(1 << (ideal - 1).bit_length(), 2 * max(1, compute_units)))


def slot_table(plan: DecodePlan, requests: int, width: int, repeat: int = 1,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """The plan's slots as a table: row r (of ``requests * repeat``; request r // repeat) holds the
    request's slots in order in its first ``len`` columns, 0 after them (never read). ``out``: a
    persistent [rows, >= width] int32 buffer whose top-left part is filled and returned (its row stride
    kept, so a captured kernel reads the same addresses every step)."""
    indptr = plan.kv_indptr[:requests + 1].long()
    lens = indptr[1:] - indptr[:-1]
    cols = torch.arange(width, device=indptr.device)
    idx = indptr[:-1, None] + cols[None, :]
    last = max(plan.kv_indices.numel() - 1, 0)
    table = torch.where(cols[None, :] < lens[:, None], plan.kv_indices[idx.clamp(max=last)].long(), 0)
    if repeat > 1:
        table = table.repeat_interleave(repeat, dim=0)
    if out is None:
        return table.to(torch.int32)
    if out.shape[0] < table.shape[0] or out.shape[1] < width:
        raise ValueError(f"the slot table buffer {list(out.shape)} is smaller than {list(table.shape)}")
    view = out[:table.shape[0], :width]
    view.copy_(table)
    return view


# Slot tables claimed in vLLM's memory-profiling run (the impl's reserve_workspace(), vLLM 0.33 and later), so
# the KV cache is sized around them; a metadata builder whose calls the remedy serves takes one over
# (take_slot_table) instead of allocating it after the KV cache.
_RESERVED_TABLES: dict[tuple, torch.Tensor] = {}


def reserve_slot_table(rows: int, width: int, device: torch.device | str) -> torch.Tensor:
    """A persistent [rows, width] int32 slot table, allocated now (once per process, shape and device) and
    kept for :func:`take_slot_table`."""
    key = (rows, width, device_key(device))
    if key not in _RESERVED_TABLES:
        _RESERVED_TABLES[key] = torch.zeros((rows, width), dtype=torch.int32, device=device)
    return _RESERVED_TABLES[key]


def take_slot_table(rows: int, width: int, device: torch.device | str) -> torch.Tensor:
    """A table :func:`reserve_slot_table` made with at least ``rows`` rows and ``width`` columns on ``device``
    (handed out once), else a new [rows, width] one."""
    for key in [k for k in _RESERVED_TABLES if k[0] >= rows and k[1] == width and k[2] == device_key(device)]:
        return _RESERVED_TABLES.pop(key)
    return torch.zeros((rows, width), dtype=torch.int32, device=device)


def triton_mla_decode(
    q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_cache: torch.Tensor,
    plan: DecodePlan,
    *,
    kernels: TritonDecode,
    kv_lora_rank: int,
    scale: float,
    max_seqlen_q: int,
    decode_heads: int,
    out_dtype: torch.dtype,
    q_scale: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    table: torch.Tensor | None = None,
) -> torch.Tensor:
    """MLA decode of the rows ``plan`` describes by vLLM's Triton kernels; the arguments are
    ``decode.mla_decode``'s (same q, cache, plan, head count and output buffer). ``table``: the
    plan's ``slot_table`` (``kernels.rows_per_request(max_seqlen_q)`` rows a request), made here if
    not given (which reads the longest request's length back to the host). Returns [T, H, kv_lora_rank]."""
    if isinstance(q, tuple):
        q = torch.cat(q, dim=-1)
    num_tokens, num_heads, head_dim = q.shape
    if kv_cache.shape[-1] != head_dim:
        raise ValueError(f"query row size {head_dim} != KV cache row size {kv_cache.shape[-1]}")
    qlen = max_seqlen_q
    if num_tokens % qlen:
        raise ValueError(f"{num_tokens} query rows are not a whole number of requests of {qlen}")
    requests = num_tokens // qlen
    if q.element_size() == 1:  # an fp8 query: the Triton kernel takes it dequantised
        q = q.float() * (q_scale if q_scale is not None else 1.0)
    q = pad_heads(q.to(out_dtype), decode_heads).contiguous()
    o = output_buffer(out, (num_tokens, decode_heads, kv_lora_rank), out_dtype, q.device)
    indptr = plan.kv_indptr[:requests + 1]
    seq_lens = (indptr[1:] - indptr[:-1]).to(torch.int32)
    repeat = kernels.rows_per_request(qlen)
    if table is None:
        width = max(int(seq_lens.max()) if requests else 1, 1)
        table = slot_table(plan, requests, width, repeat)
    k_buffer = kv_cache.view(-1, 1, 1, head_dim)
    v_buffer = k_buffer[..., :kv_lora_rank]
    lse = torch.empty((num_tokens, decode_heads), dtype=torch.float32, device=q.device)
    if kernels.verifies(qlen):
        splits = max(1, min(kernels.kv_splits, MAX_VERIFY_SPLITS))
        logits = (torch.empty((num_tokens, decode_heads, splits, kv_lora_rank + 1), dtype=torch.float32,
                              device=q.device) if splits > 1 else None)
        kernels.decode_attention_fwd_verify(q, k_buffer, v_buffer, o, lse, table, seq_lens, None, qlen, logits,
                                            splits, scale, 1, k_scale=kv_scale)
    else:
        if qlen > 1:  # row t of a request sees its first seq_len - qlen + 1 + t keys
            offsets = torch.arange(1 - qlen, 1, device=seq_lens.device, dtype=seq_lens.dtype)
            seq_lens = (seq_lens[:, None] + offsets).flatten().clamp(min=0)
        logits = torch.empty((num_tokens, decode_heads, kernels.kv_splits, kv_lora_rank + 1), dtype=torch.float32,
                             device=q.device)
        kernels.decode_attention_fwd(q, k_buffer, v_buffer, o, lse, table, seq_lens, logits, kernels.kv_splits, scale,
                                     1, k_scale=kv_scale, v_scale=kv_scale, is_mla=True)
    return o[:, :num_heads]

