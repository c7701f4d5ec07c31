"""Pure-PyTorch reference of the two AITER kernel contracts this backend calls.

* :func:`mla_decode_fwd` mirrors ``aiter.mla.mla_decode_fwd`` and refuses what its host-side
  contract refuses (shapes, dtypes, index tensors, a uniform query length per request, the head
  counts vLLM's built-in pads to, a zeroed output for non-persistent multi-token calls, work
  buffers planned for the batch at hand); which calls AITER computes right on a GPU is measured
  there at start-up (:mod:`measure`), not modelled here; :func:`get_mla_metadata_info_v1` /
  :func:`get_mla_metadata_v1` stand in for AITER's persistent-mode scheduling
* :func:`flash_attn_varlen_func` mirrors ``aiter.flash_attn_varlen_func``

Same argument names, shapes and in-place semantics, so the backend calls either one
through the same code. Used by the tests and by the explicit CPU development mode
(``AITER_MLA_KERNELS=reference``); production never falls back to it.

Both are vectorised over a padded [requests, rows, keys] grid whose sizes come from
static bounds (``max_seqlen_q`` and, for decode, ``max_seqlen_k``), so they run
without host synchronisation when those bounds are given (e.g. inside a CUDA graph;
while a graph is captured the decode contract's value checks are skipped, its shape and
dtype checks are not). Softmax is computed in float32.
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


PERSISTENT, NON_PERSISTENT = "persistent", "non-persistent"
# e4m3fnuz on gfx942, e4m3fn on gfx950 (per-tensor q_scale / kv_scale).
_FP8_E4M3 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))
# AITER's asm decode runs heads in groups of 16 (and 24 natively in some builds); vLLM's built-in
# pads every other count up to one of these, and so does the own path.
HEAD_GROUP = 16
NATIVE_ODD_HEADS = (24,)


def dtype_class(dtype: torch.dtype) -> str:
    """bf16 / fp8 for what AITER takes; the dtype's own name otherwise."""
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype in _FP8_E4M3:
        return "fp8"
    return str(dtype).removeprefix("torch.")


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _fail(message: str) -> None:
    raise ValueError(f"mla_decode_fwd contract: {message}")


