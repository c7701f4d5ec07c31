"""Pure-PyTorch reference of the two AITER kernel contracts this backend calls.

* :func:`mla_decode_fwd` mirrors ``aiter.mla.mla_decode_fwd``
* :func:`flash_attn_varlen_func` mirrors ``aiter.flash_attn_varlen_func``

Same argument names, shapes and in-place semantics, so the backend calls either one
through the same code. Used by the tests and by the explicit CPU development mode
(``AITER_MLA_KERNELS=reference``); production never falls back to it.

Both are vectorised over a padded [requests, rows, keys] grid whose sizes come from
static bounds (``max_seqlen_q`` and, for decode, ``max_seqlen_k``), so they run
without host synchronisation when those bounds are given (e.g. inside a CUDA graph).
Softmax is computed in float32.
"""

from __future__ import annotations

import math

import torch

_FP8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, name)
)


def _dequantize(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    x = x.float()
    if scale is not None:
        x = x * scale.float().reshape(())
    return x


def _gather_rows(starts: torch.Tensor, lens: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row index [n_reqs, width] = starts[b] + i (clamped to >= 0) and validity i < lens[b]."""
    i = torch.arange(width, device=starts.device)
    idx = starts.to(torch.int64).unsqueeze(1) + i
    valid = i < lens.to(torch.int64).unsqueeze(1)
    return torch.where(valid, idx, torch.zeros_like(idx)), valid


def _attend(
    q: torch.Tensor,  # [B, Mq, H, D] float32
    k: torch.Tensor,  # [B, Lk, H, D] or [B, Lk, D] (one KV head shared by all heads)
    v: torch.Tensor,  # [B, Lk, H, Dv] or [B, Lk, Dv]
    q_valid: torch.Tensor,  # [B, Mq]
    k_valid: torch.Tensor,  # [B, Lk]
    q_lens: torch.Tensor,  # [B]
    k_lens: torch.Tensor,  # [B]
    scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention; returns out [B, Mq, H, Dv] and lse [B, Mq, H]."""
    shared = k.dim() == 3
    scores = torch.einsum("bqhd,bkd->bqhk" if shared else "bqhd,bkhd->bqhk", q, k) * scale
    mask = q_valid[:, :, None] & k_valid[:, None, :]  # [B, Mq, Lk]
    if causal:
        # Bottom-right aligned: row i of a request sees keys j <= k_len - q_len + i.
        i = torch.arange(q.shape[1], device=q.device)
        j = torch.arange(k.shape[1], device=q.device)
        limit = (k_lens - q_lens).unsqueeze(1) + i  # [B, Mq]
        mask = mask & (j[None, None, :] <= limit[:, :, None])
    scores = scores.masked_fill(~mask[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, Mq, H]; -inf where nothing is visible
    probs = torch.exp(scores - lse.unsqueeze(-1).clamp_min(torch.finfo(torch.float32).min))
    probs = torch.nan_to_num(probs, nan=0.0)
    out = torch.einsum("bqhk,bkd->bqhd" if shared else "bqhk,bkhd->bqhd", probs, v)
    return out, lse


def _scatter_rows(dst: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor) -> None:
    """dst[idx[valid]] = rows[valid] without host sync (invalid rows go to a spare row)."""
    spare = dst.shape[0]
    flat_idx = torch.where(valid, idx, torch.full_like(idx, spare)).reshape(-1)
    staging = dst.new_empty((spare + 1, *dst.shape[1:]))
    staging[:spare] = dst
    staging.index_copy_(0, flat_idx, rows.reshape(-1, *dst.shape[1:]).to(dst.dtype))
    dst.copy_(staging[:spare])


def mla_decode_fwd(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    o: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_lens: torch.Tensor,
    max_seqlen_q: int,
    page_size: int = 1,
    nhead_kv: int = 1,
    sm_scale: float | None = None,
    logit_cap: float = 0.0,
    num_kv_splits: int | None = None,
    q_scale: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
    *,
    max_seqlen_k: int | None = None,
    **_unused: object,
) -> tuple[None, torch.Tensor]:
    """Reference of ``aiter.mla.mla_decode_fwd``.

    q [T, H, D] (D = kv_lora_rank + rope), kv_buffer [num_pages, page_size, 1, D],
    o [T, H, Dv] written in place (Dv = o.shape[-1], V is the first Dv values of each
    KV row). Returns ``(None, lse [T, H])``.

    ``max_seqlen_k`` is a reference-only extension: a static bound on keys per request
    that avoids the one host synchronisation otherwise used to size the key grid.
    """
    if logit_cap > 0:
        raise ValueError(f"logit_cap must be <= 0 (no soft cap), got {logit_cap}")
    if nhead_kv != 1 or kv_buffer.dim() != 4 or kv_buffer.shape[2] != 1:
        raise ValueError(f"MLA decode takes one KV head: kv_buffer [pages, page_size, 1, D], got {tuple(kv_buffer.shape)}")
    if kv_buffer.shape[1] != page_size:
        raise ValueError(f"kv_buffer page dimension {kv_buffer.shape[1]} != page_size {page_size}")
    total_q, num_heads, head_dim = q.shape
    if kv_buffer.shape[-1] != head_dim:
        raise ValueError(f"q head dim {head_dim} != kv_buffer head dim {kv_buffer.shape[-1]}")
    if o.shape[:2] != (total_q, num_heads) or o.shape[2] > head_dim:
        raise ValueError(f"o must be [{total_q}, {num_heads}, Dv<= {head_dim}], got {tuple(o.shape)}")
    if (q.dtype in _FP8_DTYPES) != (kv_buffer.dtype in _FP8_DTYPES):
        raise ValueError("fp8 decode needs both q and kv_buffer in fp8")
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    v_dim = o.shape[2]
    n_reqs = kv_indptr.shape[0] - 1

    q_lens = qo_indptr[1:] - qo_indptr[:-1]
    n_pages = kv_indptr[1:] - kv_indptr[:-1]
    k_lens = torch.where(
        n_pages > 0, (n_pages - 1) * page_size + kv_last_page_lens[:n_reqs], torch.zeros_like(n_pages)
    )
    if max_seqlen_k is None:
        max_seqlen_k = int(k_lens.max()) if n_reqs > 0 else 0

    q_idx, q_valid = _gather_rows(qo_indptr[:-1], q_lens, max_seqlen_q)
    j = torch.arange(max_seqlen_k, device=q.device)
    k_valid = j < k_lens.to(torch.int64).unsqueeze(1)
    page_pos = (kv_indptr[:-1].to(torch.int64).unsqueeze(1) + j // page_size).clamp(0, max(kv_indices.shape[0] - 1, 0))
    pages = kv_indices.to(torch.int64)[page_pos]
    flat_rows = torch.where(k_valid, pages * page_size + j % page_size, torch.zeros_like(pages))

    kv = _dequantize(kv_buffer.reshape(-1, head_dim), kv_scale)[flat_rows]  # [B, Lk, D]
    qf = _dequantize(q, q_scale)[q_idx]  # [B, Mq, H, D]
    out, lse = _attend(
        qf, kv, kv[..., :v_dim], q_valid, k_valid, q_lens, k_lens, scale, causal=True
    )
    _scatter_rows(o, out, q_idx, q_valid)
    lse_flat = torch.empty(total_q, num_heads, dtype=torch.float32, device=q.device)
    _scatter_rows(lse_flat, lse, q_idx, q_valid)
    return None, lse_flat


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    *,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    **_unused: object,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``aiter.flash_attn_varlen_func``.

    q [Tq, H, Dqk], k [Tk, Hk, Dqk], v [Tk, Hk, Dv] (Dv may differ from Dqk; H a
    multiple of Hk); causal masks are aligned bottom-right. Returns out [Tq, H, Dv],
    or (out, lse [H, Tq]) with ``return_lse``.
    """
    if dropout_p != 0.0:
        raise ValueError("the reference has no dropout")
    total_q, num_heads, d_qk = q.shape
    kv_heads = k.shape[1]
    if num_heads % kv_heads != 0:
        raise ValueError(f"query heads {num_heads} must be a multiple of KV heads {kv_heads}")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d_qk)
    n_reqs = cu_seqlens_q.shape[0] - 1
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    k_lens = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    q_idx, q_valid = _gather_rows(cu_seqlens_q[:-1], q_lens, max_seqlen_q)
    k_idx, k_valid = _gather_rows(cu_seqlens_k[:-1], k_lens, max_seqlen_k)
    group = num_heads // kv_heads
    kf = k.float().repeat_interleave(group, dim=1)[k_idx]
    vf = v.float().repeat_interleave(group, dim=1)[k_idx]
    res, lse = _attend(q.float()[q_idx], kf, vf, q_valid, k_valid, q_lens, k_lens, scale, causal)
    if out is None:
        out = q.new_empty((total_q, num_heads, v.shape[-1]))
    _scatter_rows(out, res, q_idx, q_valid)
    if not return_lse:
        return out
    lse_flat = torch.empty(total_q, num_heads, dtype=torch.float32, device=q.device)
    _scatter_rows(lse_flat, lse, q_idx, q_valid)
    return out, lse_flat.transpose(0, 1).contiguous()
