"""Decode planning as one fused Triton kernel (GPU: ROCm or CUDA), cost proportional to the
batch's total KV tokens.

Same result as :func:`planning.plan_decode_into` with ``uniform_qlen`` (the layout AITER's
decode takes), written into the same :class:`planning.DecodePlanBuffers`:

* ``qo_indptr[i] = i * qlen``
* ``kv_indptr``: prefix sum of ``max(seq_len, qlen)`` (padding rows of a CUDA-graph batch,
  sequence length 0, get ``qlen`` keys)
* ``kv_indices[t]`` for every key ``t < kv_indptr[B]``: the slot of that key,
  ``block_table[b, p // block_size] * block_size + p % block_size``

One launch, nothing allocated and nothing read back on the host (so the call can also be
captured in a CUDA graph). The host picks one of four ways from the batch's shape (requests
and ``max_seq_len``, a hint for speed only: the plan is the same for any lengths):

* Rows (requests of at most ``ROWS_MAX_LEN`` keys): program ``p`` plans a group of
  consecutive requests as a [requests, positions] tile, so each key's request is its row and
  nothing is searched; the block-table entries of the first positions are loaded at once with
  the lengths (they do not depend on them), so a step of a few thousand keys waits for one
  memory round trip, not three. The group's first key is one sum over the lengths before it.
* Grouped (short requests, at most ``GROUP_MAX_KEYS`` keys per program): program ``p`` plans
  a group of consecutive requests. Their first key is one sum over the lengths before them;
  the group's prefix sum gives ``kv_indptr`` for its requests, and each key's request is a
  binary search over the group's ends (``log2(group)`` gather steps). No program scans the
  whole batch, so a step of a few thousand keys costs about one short launch.
* Tile walk (long requests): every program computes the prefix sum of all lengths once, in
  registers (a batch holds at most ``MAX_REQS`` requests; program 0 writes it out). Requests
  shorter than a tile are written as in the rows kernel: groups of them as [requests,
  positions] tiles, dealt out round-robin, their first keys from the prefix sum (a program's
  first group is loaded with the lengths). The batch's tiles of ``block_t`` keys are dealt out
  as contiguous ranges, one per program, and walked with a cursor: the first long request
  that ends after the tile's first key. A tile holds keys of at most two long requests, since
  each is at least a tile long, so no key's request is searched for: tiles inside the cursor's
  request are written with one row and one start, ``FAST_TILES`` at a time; a tile where it
  ends takes the rest from the next long request (the next two lengths loaded at once, then
  ``LONG_WINDOW`` at a time past runs of short requests), leaving the short requests' keys to
  the rows; a tile with no key of a long request is skipped. The cursor at a program's first
  tile and its first group's first key are one reduction over the registers.
* Direct (few long requests in a small batch, about one tile per program): each key's request
  by a binary search over the whole prefix sum.

Work: ``O(programs x requests + total keys)``, independent of the block table's width
(``max_model_len``); memory traffic is the index array written plus the block-table
entries and the lengths read (the rows kernel reads the entries of its first positions for
every request of a group, up to the table's width, whether the request reaches them or not;
the walk reads the lengths after a long request until the next long one).
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl

from .planning import DecodePlan, DecodePlanBuffers

# Launch shape, measured on an H200 (backend/bench/planning.py).
BLOCK_T = 1024  # keys per tile, the most
MIN_BLOCK_T = 256  # keys per tile, the fewest (small batches)
FAST_TILES = 2  # tiles written at once where one request holds them all
WALK_MAX_GROUP = 4  # tile walk: short requests per group, the most
WALK_ROW_ELEMS = 1024  # tile walk: (request, position) pairs per tile of short requests
LONG_WINDOW = 16  # tile walk: lengths read at once past two short requests, for the next long one
PROGRAMS_PER_SM = 8
NUM_WARPS = 4
GROUPED_NUM_WARPS = 8
GROUP_KEYS = 512  # grouped kernel: requests per program chosen for at least this many keys
GROUP_MAX_KEYS = 8192  # grouped kernel: only where a program has at most this many keys
MAX_GROUP = 1024
MAX_CHUNK = 2048
MAX_REQS = 4096  # the prefix sum of all sequence lengths lives in registers
ROWS_MAX_LEN = 1024  # rows kernel: for batches whose longest request has at most this many keys
ROW_ELEMS = 4096  # rows kernel: (request, position) pairs per tile
ROWS_MAX_COLS = 1024  # rows kernel: positions per tile, the most
ROWS_MIN_PROGRAMS = 64  # rows kernel: groups made smaller until the batch has about this many
ROWS_NUM_WARPS = 8
ROWS_WIDE_COLS = 256  # rows kernel: tiles of at least this many positions run with 4 warps
WARM_UP_MAX_THREADS = 16  # warm_up(): kernels compiled at once, the most
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
def _add_pair(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _min3_add(a0, a1, a2, a3, b0, b1, b2, b3):
    return tl.minimum(a0, b0), tl.minimum(a1, b1), tl.minimum(a2, b2), a3 + b3


@triton.jit
def _long_after(r, lens, ends, key, before, BLOCK_T: tl.constexpr):
    """The first long request (at least BLOCK_T keys) that ends after ``key``: (its index, its
    first key, its end; none: starts and ends after every key), and the keys of the requests
    before request ``before``: one reduction over the batch's lengths and ends in registers."""
    after = (lens >= BLOCK_T) & (ends > key)
    return tl.reduce((tl.where(after, r, _NO_END), tl.where(after, ends - lens, _NO_END),
                      tl.where(after, ends, _NO_END), tl.where(r < before, lens, 0)), 0, _min3_add)