def _check_decode_contract(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    o: torch.Tensor,
    indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    max_seqlen_q: int,
    page_size: int,
    nhead_kv: int,
    logit_cap: float,
    work: tuple[torch.Tensor | None, ...],
) -> str:
    """AITER's host-side checks. Returns the decode mode. Value checks (which read tensors) are skipped only while a
    CUDA graph is being captured; shape and dtype checks always run."""
    if logit_cap > 0:
        _fail(f"logit_cap must be <= 0 (no soft cap), got {logit_cap}")
    if nhead_kv != 1 or kv_buffer.dim() != 4 or kv_buffer.shape[2] != 1:
        _fail(f"MLA decode takes one KV head: kv_buffer [pages, page_size, 1, D], got {tuple(kv_buffer.shape)}")
    if kv_buffer.shape[1] != page_size:
        _fail(f"kv_buffer page dimension {kv_buffer.shape[1]} != page_size {page_size}")
    if q.dim() != 3 or o.dim() != 3:
        _fail(f"q and o must be 3-D [tokens, heads, dim], got {tuple(q.shape)} and {tuple(o.shape)}")
    total_q, num_heads, head_dim = q.shape
    if kv_buffer.shape[-1] != head_dim:
        _fail(f"q head dim {head_dim} != kv_buffer head dim {kv_buffer.shape[-1]}")
    if o.shape[:2] != (total_q, num_heads) or o.shape[2] > head_dim:
        _fail(f"o must be [{total_q}, {num_heads}, Dv<= {head_dim}], got {tuple(o.shape)}")
    for name, t in (("q", q), ("kv_buffer", kv_buffer), ("o", o)):
        if not t.is_contiguous():
            _fail(f"{name} must be contiguous (the kernel reads raw strides)")
    names = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_lens")
    for name, t in zip(names, indices):
        if t.dtype != torch.int32 or t.dim() != 1:
            _fail(f"{name} must be a 1-D int32 tensor, got {t.dtype} {tuple(t.shape)}")
    qo_indptr, kv_indptr, kv_indices, kv_last_page_lens = indices
    n_reqs = kv_indptr.shape[0] - 1
    if qo_indptr.shape[0] != n_reqs + 1 or kv_last_page_lens.shape[0] < n_reqs:
        _fail(f"qo_indptr [{qo_indptr.shape[0]}] / kv_last_page_lens [{kv_last_page_lens.shape[0]}] "
              f"do not match kv_indptr [{kv_indptr.shape[0]}]")
    # The kernel places request b's queries at b * max_seqlen_q (stride(0) * max_seqlen_q):
    # every request must have exactly max_seqlen_q query rows.
    if max_seqlen_q < 1 or total_q != n_reqs * max_seqlen_q:
        _fail(f"{total_q} query rows for {n_reqs} requests: AITER needs exactly max_seqlen_q={max_seqlen_q} "
              "rows per request")
    mode = PERSISTENT if work[0] is not None else NON_PERSISTENT
    if mode == PERSISTENT and any(w is None for w in work):
        _fail("persistent mode needs all six get_mla_metadata_v1 buffers")
    q_class, kv_class = dtype_class(q.dtype), dtype_class(kv_buffer.dtype)
    # float32 is the CPU development stand-in for bf16 (the reference only).
    if q_class not in ("bf16", "fp8", "float32") or kv_class not in ("bf16", "fp8", "float32"):
        _fail(f"MLA decode takes bf16 or fp8 (e4m3) queries and cache, got q {q_class} / KV {kv_class}")
    if q_class == "float32" and kv_class not in ("float32", "fp8"):
        _fail(f"float32 queries (development stand-in for bf16) need a float32 or fp8 cache, got {kv_class}")
    if num_heads % HEAD_GROUP and num_heads not in NATIVE_ODD_HEADS:
        _fail(f"{num_heads} query heads: the asm decode takes multiples of {HEAD_GROUP} (or "
              f"{', '.join(map(str, NATIVE_ODD_HEADS))} natively); pad the heads as vLLM's built-in does")
    if _capturing(q):
        return mode
    q_lens = qo_indptr[1:] - qo_indptr[:-1]
    if int(qo_indptr[0]) != 0 or not bool((q_lens == max_seqlen_q).all()):
        _fail(f"qo_indptr {qo_indptr.tolist()[:9]}... is not uniform with max_seqlen_q={max_seqlen_q}")
    n_pages = kv_indptr[1:] - kv_indptr[:-1]
    if int(kv_indptr[0]) != 0 or bool((n_pages < 0).any()) or int(kv_indptr[-1]) > kv_indices.shape[0]:
        _fail("kv_indptr must start at 0, not decrease, and stay within kv_indices")
    last = kv_last_page_lens[:n_reqs]
    if bool(((last < 1) | (last > page_size)).any()):
        _fail(f"kv_last_page_lens must lie in [1, page_size={page_size}]")
    k_lens = (n_pages - 1) * page_size + last
    if bool((k_lens < max_seqlen_q).any()):
        _fail(f"every request needs at least max_seqlen_q={max_seqlen_q} keys (its own query tokens), "
              f"got key lengths {k_lens.tolist()[:9]}")
    used = kv_indices[: int(kv_indptr[-1])]
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= kv_buffer.shape[0]):
        _fail(f"kv_indices outside the cache's {kv_buffer.shape[0]} pages")
    if mode == NON_PERSISTENT and max_seqlen_q > 1 and bool(o.ne(0).any()):
        # Non-persistent multi-token decode may leave output lanes unwritten
        # (vLLM 0.32's built-in zero-fills o before the call for this reason).
        _fail("non-persistent decode with max_seqlen_q > 1 needs a zero-filled o")
    if mode == PERSISTENT:
        _check_work_fingerprint(work[0], qo_indptr, kv_indptr, num_heads, max_seqlen_q)
    return mode


# Persistent-mode metadata. The reference cannot reproduce AITER's work schedule; its
# get_mla_metadata_v1 writes a fingerprint of the batch it planned, and decode refuses a
# schedule planned for another batch, head count or query length (stale or missized work).
_FINGERPRINT = 6


def _fingerprint(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, heads: int, qlen: int, out: torch.Tensor) -> None:
    out[0] = kv_indptr.shape[0] - 1
    out[1] = heads
    out[2] = qlen
    out[3:4].copy_(qo_indptr[-1:])
    out[4:5].copy_(kv_indptr[-1:])
    torch.sum(kv_indptr.to(torch.int64), 0, keepdim=True, out=out[5:6])


def _check_work_fingerprint(
    work_meta_data: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, heads: int, qlen: int
) -> None:
    expected = torch.empty(_FINGERPRINT, dtype=torch.int64, device=kv_indptr.device)
    _fingerprint(qo_indptr, kv_indptr, heads, qlen, expected)
    if not torch.equal(work_meta_data[:_FINGERPRINT].to(torch.int64), expected):
        _fail("persistent work buffers were planned for another batch (call get_mla_metadata_v1 with this "
              "step's qo_indptr/kv_indptr, head count and max_seqlen_q)")


def get_mla_metadata_info_v1(
    batch_size: int,
    max_seqlen_qo: int,
    num_head_qo: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    is_sparse: bool,
    fast_mode: bool = True,
    **_unused: object,
) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """Reference of ``aiter.get_mla_metadata_info_v1``: (shape, dtype) of the six work buffers."""
    if num_head_qo % 8 != 0:
        raise ValueError(f"get_mla_metadata_info_v1: num_head_qo {num_head_qo} must be a multiple of 8")
    small = ((1,), torch.int32)
    return (((_FINGERPRINT,), torch.int64), small, small, small, small, small)


