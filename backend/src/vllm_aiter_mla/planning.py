"""Decode planning: vLLM's paged block table -> the index tensors AITER's MLA decode takes.

AITER's ``mla_decode_fwd`` reads the KV cache as pages. This backend always views the
cache as pages of ONE slot (``kv_cache.view(-1, 1, 1, 576)``), so any vLLM block size
works and the plan is:

* ``qo_indptr``         [B+1]  query row offsets of each request (vLLM's query_start_loc)
* ``kv_indptr``         [B+1]  offsets into ``kv_indices``: cumulative sequence lengths
* ``kv_indices``        [>= total KV]  slot id of every key, request by request, in order
* ``kv_last_page_lens`` [B]    all ones (a page holds one slot)

All four are int32. Slot ``p`` of request ``b`` is
``block_table[b, p // block_size] * block_size + p % block_size``.

Two implementations with the same result:

* :func:`plan_decode` allocates exactly-sized outputs (one host sync for the total
  key count). Simple; for tests and eager use.
* :func:`plan_decode_into` writes into preallocated :class:`DecodePlanBuffers` with
  ``out=`` variants of every operation: no host synchronisation and no allocation,
  so it can run inside a captured CUDA graph or every step on persistent buffers
  that a captured decode kernel reads.

Plain PyTorch, no vLLM import.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INT = torch.int32


@dataclass(frozen=True)
class DecodePlan:
    """The four int32 index tensors of one decode step (page size 1)."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_lens: torch.Tensor


def _check_inputs(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_size: int,
) -> int:
    if block_table.dim() != 2:
        raise ValueError(f"block_table must be 2-D [num_reqs, max_blocks], got {tuple(block_table.shape)}")
    num_reqs = block_table.shape[0]
    if seq_lens.shape != (num_reqs,):
        raise ValueError(f"seq_lens must have shape ({num_reqs},), got {tuple(seq_lens.shape)}")
    if query_start_loc.shape != (num_reqs + 1,):
        raise ValueError(
            f"query_start_loc must have shape ({num_reqs + 1},), got {tuple(query_start_loc.shape)}"
        )
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return num_reqs


