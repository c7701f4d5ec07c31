"""The decode call: absorbed query + latent KV cache + plan -> attention output.

Plain PyTorch; the kernel (AITER or the reference) is passed in.
"""

from __future__ import annotations

import torch

from .kernels import MLAKernels
from .persistent import PersistentWork
from .planning import DecodePlan


def pad_heads(q: torch.Tensor, decode_heads: int) -> torch.Tensor:
    """[T, H, D] -> [T, decode_heads, D] with zero query heads appended (heads are
    independent in MLA; the extra outputs are dropped)."""
    num_heads = q.shape[1]
    if decode_heads == num_heads:
        return q
    padded = q.new_zeros((q.shape[0], decode_heads, q.shape[2]))
    padded[:, :num_heads] = q
    return padded


def output_buffer(out: torch.Tensor | None, shape: tuple[int, int, int], out_dtype: torch.dtype,
                  device: torch.device, zeroed: bool = False) -> torch.Tensor:
    """``out`` checked against ``shape`` and ``out_dtype`` (zero-filled where ``zeroed``), else a new buffer."""
    if out is None:
        return (torch.zeros if zeroed else torch.empty)(shape, dtype=out_dtype, device=device)
    if tuple(out.shape) != shape or out.dtype != out_dtype:
        raise ValueError(f"out must be {list(shape)} {out_dtype}, got {list(out.shape)} {out.dtype}")
    return out.zero_() if zeroed else out


def mla_decode(
    q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_cache: torch.Tensor,
    plan: DecodePlan,
    *,
    kernels: MLAKernels,
    kv_lora_rank: int,
    scale: float,
    max_seqlen_q: int,
    decode_heads: int,
    out_dtype: torch.dtype,
    q_scale: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
    work: PersistentWork | None = None,
    v_scale_dropped: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run MLA decode for the rows described by ``plan``.

    q: [T, H, kv_lora_rank + rope] (absorbed q_nope followed by q_pe), or the pair
    (q_nope [T, H, kv_lora_rank], q_pe [T, H, rope]). kv_cache: [num_blocks,
    block_size, kv_lora_rank + rope], read as pages of one slot. T = requests x
    ``max_seqlen_q`` (the plan is uniform). With ``work`` (persistent mode) the
    get_mla_metadata_v1 buffers are passed; without it and for ``max_seqlen_q > 1`` the
    output is zero-filled first (the non-persistent kernel may leave lanes unwritten).
    ``v_scale_dropped``: the kernel leaves V unscaled for this call (ROCm/aiter#6732, measured
    at start-up by ``measure``): its output is multiplied by ``kv_scale``.
    ``out``: the [T, decode_heads, kv_lora_rank] ``out_dtype`` buffer the kernel writes (the start-up
    measurement passes one filled with NaN, so rows a kernel never writes show); zero-filled here where
    a new one would be. Returns [T, H, kv_lora_rank] in ``out_dtype``.
    """
    if isinstance(q, tuple):
        q = torch.cat(q, dim=-1)
    q = q.contiguous()
    num_tokens, num_heads, head_dim = q.shape
    if kv_cache.shape[-1] != head_dim:
        raise ValueError(f"query row size {head_dim} != KV cache row size {kv_cache.shape[-1]}")
    q = pad_heads(q, decode_heads)
    o = output_buffer(out, (num_tokens, decode_heads, kv_lora_rank), out_dtype, q.device,
                      zeroed=work is None and max_seqlen_q > 1)
    # Scales only for fp8: AITER builds without fp8 MLA take no q_scale/kv_scale arguments.
    extra = {} if q_scale is None and kv_scale is None else {"q_scale": q_scale, "kv_scale": kv_scale}
    if work is not None:
        extra.update(work.kernel_kwargs())
    kernels.mla_decode_fwd(
        q,
        kv_cache.view(-1, 1, 1, head_dim),
        o,
        plan.qo_indptr,
        plan.kv_indptr,
        plan.kv_indices,
        plan.kv_last_page_lens,
        max_seqlen_q,
        page_size=1,
        nhead_kv=1,
        sm_scale=scale,
        logit_cap=0.0,
        **extra,
    )
    if v_scale_dropped:
        if kv_scale is None:
            raise ValueError("v_scale_dropped needs the kv_scale the kernel was given")
        o.mul_(kv_scale)
    return o[:, :num_heads]
