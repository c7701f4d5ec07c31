"""Persistent-mode decode scheduling: AITER's ``get_mla_metadata_v1`` work buffers.

In persistent mode ``mla_decode_fwd`` takes six extra tensors describing how the batch's
(request, KV split) work items map onto the GPU's compute units. They are sized once by
``get_mla_metadata_info_v1`` for the largest batch and query length, and filled every
decode step from the step's plan. Plain PyTorch; the AITER functions (or the reference's)
come from :class:`~vllm_aiter_mla.kernels.MLAKernels`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import MLAKernels
from .planning import DecodePlan

_NAMES = ("work_meta_data", "work_indptr", "work_info_set", "reduce_indptr", "reduce_final_map", "reduce_partial_map")


@dataclass(frozen=True)
class PersistentWork:
    heads: int
    max_qlen: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    work_meta_data: torch.Tensor
    work_indptr: torch.Tensor
    work_info_set: torch.Tensor
    reduce_indptr: torch.Tensor
    reduce_final_map: torch.Tensor
    reduce_partial_map: torch.Tensor

    def kernel_kwargs(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in _NAMES}


def largest_specs(all_specs) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Per buffer, the largest size in each dimension over several ``get_mla_metadata_info_v1``
    answers ((shape, dtype) per buffer; a shape may be a bare int)."""
    merged = []
    for entries in zip(*all_specs, strict=True):
        shapes = [tuple(shape) if isinstance(shape, (tuple, list)) else (shape,) for shape, _ in entries]
        if len({len(s) for s in shapes}) != 1 or len({dtype for _, dtype in entries}) != 1:
            raise ValueError(f"get_mla_metadata_info_v1 answered buffers of different ranks or dtypes: {entries}")
        merged.append((tuple(max(dims) for dims in zip(*shapes)), entries[0][1]))
    return merged


def allocate_work(
    kernels: MLAKernels,
    max_reqs: int,
    max_qlen: int,
    heads: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    device: torch.device | str,
) -> PersistentWork:
    if kernels.get_mla_metadata_info_v1 is None or kernels.get_mla_metadata_v1 is None:
        raise ValueError(
            "This AITER build has no get_mla_metadata_v1 (persistent MLA decode); "
            "install the AITER build of this project's image (vLLM's built-in decodes with them too)."
        )
    # Every step is planned for its own query length (1 .. max_qlen), and AITER's needs are not
    # monotonic in it (gfx950 bf16 tiles fewer than 128 packed rows by 64): each buffer is sized
    # by the largest of its sizes over every query length served.
    specs = largest_specs(kernels.get_mla_metadata_info_v1(max_reqs, qlen, heads, q_dtype, kv_dtype, is_sparse=False,
                                                           fast_mode=True) for qlen in range(1, max_qlen + 1))
    tensors = {name: torch.empty(shape, dtype=dtype, device=device) for name, (shape, dtype) in zip(_NAMES, specs)}
    return PersistentWork(heads=heads, max_qlen=max_qlen, q_dtype=q_dtype, kv_dtype=kv_dtype, **tensors)


# Work buffers claimed in vLLM's memory-profiling run (vLLM 0.33 and later call the impl's
# reserve_workspace() there), so the KV cache is sized around them; the first metadata builder
# of the same shape takes them over (take_work) instead of allocating after the KV cache.
_RESERVED: dict[tuple, PersistentWork] = {}


def device_key(device: torch.device | str) -> tuple:
    """(type, index) of ``device``, a CUDA device without an index as the current one: a key of reserved buffers."""
    dev = torch.device(device)
    index = dev.index
    if index is None and dev.type == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
    return dev.type, index


def reserve_work(kernels: MLAKernels, max_reqs: int, max_qlen: int, heads: int, q_dtype: torch.dtype,
                 kv_dtype: torch.dtype, device: torch.device | str) -> PersistentWork:
    """The work buffers of this shape, allocated now (once per process and shape) and kept for
    :func:`take_work`."""
    key = (max_reqs, max_qlen, heads, q_dtype, kv_dtype, *device_key(device))
    if key not in _RESERVED:
        _RESERVED[key] = allocate_work(kernels, max_reqs, max_qlen, heads, q_dtype, kv_dtype, device)
    return _RESERVED[key]


def take_work(kernels: MLAKernels, max_reqs: int, max_qlen: int, heads: int, q_dtype: torch.dtype,
              kv_dtype: torch.dtype, device: torch.device | str) -> PersistentWork:
    """The buffers :func:`reserve_work` made for this shape (handed out once), else new ones."""
    reserved = _RESERVED.pop((max_reqs, max_qlen, heads, q_dtype, kv_dtype, *device_key(device)), None)
    return reserved if reserved is not None else allocate_work(kernels, max_reqs, max_qlen, heads, q_dtype,
                                                                kv_dtype, device)


def plan_work(kernels: MLAKernels, work: PersistentWork, plan: DecodePlan, max_seqlen_q: int) -> None:
    """Fill the work buffers for this step (uniform query length ``max_seqlen_q``)."""
    if max_seqlen_q > work.max_qlen:
        raise ValueError(f"query length {max_seqlen_q} exceeds the persistent work buffers' {work.max_qlen}")
    kernels.get_mla_metadata_v1(
        plan.qo_indptr,
        plan.kv_indptr,
        plan.kv_last_page_lens,
        work.heads,
        1,
        True,
        work.work_meta_data,
        work.work_info_set,
        work.work_indptr,
        work.reduce_indptr,
        work.reduce_final_map,
        work.reduce_partial_map,
        page_size=1,
        kv_granularity=16,
        max_seqlen_qo=max_seqlen_q,
        uni_seqlen_qo=max_seqlen_q,
        fast_mode=True,
        dtype_q=work.q_dtype,
        dtype_kv=work.kv_dtype,
    )
