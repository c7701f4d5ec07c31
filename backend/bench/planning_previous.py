"""The Triton decode planner as it was before the walk planned short requests as rows and
walked the long requests' keys alone (``vllm_aiter_mla.planning_triton`` at that point,
unchanged but for this docstring and the import): ``backend/bench/planning.py`` times it beside
the current planner. Not used by the backend.

Decode planning as one fused Triton kernel (GPU: ROCm or CUDA), cost proportional to the
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
  registers (a batch holds at most ``MAX_REQS`` requests; program 0 writes it out), deals the
  batch's tiles of ``block_t`` keys out as contiguous ranges, one per program, and walks its
  range with a cursor (the request holding the next key, its start and its end). Tiles inside
  the cursor's request are written with one block-table row and one start, ``FAST_TILES`` at a
  time while the request holds them all; a tile that holds one or two request boundaries, the
  next one or two requests holding the rest of it, takes each key's row and start from those
  requests (their lengths loaded at once, nothing searched); a tile that holds more boundaries
  reads the next ``SMALL_WINDOW`` lengths (or ``MID_WINDOW`` at a time while the tile spans
  more), takes their prefix sum from the cursor and finds each key's request by a binary
  search in that window (``ceil(log2(span + 1))`` gather steps), which also moves the cursor
  on. No reduction over all requests per tile.
* Direct (few long requests in a small batch, about one tile per program): each key's request
  by a binary search over the whole prefix sum.

Work: ``O(programs x requests + total keys)``, independent of the block table's width
(``max_model_len``); memory traffic is the index array written plus the block-table
entries and the lengths read (the rows kernel reads the entries of its first positions for
every request of a group, up to the table's width, whether the request reaches them or not).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from vllm_aiter_mla.planning import DecodePlan, DecodePlanBuffers

# Launch shape, measured on an H200 (backend/bench/planning.py).
BLOCK_T = 1024  # keys per tile, the most
MIN_BLOCK_T = 256  # keys per tile, the fewest (small batches)
SMALL_WINDOW = 16  # requests read first at a tile that holds request boundaries
FAST_TILES = 2  # tiles written at once where one request holds them all
MID_WINDOW = 256  # requests read at once where the small window ends before the tile does
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
def _cursor_combine(count_a, start_a, end_a, count_b, start_b, end_b):
    return count_a + count_b, tl.maximum(start_a, start_b), tl.minimum(end_a, end_b)


@triton.jit
def _cursor(ends, key, start_before):
    """(requests that end at or before key, the last such end or start_before, the first end
    after key) over ``ends``: one reduction for the three."""
    done = ends <= key
    return tl.reduce((done.to(tl.int32), tl.where(done, ends, start_before), tl.where(done, _NO_END, ends)), 0,
                     _cursor_combine)


@triton.jit
def _end_of(seq_lens_ptr, req, start, num_reqs, qlen):
    """End of request ``req`` that starts at ``start`` (past the batch: after every key)."""
    length = tl.load(seq_lens_ptr + req, mask=req < num_reqs, other=0)
    return tl.where(req < num_reqs, start + tl.maximum(length, qlen), _NO_END)


@triton.jit
def _two_ends(seq_lens_ptr, req, start, num_reqs, qlen):
    """Ends of requests ``req`` and ``req + 1`` (request req starts at ``start``; past the
    batch: after every key), both lengths loaded at once."""
    length = tl.load(seq_lens_ptr + req, mask=req < num_reqs, other=0)
    length_after = tl.load(seq_lens_ptr + req + 1, mask=req + 1 < num_reqs, other=0)
    end = tl.where(req < num_reqs, start + tl.maximum(length, qlen), _NO_END)
    return end, tl.where(req + 1 < num_reqs, end + tl.maximum(length_after, qlen), _NO_END)


@triton.jit
def _window(seq_lens_ptr, req, req_start, num_reqs, qlen, WINDOW: tl.constexpr):
    """Ends and starts of requests req .. req + WINDOW - 1 (request req starts at req_start);
    rows past the batch end after every key."""
    rq = req + tl.arange(0, WINDOW)
    in_batch = rq < num_reqs
    lens = tl.load(seq_lens_ptr + rq, mask=in_batch, other=0)
    lens = tl.where(in_batch, tl.maximum(lens, qlen), 0)
    ends = req_start + tl.cumsum(lens, 0)
    starts = ends - lens
    return tl.where(in_batch, ends, _NO_END), starts


@triton.jit
def _write_window_tile(kv_indices_ptr, block_table_ptr, block_table_stride, seq_lens_ptr, num_reqs, qlen,
                       total, t, t_last, req, req_start, ends, starts, span, full, last,
                       BLOCK_T: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Write a tile whose keys lie in requests req .. req + span (window ends/starts from req);
    return the cursor (request, start, end) of the key after the tile (unless it is the
    program's last)."""
    # Per key, the number of window requests that end at or before it: a binary search in
    # [0, span] (one gather per step; bit_length(span) steps narrow span + 1 candidates to
    # one). Keys past the batch (last tile) search as its last key.
    key = tl.minimum(t, t_last)
    lo = tl.zeros((BLOCK_T,), dtype=tl.int32)
    hi = lo + span
    steps = span
    while steps > 0:
        mid = (lo + hi) >> 1
        after = tl.gather(ends, mid, 0) <= key  # the key lies after request req + mid
        lo = tl.where(after, mid + 1, lo)
        hi = tl.where(after, hi, mid)
        steps = steps >> 1
    key_start = tl.gather(starts, lo, 0)
    key_row = block_table_ptr + (req + lo).to(tl.int64) * block_table_stride
    if full:
        _write_keys(kv_indices_ptr, key_row, t, key_start, total, True, BLOCK_SIZE)
    else:
        _write_keys(kv_indices_ptr, key_row, t, key_start, total, False, BLOCK_SIZE)
    # Cursor: the request of the next key, from the window when it holds that request's end.
    next_req = req
    next_start = req_start
    next_end = req_start
    if not last:
        done, next_start, next_end = _cursor(ends, t_last + 1, req_start)
        next_req += done
        if next_end == _NO_END:
            next_end = _end_of(seq_lens_ptr, next_req, next_start, num_reqs, qlen)
    return next_req, next_start, next_end