@triton.jit
def _write_short_rows(kv_indices_ptr, block_table_ptr, block_table_stride, req, req_lens, offset, total,
                      BLOCK_T: tl.constexpr, COLS: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Write the keys of the requests ``req`` (lengths ``req_lens``, consecutive, the first
    starting at key ``offset``) that are shorter than BLOCK_T, as [requests, COLS] tiles."""
    short_lens = tl.where(req_lens < BLOCK_T, req_lens, 0)
    req_starts = (offset + tl.cumsum(req_lens, 0) - req_lens)[:, None]
    rows = (block_table_ptr + req.to(tl.int64) * block_table_stride)[:, None]
    col = tl.arange(0, COLS)[None, :]
    for c0 in range(0, tl.max(short_lens, 0), COLS):
        pos = c0 + col
        dest = req_starts + pos
        valid = (pos < short_lens[:, None]) & (dest < total)
        block = tl.load(rows + pos // BLOCK_SIZE, mask=valid, other=0)
        tl.store(kv_indices_ptr + dest, block * BLOCK_SIZE + pos % BLOCK_SIZE, mask=valid)


@triton.jit
def _lens_of(seq_lens_ptr, first, num_reqs, qlen, COUNT: tl.constexpr):
    """Requests first .. first + COUNT - 1 and their keys, max(seq_len, qlen) (past the batch: 0)."""
    req = first + tl.arange(0, COUNT)
    in_batch = req < num_reqs
    lens = tl.load(seq_lens_ptr + req, mask=in_batch, other=0)
    return req, tl.where(in_batch, tl.maximum(lens, qlen), 0)


@triton.jit
def _next_long(seq_lens_ptr, req, start, num_reqs, qlen, BLOCK_T: tl.constexpr, WINDOW: tl.constexpr):
    """The first long request (at least BLOCK_T keys) at or after ``req``, which starts at key
    ``start``: (its index, its first key, its end; none: starts and ends after every key). The
    next two lengths are loaded at once; past them, WINDOW lengths at a time."""
    first_in = req < num_reqs
    second_in = req + 1 < num_reqs
    first_len = tl.load(seq_lens_ptr + req, mask=first_in, other=0)
    second_len = tl.load(seq_lens_ptr + req + 1, mask=second_in, other=0)
    first_len = tl.where(first_in, tl.maximum(first_len, qlen), 0)
    second_len = tl.where(second_in, tl.maximum(second_len, qlen), 0)
    length = first_len
    if first_len < BLOCK_T:
        req += 1
        start += first_len
        length = second_len
        if second_len < BLOCK_T:
            req += 1
            start += second_len
            length = 0
            w = tl.arange(0, WINDOW)
            found = WINDOW
            while (found == WINDOW) & (req < num_reqs):
                _, lens = _lens_of(seq_lens_ptr, req, num_reqs, qlen, WINDOW)
                found = tl.min(tl.where(lens >= BLOCK_T, w, WINDOW), 0)
                before, length = tl.reduce((tl.where(w < found, lens, 0), tl.where(w == found, lens, 0)), 0,
                                           _add_pair)
                start += before
                req += found
    none = length < BLOCK_T  # past the batch: no long request after req
    return req, tl.where(none, _NO_END, start), tl.where(none, _NO_END, start + length)


@triton.jit
def _request_of(ends, key, count, KEYS: tl.constexpr):
    """Per key, the first of ``count`` requests (``ends``: their inclusive prefix sum) that ends after it:
    a binary search, bit_length(count - 1) gather steps."""
    lo = tl.zeros((KEYS,), dtype=tl.int32)
    hi = lo + count - 1
    steps = count - 1
    while steps > 0:
        mid = (lo + hi) >> 1
        after = tl.gather(ends, mid, 0) <= key  # the key lies after request mid
        lo = tl.where(after, mid + 1, lo)
        hi = tl.where(after, hi, mid)
        steps = steps >> 1
    return lo


@triton.jit
def _count_overflow(overflow_ptr, last_end, capacity):
    """Keys past the buffers' capacity (the batch's, or a group's, last end beyond it): the
    largest such count is kept in overflow, for the host to read off the hot path."""
    if last_end > capacity:
        tl.atomic_max(overflow_ptr, last_end - capacity)


# The block table's row stride, the query length and the buffers' capacity are not specialised
# on (Triton would compile again for 1 and for multiples of 16); the request count is (worth
# 20-30% on large batches), so warm_up() compiles each launch shape for 1, a multiple of 16 and
# any other count.
_RUNTIME_INTS = ("block_table_stride", "qlen", "capacity")
_REQUEST_COUNTS = (1, 16, 17)  # one of each class Triton specialises an integer argument on


@triton.jit(do_not_specialize=_RUNTIME_INTS)
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
    overflow_ptr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    GROUP: tl.constexpr,
    COLS: tl.constexpr,
    WINDOW: tl.constexpr,
    DIRECT: tl.constexpr,
    FAST: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)

    # Every program: max(seq_len, qlen) and its inclusive prefix sum (ends), in registers.
    r = tl.arange(0, BLOCK_R)
    in_batch = r < num_reqs
    lens = tl.load(seq_lens_ptr + r, mask=in_batch, other=0)
    if not DIRECT:
        # this program's first group of requests (loaded with the lengths: one round trip)
        group_req, group_lens = _lens_of(seq_lens_ptr, pid * GROUP, num_reqs, qlen, GROUP)
    lens = tl.where(in_batch, tl.maximum(lens, qlen), 0)
    ends = tl.cumsum(lens, 0)
    batch_keys = tl.sum(lens, 0)
    total = tl.minimum(batch_keys, capacity)
    if pid == 0:
        tl.store(kv_indptr_ptr, 0)
        tl.store(kv_indptr_ptr + 1 + r, tl.minimum(ends, capacity), mask=in_batch)
        _count_overflow(overflow_ptr, batch_keys, capacity)
        tl.store(qo_indptr_ptr + r, r * qlen, mask=in_batch)
        tl.store(qo_indptr_ptr + num_reqs, num_reqs * qlen)

    if DIRECT:
        # Small batches (about one tile per program): per key, a binary search over the whole
        # prefix sum (bit_length(num_reqs - 1) gather steps narrow num_reqs candidates to one),
        # with no further reduction. Keys past the batch search as its last key.
        starts = ends - lens
        num_tiles = tl.cdiv(total, BLOCK_T)
        for tile in range(pid, num_tiles, num_programs):
            t0 = tl.multiple_of(tile * BLOCK_T, BLOCK_T)
            t = t0 + tl.arange(0, BLOCK_T)
            lo = _request_of(ends, tl.minimum(t, total - 1), num_reqs, BLOCK_T)
            key_row = block_table_ptr + lo.to(tl.int64) * block_table_stride
            _write_keys(kv_indices_ptr, key_row, t, tl.gather(starts, lo, 0), total, False, BLOCK_SIZE)
    else:
        # Short requests (fewer keys than a tile): GROUP consecutive requests at a time, written
        # as [GROUP, COLS] tiles of (request, position) pairs from one sum over the lengths
        # before them: nothing searched. The groups are dealt out round-robin.
        #
        # Long requests (a tile or more each): the batch's tiles of BLOCK_T keys are dealt out as
        # contiguous ranges, one per program, and walked with a cursor: the first long request
        # that ends after the tile's first key (its index, first key and end). A tile holds keys
        # of at most two long requests (the next one is at least a tile long); the keys of short
        # requests in it are left to the rows, and a tile without keys of long requests is
        # skipped.
        full_batch = batch_keys <= capacity
        num_tiles = tl.cdiv(total, BLOCK_T)
        per_program = tl.cdiv(num_tiles, num_programs)
        tile = pid * per_program
        tile_end = tl.minimum(tile + per_program, num_tiles)
        # The cursor at this program's first tile and the first key of its first group: one
        # reduction.
        cur_req, cur_start, cur_end, offset = _long_after(r, lens, ends, tile * BLOCK_T, pid * GROUP, BLOCK_T)
        if pid * GROUP < num_reqs:
            _write_short_rows(kv_indices_ptr, block_table_ptr, block_table_stride, group_req, group_lens, offset,
                              total, BLOCK_T, COLS, BLOCK_SIZE)
        for group in range(pid + num_programs, tl.cdiv(num_reqs, GROUP), num_programs):  # a small grid
            req, req_lens = _lens_of(seq_lens_ptr, group * GROUP, num_reqs, qlen, GROUP)
            _write_short_rows(kv_indices_ptr, block_table_ptr, block_table_stride, req, req_lens,
                              tl.sum(tl.where(r < group * GROUP, lens, 0), 0), total, BLOCK_T, COLS, BLOCK_SIZE)
        while tile < tile_end:
            t0 = tl.multiple_of(tile * BLOCK_T, BLOCK_T)
            if cur_end <= t0:  # the cursor's request ended with the tile before
                cur_req, cur_start, cur_end = _next_long(seq_lens_ptr, cur_req + 1, cur_end, num_reqs, qlen,
                                                         BLOCK_T, WINDOW)
            if cur_start >= t0 + BLOCK_T:
                # No key of a long request in this tile: on to the tile of the next one.
                tile = tl.minimum(tl.maximum(tile + 1, cur_start // BLOCK_T), tile_end)
            elif (cur_start <= t0) & (cur_end >= t0 + FAST * BLOCK_T) & (tile + FAST <= tile_end):
                # Several tiles inside the cursor's request: written at once (more stores in
                # flight per program).
                t_fast = t0 + tl.arange(0, FAST * BLOCK_T)
                row = block_table_ptr + cur_req.to(tl.int64) * block_table_stride
                if full_batch:
                    _write_keys(kv_indices_ptr, row, t_fast, cur_start, total, True, BLOCK_SIZE)
                else:
                    _write_keys(kv_indices_ptr, row, t_fast, cur_start, total, False, BLOCK_SIZE)
                tile += FAST
            else:
                t = t0 + tl.arange(0, BLOCK_T)
                if (cur_start <= t0) & (cur_end >= t0 + BLOCK_T):
                    # The whole tile lies in the cursor's request: one row, one start.
                    row = block_table_ptr + cur_req.to(tl.int64) * block_table_stride
                    if full_batch:
                        _write_keys(kv_indices_ptr, row, t, cur_start, total, True, BLOCK_SIZE)
                    else:
                        _write_keys(kv_indices_ptr, row, t, cur_start, total, False, BLOCK_SIZE)
                else:
                    # The cursor's request starts or ends in the tile; the next long request
                    # may start in it too.
                    next_req = cur_req * 0 + _NO_END  # no next long request in the tile
                    next_start = next_req
                    next_end = next_req
                    if cur_end < t0 + BLOCK_T:
                        next_req, next_start, next_end = _next_long(seq_lens_ptr, cur_req + 1, cur_end, num_reqs,
                                                                    qlen, BLOCK_T, WINDOW)
                    in_next = t >= next_start
                    key_row = block_table_ptr + tl.where(in_next, next_req, cur_req).to(tl.int64) \
                        * block_table_stride
                    pos = t - tl.where(in_next, next_start, cur_start)
                    valid = (((t >= cur_start) & (t < cur_end)) | (in_next & (t < next_end))) & (t < total)
                    block = tl.load(key_row + pos // BLOCK_SIZE, mask=valid, other=0)
                    tl.store(kv_indices_ptr + t, block * BLOCK_SIZE + pos % BLOCK_SIZE, mask=valid)
                    if cur_end < t0 + BLOCK_T:
                        cur_req, cur_start, cur_end = next_req, next_start, next_end
                tile += 1


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _plan_grouped_kernel(
    block_table_ptr,
    block_table_stride,
    seq_lens_ptr,
    num_reqs,
    qlen,
    capacity,
    qo_indptr_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    overflow_ptr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    GROUP: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Batches of short requests: program p plans requests p * GROUP .. (p + 1) * GROUP - 1,
    from one sum over the lengths before them, CHUNK keys at a time."""
    pid = tl.program_id(0)
    first = pid * GROUP
    r = tl.arange(0, BLOCK_R)
    before = r < first  # first < num_reqs: the grid has one program per group
    lens = tl.load(seq_lens_ptr + r, mask=before, other=0)
    offset = tl.sum(tl.where(before, tl.maximum(lens, qlen), 0), 0)
    req, lens = _lens_of(seq_lens_ptr, first, num_reqs, qlen, GROUP)
    in_batch = req < num_reqs
    ends = tl.cumsum(lens, 0)  # of the group's keys
    starts = ends - lens
    tl.store(kv_indptr_ptr + 1 + req, tl.minimum(offset + ends, capacity), mask=in_batch)
    _count_overflow(overflow_ptr, offset + tl.max(ends, 0), capacity)
    tl.store(qo_indptr_ptr + req, req * qlen, mask=in_batch)
    if pid == 0:
        tl.store(kv_indptr_ptr, 0)
        tl.store(qo_indptr_ptr + num_reqs, num_reqs * qlen)
    count = tl.sum(lens, 0)
    for c0 in range(0, count, CHUNK):
        k = c0 + tl.arange(0, CHUNK)  # key of the group
        if GROUP == 1:
            pos = k
            row = block_table_ptr + first.to(tl.int64) * block_table_stride
        else:
            # Per key, a binary search over the group's ends (log2(GROUP) gather steps narrow
            # GROUP candidates to one; rows past the batch end after every key).
            lo = _request_of(ends, tl.minimum(k, count - 1), GROUP, CHUNK)
            pos = k - tl.gather(starts, lo, 0)
            row = block_table_ptr + (first + lo).to(tl.int64) * block_table_stride
        t = offset + k
        valid = (k < count) & (t < capacity)
        block = tl.load(row + pos // BLOCK_SIZE, mask=valid, other=0)
        tl.store(kv_indices_ptr + t, block * BLOCK_SIZE + pos % BLOCK_SIZE, mask=valid)


@triton.jit(do_not_specialize=_RUNTIME_INTS + ("width",))
def _plan_rows_kernel(
    block_table_ptr,
    block_table_stride,
    width,
    seq_lens_ptr,
    num_reqs,
    qlen,
    capacity,
    qo_indptr_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    overflow_ptr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    GROUP: tl.constexpr,
    COLS: tl.constexpr,
):
    """Batches of short requests: program p plans requests p * GROUP .. (p + 1) * GROUP - 1 as
    a [GROUP, COLS] tile of (request, position) pairs, COLS positions at a time up to the
    group's longest request: each key's request is its row, so nothing is searched. The
    group's first key is one sum over the lengths before it.

    Every load of the first COLS positions is issued before any result is waited for: the
    block-table entries of the first tile do not depend on the lengths (columns past the
    table's ``width`` read its last column; the stores past a request's keys are masked), so
    one step costs one memory round trip, not three."""
    pid = tl.program_id(0)
    first = pid * GROUP
    req = first + tl.arange(0, GROUP)
    in_batch = req < num_reqs
    rows = (block_table_ptr + req.to(tl.int64) * block_table_stride)[:, None]
    pos = tl.arange(0, COLS)[None, :]
    lens = tl.load(seq_lens_ptr + req, mask=in_batch, other=0)
    r = tl.arange(0, BLOCK_R)
    before = r < first  # first < num_reqs: the grid has one program per group
    lens_before = tl.load(seq_lens_ptr + r, mask=before, other=0)
    block = tl.load(rows + tl.minimum(pos // BLOCK_SIZE, width - 1), mask=in_batch[:, None], other=0)
    lens = tl.where(in_batch, tl.maximum(lens, qlen), 0)
    group_ends = tl.cumsum(lens, 0)
    offset = tl.sum(tl.where(before, tl.maximum(lens_before, qlen), 0), 0)
    ends = offset + group_ends
    starts = (ends - lens)[:, None]
    row_lens = lens[:, None]
    t = starts + pos
    tl.store(kv_indices_ptr + t, block * BLOCK_SIZE + pos % BLOCK_SIZE, mask=(pos < row_lens) & (t < capacity))
    tl.store(kv_indptr_ptr + 1 + req, tl.minimum(ends, capacity), mask=in_batch)
    _count_overflow(overflow_ptr, tl.max(ends, 0), capacity)
    tl.store(qo_indptr_ptr + req, req * qlen, mask=in_batch)
    if pid == 0:
        tl.store(kv_indptr_ptr, 0)
        tl.store(qo_indptr_ptr + num_reqs, num_reqs * qlen)
    # Requests longer than COLS (the host's max_seq_len hint sizes COLS; a hint can be low).
    for c0 in range(COLS, tl.max(lens, 0), COLS):
        pos_c = c0 + pos
        t = starts + pos_c
        valid = (pos_c < row_lens) & (t < capacity)
        block = tl.load(rows + pos_c // BLOCK_SIZE, mask=valid, other=0)
        tl.store(kv_indices_ptr + t, block * BLOCK_SIZE + pos_c % BLOCK_SIZE, mask=valid)


@functools.cache
def _num_programs(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count * PROGRAMS_PER_SM


def launch_shape(programs: int, most_keys: int | None, num_reqs: int) -> tuple[int, int, bool, int]:
    """(tile size, programs, direct search, short requests per group) of the tile walk for a
    batch of ``num_reqs`` requests and at most ``most_keys`` keys (None: unknown). Batches of
    at most one tile per program search each key directly."""
    if most_keys is None:
        block_t, grid, direct = BLOCK_T, programs, False
    else:
        block_t = MIN_BLOCK_T
        while block_t < BLOCK_T and block_t * 2 * programs <= most_keys:
            block_t *= 2
        tiles = -(-most_keys // block_t)
        grid, direct = max(1, min(programs, tiles)), tiles <= programs
    group = 1 if direct else min(triton.next_power_of_2(-(-max(num_reqs, 1) // grid)), WALK_MAX_GROUP)
    return block_t, grid, direct, group


def grouped_shape(programs: int, num_reqs: int, longest: int | None) -> tuple[int, int, int] | None:
    """(requests per program, keys per chunk, programs) of the grouped kernel for a batch of
    requests of at most ``longest`` keys, or None where it does not pay (long requests)."""
    if longest is None:
        return None
    group = max(triton.next_power_of_2(-(-num_reqs // programs)), triton.next_power_of_2(-(-GROUP_KEYS // longest)))
    group = min(group, triton.next_power_of_2(max(num_reqs, 1)), MAX_GROUP)
    if group * longest > GROUP_MAX_KEYS:
        return None
    return group, min(triton.next_power_of_2(group * longest), MAX_CHUNK), max(1, -(-num_reqs // group))


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
    ``max_seq_len`` (host), if given, sizes the tiles and the grid to the batch (speed only:
    the plan is the same for any lengths, e.g. in a graph replayed with others). The buffers'
    ``capacity`` should hold the step's keys (the builder sizes it ``max_num_seqs x
    max_model_len``, which no batch can exceed); where it does not, ``kv_indptr`` is clamped
    to it and ``buffers.overflow`` records the keys dropped.
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
    if num_reqs and block_table.shape[1] == 0:
        raise ValueError("block_table has no columns: every request has at least one block")
    longest = None if max_seq_len is None else max(max_seq_len, qlen)
    shape = launch_shape_of(_num_programs(block_table.device.index or 0), num_reqs, longest)
    return _launch(buffers, block_table, seq_lens, num_reqs, qlen, shape)


def rows_shape(num_reqs: int, longest: int | None) -> tuple[int, int, int] | None:
    """(requests per program, positions per tile, programs) of the rows kernel for a batch of
    requests of at most ``longest`` keys, or None where it does not pay (long requests)."""
    if longest is None or longest > ROWS_MAX_LEN:
        return None
    cols = min(triton.next_power_of_2(longest), ROWS_MAX_COLS)
    group = min(max(1, ROW_ELEMS // cols), triton.next_power_of_2(max(num_reqs, 1)), MAX_REQS,
                triton.next_power_of_2(-(-num_reqs // ROWS_MIN_PROGRAMS)))
    return group, cols, max(1, -(-num_reqs // group))


def launch_shape_of(programs: int, num_reqs: int, longest: int | None) -> tuple:
    """The launch a batch gets: ("rows", group, cols, programs), ("grouped", group, chunk,
    programs) or ("walk", block_t, direct, group, programs)."""
    rows = rows_shape(num_reqs, longest)
    if rows is not None:
        return ("rows", *rows)
    grouped = grouped_shape(programs, num_reqs, longest)
    if grouped is not None:
        return ("grouped", *grouped)
    block_t, grid, direct, group = launch_shape(programs, None if longest is None else num_reqs * longest, num_reqs)
    return ("walk", block_t, direct, group, grid)


def _launch(buffers: DecodePlanBuffers, block_table, seq_lens, num_reqs: int, qlen: int, shape: tuple,
            compile_only: bool = False) -> DecodePlan:
    """Launch the planner's kernel for ``shape``; ``compile_only``: compile it (or take it from
    Triton's caches) without launching it."""
    args = (block_table, block_table.stride(0), seq_lens, num_reqs, qlen, buffers.capacity,
            buffers.qo_indptr, buffers.kv_indptr, buffers.kv_indices, buffers.overflow)
    sizes = {"BLOCK_SIZE": buffers.block_size, "BLOCK_R": triton.next_power_of_2(buffers.max_reqs)}

    def run(kernel, programs: int):
        grid = (programs,)
        return functools.partial(kernel.warmup, grid=grid) if compile_only else kernel[grid]

    if shape[0] == "rows":
        _, group, cols, programs = shape
        run(_plan_rows_kernel, programs)(block_table, block_table.stride(0), block_table.shape[1], *args[2:],
                                         **sizes, GROUP=group, COLS=cols,
                                         num_warps=4 if cols >= ROWS_WIDE_COLS else ROWS_NUM_WARPS)
    elif shape[0] == "grouped":
        _, group, chunk, programs = shape
        run(_plan_grouped_kernel, programs)(*args, **sizes, GROUP=group, CHUNK=chunk, num_warps=GROUPED_NUM_WARPS)
    else:
        _, block_t, direct, group, programs = shape
        run(_plan_kernel, programs)(
            *args,
            **sizes,
            BLOCK_T=block_t,
            GROUP=group,
            COLS=min(block_t, WALK_ROW_ELEMS // group),
            WINDOW=LONG_WINDOW,
            DIRECT=direct,
            FAST=FAST_TILES,
            num_warps=NUM_WARPS,
        )
    return buffers.plan(num_reqs)


def _boundaries(limit: int, *scales: int) -> set[int]:
    """1..limit around every power of two (times each scale): where next_power_of_2 and the
    launch-shape thresholds can change."""
    out = {1, limit}
    for scale in (1, *scales):
        power = 1
        while power * scale <= 2 * limit:
            out.update(v for v in (power * scale - 1, power * scale, power * scale + 1) if 1 <= v <= limit)
            power *= 2
    return out


def launch_shapes(programs: int, max_reqs: int, max_len: int) -> list[tuple]:
    """Every launch shape (kernel and constexprs) a batch of at most ``max_reqs`` requests of at
    most ``max_len`` keys each can get, with any ``max_seq_len`` hint or none: what warm_up()
    compiles. The grid size is left out (it compiles nothing)."""
    found = {launch_shape_of(programs, n, None)[:-1] for n in (1, max_reqs)}
    lens = _boundaries(max_len, GROUP_KEYS, GROUP_MAX_KEYS, MIN_BLOCK_T, BLOCK_T, ROWS_MAX_LEN, ROWS_MAX_COLS)
    for n in _boundaries(max_reqs, programs):
        for longest in lens:
            found.add(launch_shape_of(programs, n, longest)[:-1])
    # the tile walk's tile sizes: every one, searched directly or walked (groups of one short
    # request)
    block_t = MIN_BLOCK_T
    while block_t <= BLOCK_T:
        found.update({("walk", block_t, True, 1), ("walk", block_t, False, 1)})
        block_t *= 2
    return sorted(found, key=repr)


def _async_compile_mode():
    """Triton's AsyncCompileMode (kernels compiled in an executor while the caller goes on),
    or None where this Triton has none."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode  # noqa: PLC0415
    except ImportError:
        return None
    return AsyncCompileMode


def compile_in_threads() -> bool:
    """Whether this Triton compiles kernels in threads (its AsyncCompileMode)."""
    return _async_compile_mode() is not None


def compile_threads(requested: int | None = None) -> int:
    """How many kernels warm_up() compiles at once: ``requested``, or (None) one per CPU this
    process may run on, at most WARM_UP_MAX_THREADS; 1 where this Triton cannot compile in
    threads."""
    if not compile_in_threads():
        return 1
    if requested is not None:
        return requested
    return max(1, min(len(os.sched_getaffinity(0)), WARM_UP_MAX_THREADS))


def warm_up(buffers: DecodePlanBuffers, max_len: int, threads: int | None = None) -> int:
    """Compile every launch shape of the planner for these buffers before the first request
    (Triton compiles a kernel at its first launch): returns how many shapes were launched. The
    kernels are compiled ``threads`` at a time (None: :func:`compile_threads`), then each is
    launched once; the buffers are written with plans of requests of one key. A compile error
    is raised."""
    device = buffers.kv_indices.device
    counts = [n for n in _REQUEST_COUNTS if n <= buffers.max_reqs]
    block_table = torch.zeros((max(counts), 1), dtype=torch.int32, device=device)
    seq_lens = torch.ones(max(counts), dtype=torch.int32, device=device)
    shapes = launch_shapes(_num_programs(device.index or 0), buffers.max_reqs, max_len)
    # the rows and grouped kernels: a program per group
    launches = [(n, (*shape, -(-n // shape[1]) if shape[0] in ("rows", "grouped") else 1))
                for shape in shapes for n in counts]
    threads = compile_threads() if threads is None else threads
    mode = _async_compile_mode()
    if threads > 1 and mode is not None:
        # Leaving the mode waits for every compile (and raises the first error).
        with ThreadPoolExecutor(threads, thread_name_prefix="plan-compile") as pool, mode(pool):
            for n, shape in launches:
                _launch(buffers, block_table[:n], seq_lens[:n], n, 1, shape, compile_only=True)
    for n, shape in launches:
        _launch(buffers, block_table[:n], seq_lens[:n], n, 1, shape)
    return len(shapes)