def get_mla_metadata_v1(
    seqlens_qo_indptr: torch.Tensor,
    seqlens_kv_indptr: torch.Tensor,
    kv_last_page_lens: torch.Tensor,
    num_heads_per_head_k: int,
    num_heads_k: int,
    is_causal: bool,
    work_metadata_ptrs: torch.Tensor,
    work_info_set: torch.Tensor,
    work_indptr: torch.Tensor,
    reduce_indptr: torch.Tensor,
    reduce_final_map: torch.Tensor,
    reduce_partial_map: torch.Tensor,
    page_size: int = 1,
    kv_granularity: int = 16,
    max_seqlen_qo: int = -1,
    uni_seqlen_qo: int = -1,
    fast_mode: bool = True,
    **_unused: object,
) -> None:
    """Reference of ``aiter.get_mla_metadata_v1`` (fills the work buffers in place)."""
    if num_heads_k != 1 or not is_causal:
        raise ValueError("get_mla_metadata_v1: MLA decode plans one KV head, causal")
    for name, t in (("qo", seqlens_qo_indptr), ("kv", seqlens_kv_indptr), ("last_page", kv_last_page_lens)):
        if t.dtype != torch.int32:
            raise ValueError(f"get_mla_metadata_v1: {name} must be int32, got {t.dtype}")
    if max_seqlen_qo < 1:
        raise ValueError(f"get_mla_metadata_v1: max_seqlen_qo must be >= 1, got {max_seqlen_qo}")
    _fingerprint(seqlens_qo_indptr, seqlens_kv_indptr, num_heads_per_head_k, max_seqlen_qo,
                 work_metadata_ptrs[:_FINGERPRINT])


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
    num_kv_splits_indptr: torch.Tensor | None = None,
    work_meta_data: torch.Tensor | None = None,
    work_indptr: torch.Tensor | None = None,
    work_info_set: torch.Tensor | None = None,
    reduce_indptr: torch.Tensor | None = None,
    reduce_final_map: torch.Tensor | None = None,
    reduce_partial_map: torch.Tensor | None = None,
    q_scale: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
    *,
    max_seqlen_k: int | None = None,
    **_unused: object,
) -> tuple[None, torch.Tensor]:
    """Reference of ``aiter.mla.mla_decode_fwd`` that refuses what its host-side contract
    refuses (see the module docstring).

    q [B * max_seqlen_q, H, D] (D = kv_lora_rank + rope), kv_buffer [num_pages, page_size,
    1, D], o [B * max_seqlen_q, H, Dv] written in place (V is the first Dv values of each
    KV row). Request b's query rows are b * max_seqlen_q + i, as in AITER. Returns
    ``(None, lse [T, H])``.

    Reference-only extension: ``max_seqlen_k``, a static bound on keys per request
    that avoids the one host synchronisation otherwise used to size the key grid.
    """
    work = (work_meta_data, work_indptr, work_info_set, reduce_indptr, reduce_final_map, reduce_partial_map)
    _check_decode_contract(q, kv_buffer, o, (qo_indptr, kv_indptr, kv_indices, kv_last_page_lens),
                           max_seqlen_q, page_size, nhead_kv, logit_cap, work)
    if (q.dtype in _FP8_DTYPES) != (kv_buffer.dtype in _FP8_DTYPES):
        _fail("fp8 decode needs both q and kv_buffer in fp8 (bf16 q with an fp8 cache is persistent-only "
              "and not used by this backend)")
    total_q, num_heads, head_dim = q.shape
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    v_dim = o.shape[2]
    n_reqs = kv_indptr.shape[0] - 1

    q_lens = torch.full((n_reqs,), max_seqlen_q, dtype=torch.int64, device=q.device)
    n_pages = kv_indptr[1:] - kv_indptr[:-1]
    k_lens = torch.where(
        n_pages > 0, (n_pages - 1) * page_size + kv_last_page_lens[:n_reqs], torch.zeros_like(n_pages)
    )
    if max_seqlen_k is None:
        max_seqlen_k = int(k_lens.max()) if n_reqs > 0 else 0

    q_starts = torch.arange(n_reqs, device=q.device) * max_seqlen_q
    q_idx, q_valid = _gather_rows(q_starts, q_lens, max_seqlen_q)
    j = torch.arange(max_seqlen_k, device=q.device)
    k_valid = j < k_lens.to(torch.int64).unsqueeze(1)
    page_pos = (kv_indptr[:-1].to(torch.int64).unsqueeze(1) + j // page_size).clamp(0, max(kv_indices.shape[0] - 1, 0))
    pages = kv_indices.to(torch.int64)[page_pos]
    flat_rows = torch.where(k_valid, pages * page_size + j % page_size, torch.zeros_like(pages))

    # the rows read, then converted (not the whole cache: vLLM's is gigabytes)
    kv = _dequantize(kv_buffer.reshape(-1, head_dim)[flat_rows], kv_scale)  # [B, Lk, D]
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