@triton.jit
def _write_window_keys(kv_indices_ptr, block_table_ptr, block_table_stride, t, key_lo, key_end, req, ends, starts,
                       span, BLOCK_T: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Write the keys key_lo <= t < key_end of a tile, which lie in requests req .. req + span
    (window ends/starts from req)."""
    key = tl.minimum(tl.maximum(t, key_lo), key_end - 1)
    lo = tl.zeros((BLOCK_T,), dtype=tl.int32)
    hi = lo + span
    steps = span
    while steps > 0:
        mid = (lo + hi) >> 1
        after = tl.gather(ends, mid, 0) <= key
        lo = tl.where(after, mid + 1, lo)
        hi = tl.where(after, hi, mid)
        steps = steps >> 1
    pos = t - tl.gather(starts, lo, 0)
    row = block_table_ptr + (req + lo).to(tl.int64) * block_table_stride
    valid = (t >= key_lo) & (t < key_end)
    block = tl.load(row + pos // BLOCK_SIZE, mask=valid, other=0)
    tl.store(kv_indices_ptr + t, block * BLOCK_SIZE + pos % BLOCK_SIZE, mask=valid)


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
    BLOCK_SIZE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SMALL: tl.constexpr,
    MID: tl.constexpr,
    DIRECT: tl.constexpr,
    FAST: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)

    # Every program: max(seq_len, qlen) and its inclusive prefix sum (ends), in registers.
    r = tl.arange(0, BLOCK_R)
    in_batch = r < num_reqs
    lens = tl.load(seq_lens_ptr + r, mask=in_batch, other=0)
    lens = tl.where(in_batch, tl.maximum(lens, qlen), 0)
    ends = tl.cumsum(lens, 0)
    total = tl.minimum(tl.sum(lens, 0), capacity)
    if pid == 0:
        tl.store(kv_indptr_ptr, 0)
        tl.store(kv_indptr_ptr + 1 + r, ends, mask=in_batch)
        tl.store(qo_indptr_ptr + r, r * qlen, mask=in_batch)
        tl.store(qo_indptr_ptr + num_reqs, num_reqs * qlen)

    num_tiles = tl.cdiv(total, BLOCK_T)
    if DIRECT:
        # Small batches (about one tile per program): per key, a binary search over the whole
        # prefix sum (bit_length(num_reqs - 1) gather steps narrow num_reqs candidates to one),
        # with no further reduction. Keys past the batch search as its last key.
        starts = ends - lens
        for tile in range(pid, num_tiles, num_programs):
            t0 = tl.multiple_of(tile * BLOCK_T, BLOCK_T)
            t = t0 + tl.arange(0, BLOCK_T)
            key = tl.minimum(t, total - 1)
            lo = tl.zeros((BLOCK_T,), dtype=tl.int32)
            hi = lo + num_reqs - 1
            steps = num_reqs - 1
            while steps > 0:
                mid = (lo + hi) >> 1
                after = tl.gather(ends, mid, 0) <= key  # the key lies after request mid
                lo = tl.where(after, mid + 1, lo)
                hi = tl.where(after, hi, mid)
                steps = steps >> 1
            key_row = block_table_ptr + lo.to(tl.int64) * block_table_stride
            _write_keys(kv_indices_ptr, key_row, t, tl.gather(starts, lo, 0), total, False, BLOCK_SIZE)
    else:
        # This program's tiles: a contiguous range, the same count for every program but the last.
        per_program = tl.cdiv(num_tiles, num_programs)
        tile_first = pid * per_program
        tile_end = tl.minimum(tile_first + per_program, num_tiles)
        if tile_first < tile_end:
            # Cursor: the request holding key `first`, its start and its end.
            first = tile_first * BLOCK_T
            ends = tl.where(in_batch, ends, _NO_END)  # rows past the batch never end before a key
            cur_req, cur_start, cur_end = _cursor(ends, first, 0)
            tile = tile_first
            while tile < tile_end:
                if FAST > 1:
                    # Several tiles inside the cursor's request: written at once (more stores in
                    # flight per program).
                    while (tile + FAST <= tile_end) & (cur_end >= (tile + FAST) * BLOCK_T) \
                            & ((tile + FAST) * BLOCK_T <= total):
                        t_fast = tl.multiple_of(tile * BLOCK_T, BLOCK_T) + tl.arange(0, FAST * BLOCK_T)
                        row = block_table_ptr + cur_req.to(tl.int64) * block_table_stride
                        _write_keys(kv_indices_ptr, row, t_fast, cur_start, total, True, BLOCK_SIZE)
                        tile += FAST
                        if (cur_end == tile * BLOCK_T) & (tile < tile_end):
                            cur_req += 1
                            cur_start = cur_end
                            cur_end = _end_of(seq_lens_ptr, cur_req, cur_start, num_reqs, qlen)
                if tile < tile_end:
                    last = tile == tile_end - 1
                    t0 = tl.multiple_of(tile * BLOCK_T, BLOCK_T)
                    t = t0 + tl.arange(0, BLOCK_T)
                    full = t0 + BLOCK_T <= total
                    t_last = tl.minimum(t0 + BLOCK_T, total) - 1
                    if cur_end > t_last:
                        # The whole tile lies in the cursor's request: one row, one start.
                        row = block_table_ptr + cur_req.to(tl.int64) * block_table_stride
                        if full:
                            _write_keys(kv_indices_ptr, row, t, cur_start, total, True, BLOCK_SIZE)
                        else:
                            _write_keys(kv_indices_ptr, row, t, cur_start, total, False, BLOCK_SIZE)
                        if cur_end == t_last + 1 and not last:
                            cur_req += 1
                            cur_start = cur_end
                            cur_end = _end_of(seq_lens_ptr, cur_req, cur_start, num_reqs, qlen)
                    else:
                        # Request boundaries in the tile. Most often one or two: the next two
                        # requests hold the rest of the tile (both lengths loaded at once), and each
                        # key's row and start is one of three.
                        next_end, after_end = _two_ends(seq_lens_ptr, cur_req + 1, cur_end, num_reqs, qlen)
                        if after_end > t_last:
                            step = (t >= cur_end).to(tl.int32) + (t >= next_end).to(tl.int32)
                            row = block_table_ptr + (cur_req + step).to(tl.int64) * block_table_stride
                            start = tl.where(step == 0, cur_start, tl.where(step == 1, cur_end, next_end))
                            if full:
                                _write_keys(kv_indices_ptr, row, t, start, total, True, BLOCK_SIZE)
                            else:
                                _write_keys(kv_indices_ptr, row, t, start, total, False, BLOCK_SIZE)
                            if next_end > t_last:  # one boundary
                                if next_end == t_last + 1 and not last:
                                    cur_req += 2
                                    cur_start = next_end
                                    cur_end = after_end
                                else:
                                    cur_req += 1
                                    cur_start = cur_end
                                    cur_end = next_end
                            else:  # two
                                if after_end == t_last + 1 and not last:
                                    cur_req += 3
                                    cur_start = after_end
                                    cur_end = _end_of(seq_lens_ptr, cur_req, cur_start, num_reqs, qlen)
                                else:
                                    cur_req += 2
                                    cur_start = next_end
                                    cur_end = after_end
                        else:
                            # Request boundaries in the tile: a window of SMALL requests first.
                            w_ends, w_starts = _window(seq_lens_ptr, cur_req, cur_start, num_reqs, qlen, SMALL)
                            span = tl.sum((w_ends <= t_last).to(tl.int32), 0)
                            if span < SMALL:
                                cur_req, cur_start, cur_end = _write_window_tile(
                                    kv_indices_ptr, block_table_ptr, block_table_stride, seq_lens_ptr, num_reqs, qlen,
                                    total, t, t_last, cur_req, cur_start, w_ends, w_starts, span, full, last, BLOCK_T,
                                    BLOCK_SIZE)
                            else:
                                # Many requests: windows of MID requests, each writing the keys of the
                                # tile that lie in its requests, until one holds the tile's last key.
                                w_req = cur_req
                                w_start = cur_start
                                covered = 0
                                while covered == 0:
                                    m_ends, m_starts = _window(seq_lens_ptr, w_req, w_start, num_reqs, qlen, MID)
                                    span = tl.sum((m_ends <= t_last).to(tl.int32), 0)
                                    covered = (span < MID).to(tl.int32)
                                    w_end = tl.max(m_ends, 0)  # the window's last end (when not covered)
                                    key_end = tl.where(covered != 0, t_last + 1, w_end)
                                    _write_window_keys(kv_indices_ptr, block_table_ptr, block_table_stride, t, w_start,
                                                       key_end, w_req, m_ends, m_starts, tl.minimum(span, MID - 1),
                                                       BLOCK_T, BLOCK_SIZE)
                                    if covered:
                                        if not last:
                                            done, cur_start, cur_end = _cursor(m_ends, t_last + 1, w_start)
                                            cur_req = w_req + done
                                            if cur_end == _NO_END:
                                                cur_end = _end_of(seq_lens_ptr, cur_req, cur_start, num_reqs, qlen)
                                    else:
                                        w_req += MID
                                        w_start = w_end
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
    g = tl.arange(0, GROUP)
    req = first + g
    in_batch = req < num_reqs
    lens = tl.load(seq_lens_ptr + req, mask=in_batch, other=0)
    lens = tl.where(in_batch, tl.maximum(lens, qlen), 0)
    ends = tl.cumsum(lens, 0)  # of the group's keys
    starts = ends - lens
    tl.store(kv_indptr_ptr + 1 + req, offset + ends, mask=in_batch)
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
            key = tl.minimum(k, count - 1)
            lo = tl.zeros((CHUNK,), dtype=tl.int32)
            hi = lo + GROUP - 1
            steps = GROUP - 1
            while steps > 0:
                mid = (lo + hi) >> 1
                after = tl.gather(ends, mid, 0) <= key
                lo = tl.where(after, mid + 1, lo)
                hi = tl.where(after, hi, mid)
                steps = steps >> 1
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
    tl.store(kv_indptr_ptr + 1 + req, ends, mask=in_batch)
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


def launch_shape(programs: int, most_keys: int | None) -> tuple[int, int, bool]:
    """(tile size, programs, direct search) for a batch of at most ``most_keys`` keys (None:
    unknown). Batches of at most one tile per program search each key directly."""
    if most_keys is None:
        return BLOCK_T, programs, False
    block_t = MIN_BLOCK_T
    while block_t < BLOCK_T and block_t * 2 * programs <= most_keys:
        block_t *= 2
    tiles = -(-most_keys // block_t)
    return block_t, max(1, min(programs, tiles)), tiles <= programs


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
    programs) or ("walk", block_t, direct, programs)."""
    rows = rows_shape(num_reqs, longest)
    if rows is not None:
        return ("rows", *rows)
    grouped = grouped_shape(programs, num_reqs, longest)
    if grouped is not None:
        return ("grouped", *grouped)
    block_t, grid, direct = launch_shape(programs, None if longest is None else num_reqs * longest)
    return ("walk", block_t, direct, grid)


def _launch(buffers: DecodePlanBuffers, block_table, seq_lens, num_reqs: int, qlen: int, shape: tuple) -> DecodePlan:
    args = (block_table, block_table.stride(0), seq_lens, num_reqs, qlen, buffers.capacity,
            buffers.qo_indptr, buffers.kv_indptr, buffers.kv_indices)
    sizes = {"BLOCK_SIZE": buffers.block_size, "BLOCK_R": triton.next_power_of_2(buffers.max_reqs)}
    if shape[0] == "rows":
        _, group, cols, programs = shape
        _plan_rows_kernel[(programs,)](block_table, block_table.stride(0), block_table.shape[1], *args[2:], **sizes,
                                       GROUP=group, COLS=cols,
                                       num_warps=4 if cols >= ROWS_WIDE_COLS else ROWS_NUM_WARPS)
    elif shape[0] == "grouped":
        _, group, chunk, programs = shape
        _plan_grouped_kernel[(programs,)](*args, **sizes, GROUP=group, CHUNK=chunk, num_warps=GROUPED_NUM_WARPS)
    else:
        _, block_t, direct, programs = shape
        _plan_kernel[(programs,)](
            *args,
            **sizes,
            BLOCK_T=block_t,
            SMALL=min(SMALL_WINDOW, block_t),
            MID=min(MID_WINDOW, block_t),
            DIRECT=direct,
            FAST=FAST_TILES,
            num_warps=NUM_WARPS,
        )
    return DecodePlan(
        qo_indptr=buffers.qo_indptr[: num_reqs + 1],
        kv_indptr=buffers.kv_indptr[: num_reqs + 1],
        kv_indices=buffers.kv_indices,
        kv_last_page_lens=buffers.kv_last_page_lens[:num_reqs],
    )


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
    found = {launch_shape_of(programs, n, None)[:3] for n in (1, max_reqs)}
    lens = _boundaries(max_len, GROUP_KEYS, GROUP_MAX_KEYS, MIN_BLOCK_T, BLOCK_T, ROWS_MAX_LEN, ROWS_MAX_COLS)
    for n in _boundaries(max_reqs, programs):
        for longest in lens:
            found.add(launch_shape_of(programs, n, longest)[:3])
    # the tile walk's tile sizes: every one, searched directly or walked
    block_t = MIN_BLOCK_T
    while block_t <= BLOCK_T:
        found.update({("walk", block_t, True), ("walk", block_t, False)})
        block_t *= 2
    return sorted(found, key=repr)


def warm_up(buffers: DecodePlanBuffers, max_len: int) -> int:
    """Compile every launch shape of the planner for these buffers before the first request
    (Triton compiles a kernel at its first launch): returns how many shapes were launched. The
    buffers are written with plans of requests of one key."""
    device = buffers.kv_indices.device
    counts = [n for n in _REQUEST_COUNTS if n <= buffers.max_reqs]
    block_table = torch.zeros((max(counts), 1), dtype=torch.int32, device=device)
    seq_lens = torch.ones(max(counts), dtype=torch.int32, device=device)
    shapes = launch_shapes(_num_programs(device.index or 0), buffers.max_reqs, max_len)
    for shape in shapes:
        for n in counts:
            # the rows and grouped kernels: a program per group
            grid = -(-n // shape[1]) if shape[0] in ("rows", "grouped") else 1
            _launch(buffers, block_table[:n], seq_lens[:n], n, 1, (*shape, grid))
    return len(shapes)
