"""Decode planning as one fused Triton kernel (GPU: ROCm or CUDA), cost proportional to the
batch's total KV tokens.

Same result as :func:`planning.plan_decode_into` with ``uniform_qlen`` (the layout AITER's
decode takes), written into the same :class:`planning.DecodePlanBuffers`:

* ``qo_indptr[i] = i * qlen``
* ``kv_indptr``: prefix sum of ``max(seq_len, qlen)`` (padding rows of a CUDA-graph batch,
  sequence length 0, get ``qlen`` keys)
* ``kv_indices[t]`` for every key ``t < kv_indptr[B]``: the slot of that key,
  ``block_table[b, p // block_size] * block_size + p % block_size``

One launch with a fixed grid: every program computes the prefix sum of the sequence
lengths in registers (a batch holds at most ``max_num_seqs`` requests; program 0 writes
it out), then handles every ``num_programs``-th tile of ``BLOCK_T`` keys. The requests of
a tile's first and last key come from the prefix sum (one reduction each). A tile inside
one request (every tile but those holding a request boundary) has one row of the block
table and one start; a tile that spans several requests finds each key's request by a
binary search over the prefix sum, vectorised per key and bounded to the tile's requests
(``ceil(log2(span + 1))`` gather steps, whatever the span: a tile of one-key requests
spans up to ``BLOCK_T`` of them). Nothing is allocated and nothing is read back on the
host, so the call can also be captured in a CUDA graph. Work: ``O(programs x requests +
total keys)``, independent of the block table's width (``max_model_len``); memory traffic
is the index array written plus the block-table entries read.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .planning import DecodePlan, DecodePlanBuffers

# Launch shape, measured on an H200 (backend/bench/planning.py).
BLOCK_T = 4096  # keys per tile
PROGRAMS_PER_SM = 4
NUM_WARPS = 4
MAX_REQS = 4096  # the prefix sum of all sequence lengths lives in registers
_NO_END = tl.constexpr(2147483647)  # the "end" of rows past the batch: after every key


@triton.jit
def _write_keys(kv_indices_ptr, row_ptr, t, start, total, FULL: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """kv_indices[t] = slot of position t - start of the request whose block-table row
    starts at row_ptr (a pointer, or one per key). FULL: every key of the tile is valid."""
    pos = t - start
    if FULL:
        block = tl.load(row_ptr + pos // BLOCK_SIZE)
        tl.store(kv_indices_ptr + t, block * BLOCK_SIZE + pos % BLOCK_SIZE)
    else:
        valid = t < total
        block = tl.load(row_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
        tl.store(kv_indices_ptr + t, block * BLOCK_SIZE + pos % BLOCK_SIZE, mask=valid)


@triton.jit
def _plan_kernel(
    block_table_ptr,
    block_table_stride,
    seq_lens_ptr,
    num_reqs,
    qlen,
    capacity,
    qo_indptr_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)

    # Every program: max(seq_len, qlen), its inclusive prefix sum (ends) and the requests'
    # starts, in registers.
    r = tl.arange(0, BLOCK_R)
    in_batch = r < num_reqs
    lens = tl.load(seq_lens_ptr + r, mask=in_batch, other=0)
    lens = tl.where(in_batch, tl.maximum(lens, qlen), 0)
    ends = tl.cumsum(lens, 0)
    starts = ends - lens
    total = tl.minimum(tl.sum(lens, 0), capacity)
    ends = tl.where(in_batch, ends, _NO_END)  # rows past the batch never end before a key
    if pid == 0:
        tl.store(kv_indptr_ptr, 0)
        tl.store(kv_indptr_ptr + 1 + r, ends, mask=in_batch)
        tl.store(qo_indptr_ptr + r, r * qlen, mask=in_batch)
        tl.store(qo_indptr_ptr + num_reqs, num_reqs * qlen)

    for tile in range(pid, tl.cdiv(total, BLOCK_T), num_programs):
        t0 = tl.multiple_of(tile * BLOCK_T, BLOCK_T)
        t = t0 + tl.arange(0, BLOCK_T)
        full = t0 + BLOCK_T <= total
        t_last = tl.minimum(t0 + BLOCK_T, total) - 1
        # Requests of the tile's first and last key: how many requests end at or before it.
        req_lo = tl.sum((ends <= t0).to(tl.int32), 0)
        req_hi = tl.sum((ends <= t_last).to(tl.int32), 0)
        if req_hi == req_lo:
            # One request: one row of the block table, one start.
            req_start = tl.max(tl.where(ends <= t0, ends, 0), 0)
            req_row = block_table_ptr + req_lo.to(tl.int64) * block_table_stride
            if full:
                _write_keys(kv_indices_ptr, req_row, t, req_start, total, True, BLOCK_SIZE)
            else:
                _write_keys(kv_indices_ptr, req_row, t, req_start, total, False, BLOCK_SIZE)
        else:
            # Requests req_lo..req_hi: per key, the first request that ends after it, by a
            # binary search in [lo, hi] (one gather from the prefix sum per step; bit_length
            # (req_hi - req_lo) steps narrow req_hi - req_lo + 1 candidates to one). Keys past
            # the batch (last tile) search as its last key, so every index stays in [lo, hi].
            key = tl.minimum(t, t_last)
            lo = tl.zeros((BLOCK_T,), dtype=tl.int32) + req_lo
            hi = tl.zeros((BLOCK_T,), dtype=tl.int32) + req_hi
            steps = req_hi - req_lo
            while steps > 0:
                mid = (lo + hi) >> 1
                after = tl.gather(ends, mid, 0) <= key  # the key lies after request mid
                lo = tl.where(after, mid + 1, lo)
                hi = tl.where(after, hi, mid)
                steps = steps >> 1
            key_start = tl.gather(starts, lo, 0)
            key_row = block_table_ptr + lo.to(tl.int64) * block_table_stride
            if full:
                _write_keys(kv_indices_ptr, key_row, t, key_start, total, True, BLOCK_SIZE)
            else:
                _write_keys(kv_indices_ptr, key_row, t, key_start, total, False, BLOCK_SIZE)


@functools.cache
def _num_programs(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count * PROGRAMS_PER_SM


def plan_decode_triton(
    buffers: DecodePlanBuffers,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    qlen: int,
    max_seq_len: int | None = None,
) -> DecodePlan:
    """Plan one decode step on the GPU (uniform query length ``qlen``).

    ``block_table`` [B, W] and ``seq_lens`` [B] are int32 on the plan buffers' device;
    the table may be wider than needed (only the blocks holding keys are read).
    ``max_seq_len`` (host), if given, caps the grid for small batches. The buffers'
    ``capacity`` must hold the step's keys (the builder sizes it by the KV cache's slot
    count plus ``qlen`` per padding row, which no batch can exceed).
    """
    num_reqs = block_table.shape[0]
    if buffers.max_reqs > MAX_REQS:
        raise ValueError(f"the Triton planner plans up to {MAX_REQS} requests per step, the buffers hold "
                         f"{buffers.max_reqs}; lower --max-num-seqs")
    if num_reqs > buffers.max_reqs or seq_lens.shape != (num_reqs,):
        raise ValueError(f"batch of {num_reqs} requests (seq_lens {tuple(seq_lens.shape)}) does not fit "
                         f"plan buffers for {buffers.max_reqs}")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32 or block_table.stride(1) != 1:
        raise ValueError("block_table (rows contiguous) and seq_lens must be int32")
    programs = _num_programs(block_table.device.index or 0)
    if max_seq_len is not None:
        programs = max(1, min(programs, -(-num_reqs * max(max_seq_len, qlen) // BLOCK_T)))
    _plan_kernel[(programs,)](
        block_table,
        block_table.stride(0),
        seq_lens,
        num_reqs,
        qlen,
        buffers.capacity,
        buffers.qo_indptr,
        buffers.kv_indptr,
        buffers.kv_indices,
        BLOCK_SIZE=buffers.block_size,
        BLOCK_R=triton.next_power_of_2(buffers.max_reqs),
        BLOCK_T=BLOCK_T,
        num_warps=NUM_WARPS,
    )
    return DecodePlan(
        qo_indptr=buffers.qo_indptr[: num_reqs + 1],
        kv_indptr=buffers.kv_indptr[: num_reqs + 1],
        kv_indices=buffers.kv_indices,
        kv_last_page_lens=buffers.kv_last_page_lens[:num_reqs],
    )