def plan_decode(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_size: int,
) -> DecodePlan:
    """Exactly-sized plan. Synchronises once with the device (the total key count)."""
    num_reqs = _check_inputs(block_table, seq_lens, query_start_loc, block_size)
    device = block_table.device
    seq_lens = seq_lens.to(torch.int64)
    kv_indptr = torch.zeros(num_reqs + 1, dtype=torch.int64, device=device)
    torch.cumsum(seq_lens, 0, out=kv_indptr[1:])
    total = int(kv_indptr[-1])
    # Request id of every key, then its position inside the request.
    req = torch.repeat_interleave(torch.arange(num_reqs, device=device), seq_lens, output_size=total)
    pos = torch.arange(total, device=device) - kv_indptr[req]
    blocks = block_table.to(torch.int64)[req, pos // block_size]
    kv_indices = blocks * block_size + pos % block_size
    return DecodePlan(
        qo_indptr=query_start_loc.to(_INT),
        kv_indptr=kv_indptr.to(_INT),
        kv_indices=kv_indices.to(_INT),
        kv_last_page_lens=torch.ones(num_reqs, dtype=_INT, device=device),
    )


@dataclass(frozen=True)
class DecodePlanBuffers:
    """Persistent outputs of :func:`plan_decode_into`, at fixed addresses.

    Sized once for the largest batch (``max_reqs``) and the longest block table
    (``max_blocks`` blocks of ``block_size`` slots). ``kv_indices`` has one spare
    entry at the end: positions past a request's length are scattered there.

    A plan never points past ``capacity``: ``kv_indptr`` is clamped to it (the requests past
    it get fewer keys, or none) and ``overflow`` keeps the largest number of keys a step had
    to drop, on the device; :meth:`check_overflow` reads it back. With the default capacity
    (``max_reqs x max_blocks x block_size``) no batch the buffers accept can overflow.
    """

    max_reqs: int
    max_blocks: int
    block_size: int
    qo_indptr: torch.Tensor  # [max_reqs + 1]
    kv_indptr: torch.Tensor  # [max_reqs + 1]
    kv_indices: torch.Tensor  # [capacity + 1]
    kv_last_page_lens: torch.Tensor  # [max_reqs]
    overflow: torch.Tensor  # int32 [1]: the most keys a step planned past capacity (0: none)
    # Constants, kept as tensors so that no operation has to wrap a Python scalar.
    block_size_t: torch.Tensor  # int32 [1]
    capacity_t: torch.Tensor  # int32 [1]
    offsets: torch.Tensor  # int32 [block_size]  0..block_size-1
    positions: torch.Tensor  # int64 [max_blocks * block_size]  0..max_slots-1
    req_ids: torch.Tensor  # int32 [max_reqs + 1]  0..max_reqs

    @classmethod
    def allocate(
        cls,
        max_reqs: int,
        max_blocks: int,
        block_size: int,
        device: torch.device | str,
        max_keys: int | None = None,
    ) -> "DecodePlanBuffers":
        """``max_keys``: a smaller ``kv_indices`` than ``max_reqs x max_blocks x block_size``
        (the most keys a batch of these buffers can have), for tests of the overflow guard.
        Not the KV cache's slot count: requests sharing prefix blocks reference a slot once
        each."""
        if max_reqs < 1 or max_blocks < 1 or block_size < 1:
            raise ValueError(
                f"max_reqs, max_blocks and block_size must be >= 1, got {max_reqs}, {max_blocks}, {block_size}"
            )
        max_slots = max_blocks * block_size
        capacity = max_reqs * max_slots if max_keys is None else min(max_keys, max_reqs * max_slots)
        return cls(
            max_reqs=max_reqs,
            max_blocks=max_blocks,
            block_size=block_size,
            qo_indptr=torch.zeros(max_reqs + 1, dtype=_INT, device=device),
            kv_indptr=torch.zeros(max_reqs + 1, dtype=_INT, device=device),
            kv_indices=torch.zeros(capacity + 1, dtype=_INT, device=device),
            kv_last_page_lens=torch.ones(max_reqs, dtype=_INT, device=device),
            overflow=torch.zeros(1, dtype=_INT, device=device),
            block_size_t=torch.tensor([block_size], dtype=_INT, device=device),
            capacity_t=torch.tensor([capacity], dtype=_INT, device=device),
            offsets=torch.arange(block_size, dtype=_INT, device=device),
            positions=torch.arange(max_slots, dtype=torch.int64, device=device),
            req_ids=torch.arange(max_reqs + 1, dtype=_INT, device=device),
        )

    @property
    def capacity(self) -> int:
        return self.kv_indices.shape[0] - 1

    def plan(self, num_reqs: int) -> DecodePlan:
        """Views of the plan of ``num_reqs`` requests these buffers hold."""
        return DecodePlan(self.qo_indptr[: num_reqs + 1], self.kv_indptr[: num_reqs + 1], self.kv_indices,
                          self.kv_last_page_lens[:num_reqs])

    def check_overflow(self) -> None:
        """RuntimeError when a plan since the buffers were allocated had more keys than
        ``capacity`` (reads one int back from the device: call it off the hot path)."""
        dropped = int(self.overflow.item())
        if dropped > 0:
            raise RuntimeError(
                f"vllm-aiter-mla: a decode step had {dropped} keys more than the plan buffers hold "
                f"({self.capacity}); their kv_indptr was clamped, so some requests attended to fewer keys. "
                "This is a bug in the buffers' sizing: please report it with --max-num-seqs and --max-model-len."
            )


@dataclass(frozen=True)
class PlanWorkspace:
    """Scratch space of :func:`plan_decode_into` (flat, so leading slices are
    contiguous views). With one, planning allocates nothing; without one, the same
    scratch is taken from the allocator at the size of the current batch."""

    scan: torch.Tensor  # int32 [4 * max_reqs]
    indptr64: torch.Tensor  # int64 [max_reqs + 1]
    block_base: torch.Tensor  # int32 [max_reqs * max_blocks]
    slots: torch.Tensor  # int32 [max_reqs * max_slots]
    dest: torch.Tensor  # int64 [max_reqs * max_slots] (scatter index)
    past_end: torch.Tensor  # bool  [max_reqs * max_slots]

    @classmethod
    def allocate(cls, buffers: DecodePlanBuffers) -> "PlanWorkspace":
        device = buffers.kv_indices.device
        n = buffers.max_reqs * buffers.max_blocks * buffers.block_size
        return cls(
            scan=torch.zeros(4 * buffers.max_reqs, dtype=_INT, device=device),
            indptr64=torch.zeros(buffers.max_reqs + 1, dtype=torch.int64, device=device),
            block_base=torch.empty(buffers.max_reqs * buffers.max_blocks, dtype=_INT, device=device),
            slots=torch.empty(n, dtype=_INT, device=device),
            dest=torch.empty(n, dtype=torch.int64, device=device),
            past_end=torch.empty(n, dtype=torch.bool, device=device),
        )


def _scratch(workspace: PlanWorkspace | None, name: str, n: int, dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
    if workspace is None:
        return torch.empty(n, dtype=dtype, device=device)
    return getattr(workspace, name)[:n]


def plan_decode_into(
    buffers: DecodePlanBuffers,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor | None,
    workspace: PlanWorkspace | None = None,
    *,
    uniform_qlen: int | None = None,
) -> DecodePlan:
    """Write the plan into ``buffers`` and return views of them.

    With ``uniform_qlen`` (the layout AITER's decode needs) ``query_start_loc`` is not
    read: ``qo_indptr`` becomes ``[0, q, 2q, ...]`` and every sequence length is raised
    to at least ``q``, so padding rows of a CUDA-graph batch (query length 0, sequence
    length 0) become ordinary rows whose output is dropped.

    Inputs are int32 (as vLLM keeps them); other integer dtypes work but cost a cast.

    No host synchronisation: shapes come from the inputs' shapes (never their
    values), so the same call can be captured once in a CUDA graph and replayed with
    new batch contents. ``block_table`` may be narrowed to the blocks the longest
    request needs (less work); it must cover every request's length.
    ``kv_indices`` is returned whole (``[capacity + 1]``); only its first
    ``kv_indptr[-1]`` entries are meaningful, which is what the kernel reads.
    """
    bs = buffers.block_size
    if uniform_qlen is None:
        if query_start_loc is None:
            raise ValueError("plan_decode_into needs query_start_loc or uniform_qlen")
        num_reqs = _check_inputs(block_table, seq_lens, query_start_loc, bs)
    else:
        num_reqs = _check_inputs(block_table, seq_lens, buffers.req_ids[: block_table.shape[0] + 1], bs)
    num_blocks = block_table.shape[1]
    if num_reqs > buffers.max_reqs or num_blocks > buffers.max_blocks:
        raise ValueError(
            f"batch ({num_reqs} requests x {num_blocks} blocks) exceeds the plan buffers "
            f"({buffers.max_reqs} x {buffers.max_blocks}); allocate larger DecodePlanBuffers"
        )
    num_slots = num_blocks * bs
    n = num_reqs * num_slots
    device = block_table.device

    if uniform_qlen is None:
        buffers.qo_indptr[: num_reqs + 1].copy_(query_start_loc)
    else:
        torch.mul(buffers.req_ids[: num_reqs + 1], uniform_qlen, out=buffers.qo_indptr[: num_reqs + 1])
    # Key offsets (kv_indptr[0] stays 0), and an int64 copy for the scatter index.
    # The scan runs along dim 1 of a [2, n] tensor: a 1-D cumsum on CUDA takes
    # temporary storage from the allocator, a batched one does not.
    kv_indptr = buffers.kv_indptr[: num_reqs + 1]
    scan = _scratch(workspace, "scan", 4 * num_reqs, _INT, device)
    scan_in = scan[: 2 * num_reqs].view(2, num_reqs)
    scan_out = scan[2 * num_reqs :].view(2, num_reqs)
    scan_in[0].copy_(seq_lens)
    if uniform_qlen is not None:
        scan_in[0].clamp_(min=uniform_qlen)
    scan_in[1].zero_()
    torch.cumsum(scan_in, 1, dtype=_INT, out=scan_out)
    if num_reqs:
        # keys past capacity: counted in overflow (scan_in[1] is free scratch after the scan), and
        # no kv_indptr entry points past capacity
        excess = scan_in[1, :1]
        torch.sub(scan_out[0, num_reqs - 1 :], buffers.capacity_t, out=excess)
        torch.maximum(buffers.overflow, excess, out=buffers.overflow)
    torch.minimum(scan_out[0], buffers.capacity_t, out=kv_indptr[1:])
    indptr64 = _scratch(workspace, "indptr64", num_reqs + 1, torch.int64, device)
    indptr64.copy_(kv_indptr)

    # slot[b, p] = block_table[b, p // bs] * bs + p % bs, built block by block.
    block_base = _scratch(workspace, "block_base", num_reqs * num_blocks, _INT, device)
    torch.mul(block_table, buffers.block_size_t, out=block_base.view(num_reqs, num_blocks))
    slots = _scratch(workspace, "slots", n, _INT, device)
    torch.add(
        block_base.view(num_reqs, num_blocks, 1), buffers.offsets, out=slots.view(num_reqs, num_blocks, bs)
    )

    # Destination of slot (b, p) in kv_indices: kv_indptr[b] + p, or the spare
    # entry at `capacity` when p is past the request's length (dest >= kv_indptr[b+1]).
    dest = _scratch(workspace, "dest", n, torch.int64, device)
    torch.add(indptr64[:num_reqs].unsqueeze(1), buffers.positions[:num_slots], out=dest.view(num_reqs, num_slots))
    past_end = _scratch(workspace, "past_end", n, torch.bool, device)
    torch.ge(dest.view(num_reqs, num_slots), indptr64[1:].unsqueeze(1), out=past_end.view(num_reqs, num_slots))
    dest.masked_fill_(past_end, buffers.capacity)
    buffers.kv_indices.scatter_(0, dest, slots)
    return buffers.plan(num_reqs)


def decode_query_len(query_start_loc_cpu: torch.Tensor, num_decode_tokens: int) -> int:
    """The decode rows' own query length, from the decode slice of vLLM's host
    ``query_start_loc`` (not the builder's ``max_query_len``, which also counts prefill rows
    up to the reorder threshold). Rows of length 0 are CUDA-graph padding; the batch must be
    laid out as ``num_reqs x qlen`` query rows (AITER places request b's queries at
    ``b * max_seqlen_q``)."""
    lens = (query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]).tolist()
    live = [n for n in lens if n > 0]
    if not live:
        raise ValueError("decode batch without query rows")
    qlen = max(live)
    if any(n != qlen for n in live) or num_decode_tokens != len(lens) * qlen:
        raise ValueError(
            f"decode rows with query lengths {sorted(set(lens))} in {num_decode_tokens} tokens cannot be laid out "
            f"as {len(lens)} x {qlen} rows, which AITER's MLA decode needs"
        )
    return qlen


@dataclass(frozen=True)
class DecodeStep:
    plan: DecodePlan
    max_seqlen_q: int


def plan_decode_step(
    buffers: DecodePlanBuffers,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    qlen: int,
    max_seq_len: int,
    workspace: PlanWorkspace | None = None,
) -> DecodeStep:
    """One decode step with the PyTorch planner (the CPU path): the uniform plan for query
    length ``qlen`` (:func:`decode_query_len`). ``max_seq_len`` (known on the host)
    narrows the block table."""
    bs = buffers.block_size
    num_blocks = min(block_table.shape[1], -(-max(max_seq_len, qlen, 1) // bs))
    plan = plan_decode_into(buffers, block_table[:, :num_blocks], seq_lens, None, workspace, uniform_qlen=qlen)
    return DecodeStep(plan=plan, max_seqlen_q=qlen)
