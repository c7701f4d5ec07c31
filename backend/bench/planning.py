#!/usr/bin/env python3
"""Decode planning per step at the memory-bandwidth limit: the fused Triton planner against
its previous version and against the time to write its index array, side by side.

Plain PyTorch + Triton on a GPU (no vLLM). For each batch:

* ``previous``: the Triton planner as it was before the cursor walk (kept here, for this
  comparison only): every program held the prefix sum of all lengths in registers for its
  whole run, took the requests of each tile's first and last key by two reductions over all
  requests, and searched a spanning tile's keys over that prefix sum; tiles of 4096 keys
  dealt out round-robin, the grid capped by the batch's largest possible key count.
* ``new``: ``plan_decode_triton`` as the backend calls it (``max_seq_len`` known on the host).
* ``bound``: the time to write ``kv_indices`` (int32, one per key) at the GPU's write
  bandwidth, measured in the same run on the same number of bytes: the faster of a fill
  kernel and a memset. ``bytes / bound`` is printed as the measured bandwidth; a
  device-to-device copy of the same bytes (read + write) is printed beside it, since a
  block size of 1 makes the planner read one table entry per key it writes.

Every plan is first checked against the PyTorch planner (``plan_decode_into``, or, where
its scratch of requests x longest request would not fit, the exact-size ``plan_decode`` on
the raised lengths) and the previous kernel's; a difference ends the run with status 1
before anything is timed. Times are CUDA-graph replays: a graph of ``--calls`` calls,
replayed ``--replays`` times behind a GPU sleep that holds the queue full, median of
``--trials``, per call. ``host`` is the eager call's host time (what vLLM's metadata
builder pays each step before the graph of the model replays).

Usage::

    PYTHONPATH=backend/src python backend/bench/planning.py [--only SUBSTRING,...] [--sweep]

``--sweep`` times the new planner under a few launch shapes (largest and smallest tile,
warps, programs per multiprocessor) instead.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vllm_aiter_mla import planning_triton
from vllm_aiter_mla.planning import DecodePlanBuffers, plan_decode, plan_decode_into
from vllm_aiter_mla.planning_triton import plan_decode_triton

# ---------------------------------------------------------------------------------------
# The previous kernel (every program holds the prefix sum in registers for its whole run and
# finds the requests of each tile by reductions over all of them), for comparison only.

_PREVIOUS_BLOCK_T = 4096
_PREVIOUS_PROGRAMS_PER_SM = 4
_PREVIOUS_NUM_WARPS = 4


@triton.jit
def _previous_write_keys(kv_indices_ptr, row_ptr, t, start, total, FULL: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    pos = t - start
    if FULL:
        block = tl.load(row_ptr + pos // BLOCK_SIZE)
        tl.store(kv_indices_ptr + t, block * BLOCK_SIZE + pos % BLOCK_SIZE)
    else:
        valid = t < total
        block = tl.load(row_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
        tl.store(kv_indices_ptr + t, block * BLOCK_SIZE + pos % BLOCK_SIZE, mask=valid)


@triton.jit
def _previous_plan_kernel(
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
    ends = tl.where(in_batch, ends, 2147483647)  # rows past the batch never end before a key
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
            req_start = tl.max(tl.where(ends <= t0, ends, 0), 0)
            req_row = block_table_ptr + req_lo.to(tl.int64) * block_table_stride
            if full:
                _previous_write_keys(kv_indices_ptr, req_row, t, req_start, total, True, BLOCK_SIZE)
            else:
                _previous_write_keys(kv_indices_ptr, req_row, t, req_start, total, False, BLOCK_SIZE)
        else:
            # Per key, a binary search over the prefix sum in [req_lo, req_hi].
            key = tl.minimum(t, t_last)
            lo = tl.zeros((BLOCK_T,), dtype=tl.int32) + req_lo
            hi = tl.zeros((BLOCK_T,), dtype=tl.int32) + req_hi
            steps = req_hi - req_lo
            while steps > 0:
                mid = (lo + hi) >> 1
                after = tl.gather(ends, mid, 0) <= key
                lo = tl.where(after, mid + 1, lo)
                hi = tl.where(after, hi, mid)
                steps = steps >> 1
            key_start = tl.gather(starts, lo, 0)
            key_row = block_table_ptr + lo.to(tl.int64) * block_table_stride
            if full:
                _previous_write_keys(kv_indices_ptr, key_row, t, key_start, total, True, BLOCK_SIZE)
            else:
                _previous_write_keys(kv_indices_ptr, key_row, t, key_start, total, False, BLOCK_SIZE)


def previous_plan_decode_triton(buffers, block_table, seq_lens, qlen, max_seq_len=None):
    num_reqs = block_table.shape[0]
    programs = _sm_count(block_table.device.index or 0) * _PREVIOUS_PROGRAMS_PER_SM
    if max_seq_len is not None:
        programs = max(1, min(programs, -(-num_reqs * max(max_seq_len, qlen) // _PREVIOUS_BLOCK_T)))
    _previous_plan_kernel[(programs,)](
        block_table, block_table.stride(0), seq_lens, num_reqs, qlen, buffers.capacity,
        buffers.qo_indptr, buffers.kv_indptr, buffers.kv_indices,
        BLOCK_SIZE=buffers.block_size, BLOCK_R=triton.next_power_of_2(buffers.max_reqs),
        BLOCK_T=_PREVIOUS_BLOCK_T, num_warps=_PREVIOUS_NUM_WARPS,
    )
    return buffers.kv_indptr[: num_reqs + 1], buffers.kv_indices


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# ---------------------------------------------------------------------------------------
# Batches


@dataclass(frozen=True)
class Case:
    name: str
    seq_lens: tuple[int, ...]
    qlen: int = 1
    block_size: int = 16


def _rand(seed: int, n: int, lo: int, hi: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randint(lo, hi) for _ in range(n))


def cases() -> list[Case]:
    m = 2**20
    return [
        Case("64 x 4k", (4096,) * 64),
        Case("512 x 32k", (32768,) * 512),
        Case("256: one 128k, 255 x 1k", (131072,) + (1024,) * 255),
        Case("1024: one 160k, 1023 x 512 (block size 1)", (163840,) + (512,) * 1023, block_size=1),
        Case("4096 x 1", (1,) * 4096),
        Case("4096 x 16", (16,) * 4096),
        Case("4096 x 300", (300,) * 4096),
        Case("1 x 32M", (32 * m,)),
        Case("1 x 32M - 1 (block size 64)", (32 * m - 1,), block_size=64),
        Case("1024 random 1..64k", _rand(1, 1024, 1, 65536)),
        Case("4096 random 1..16k", _rand(2, 4096, 1, 16384)),
        Case("4096 random 1..16k (block size 1)", _rand(3, 4096, 1, 16384), block_size=1),
        Case("512 random 1..8k, MTP qlen 3", _rand(4, 512, 1, 8192), qlen=3),
        Case("256 x 4k, MTP qlen 4", (4096,) * 256, qlen=4),
        Case("4096 random 1..8k, MTP qlen 2", _rand(5, 4096, 1, 8192), qlen=2),
        Case("1000 random 1..4k + 24 padding rows, qlen 2", _rand(6, 1000, 1, 4096) + (0,) * 24, qlen=2),
        Case("4000 x 512 + 96 padding rows, qlen 4", (512,) * 4000 + (0,) * 96, qlen=4),
        Case("4096 padding rows, qlen 1", (0,) * 4096),
        Case("mixed 4032 random 1..256 + 64 random 100k..400k (block size 64)",
             _rand(7, 4032, 1, 256) + _rand(8, 64, 100_000, 400_000), block_size=64),
        Case("mixed 2048 x 1..32 and 2048 x 4k..12k, interleaved, qlen 2",
             tuple(x for pair in zip(_rand(9, 2048, 1, 32), _rand(10, 2048, 4096, 12288)) for x in pair), qlen=2),
    ]


def make_batch(case: Case, device: torch.device):
    """Block table (each request's blocks a slice of a random permutation of the cache's
    blocks, stale random entries past its length), sequence lengths, cache slots."""
    bs, qlen = case.block_size, case.qlen
    gen = torch.Generator(device=device).manual_seed(0)
    lens = torch.tensor(case.seq_lens, dtype=torch.int64, device=device)
    blocks = (lens.clamp(min=qlen) + bs - 1) // bs
    width = int(blocks.max())
    num_cache_blocks = int(blocks.sum()) + 16
    perm = torch.randperm(num_cache_blocks, generator=gen, device=device).to(torch.int32)
    first = torch.cumsum(blocks, 0) - blocks
    j = torch.arange(width, device=device)
    src = (first[:, None] + j[None, :]).clamp(max=num_cache_blocks - 1)
    stale = torch.randint(0, num_cache_blocks, (len(case.seq_lens), width), generator=gen, device=device,
                          dtype=torch.int32)
    table = torch.where(j[None, :] < blocks[:, None], perm[src], stale)
    del src, stale
    return table, lens.to(torch.int32), num_cache_blocks * bs


def reference_plan(case: Case, table: torch.Tensor, seq: torch.Tensor):
    """The PyTorch planner's kv_indptr and kv_indices (uniform layout)."""
    num_reqs, width = table.shape
    if num_reqs * width * case.block_size <= 2**27:
        buffers = DecodePlanBuffers.allocate(num_reqs, width, case.block_size, table.device)
        plan = plan_decode_into(buffers, table, seq, None, uniform_qlen=case.qlen)
        total = int(plan.kv_indptr[-1])
        return plan.qo_indptr, plan.kv_indptr, plan.kv_indices[:total]
    qsl = torch.arange(num_reqs + 1, dtype=torch.int32, device=table.device) * case.qlen
    plan = plan_decode(table, seq.clamp(min=case.qlen), qsl, case.block_size)
    return plan.qo_indptr, plan.kv_indptr, plan.kv_indices


# ---------------------------------------------------------------------------------------
# Timing


def graph_ms(fn, calls: int, replays: int, trials: int) -> float:
    """Per-call GPU time of ``fn`` replayed from a CUDA graph of ``calls`` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compiled and warmed outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(trials):
        torch.cuda.synchronize()
        torch.cuda._sleep(5_000_000)  # queue the replays behind a busy GPU
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / (calls * replays))
    del graph
    return statistics.median(times)


def host_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


@dataclass
class Row:
    case: str
    keys: int
    previous_ms: float
    new_ms: float
    bound_ms: float
    copy_ms: float
    host_ms: float

    @property
    def ratio(self) -> float:
        return self.new_ms / self.bound_ms


def run(case: Case, device: torch.device, args) -> Row | None:
    table, seq, slots = make_batch(case, device)
    num_reqs = table.shape[0]
    qlen, bs = case.qlen, case.block_size
    max_seq = max(case.seq_lens)
    keys = sum(max(s, qlen) for s in case.seq_lens)
    max_keys = slots + num_reqs * qlen
    new_buffers = DecodePlanBuffers.allocate(num_reqs, table.shape[1], bs, device, max_keys=max_keys)
    old_buffers = DecodePlanBuffers.allocate(num_reqs, table.shape[1], bs, device, max_keys=max_keys)

    def new():
        return plan_decode_triton(new_buffers, table, seq, qlen, max_seq)

    def previous():
        return previous_plan_decode_triton(old_buffers, table, seq, qlen, max_seq)

    want_qo, want_indptr, want_indices = reference_plan(case, table, seq)
    new_buffers.kv_indices.fill_(-1)
    got = new()
    old_indptr, old_indices = previous()
    checks = {
        "qo_indptr": torch.equal(got.qo_indptr, want_qo),
        "kv_indptr": torch.equal(got.kv_indptr, want_indptr),
        "kv_indices": torch.equal(got.kv_indices[:keys], want_indices),
        "untouched past the keys": bool((new_buffers.kv_indices[keys:] == -1).all()),
        "previous kernel's kv_indptr": torch.equal(old_indptr, want_indptr),
        "previous kernel's kv_indices": torch.equal(old_indices[:keys], want_indices),
    }
    del want_qo, want_indptr, want_indices
    if not all(checks.values()):
        print(f"{case.name}: plans differ: {[k for k, ok in checks.items() if not ok]}", flush=True)
        return None

    fill_target = torch.empty(keys, dtype=torch.int32, device=device)
    copy_source = torch.ones(keys, dtype=torch.int32, device=device)
    timing = (args.calls, args.replays, args.trials)
    row = Row(
        case=case.name,
        keys=keys,
        previous_ms=graph_ms(previous, *timing),
        new_ms=graph_ms(new, *timing),
        bound_ms=min(graph_ms(lambda: fill_target.fill_(7), *timing), graph_ms(fill_target.zero_, *timing)),
        copy_ms=graph_ms(lambda: fill_target.copy_(copy_source), *timing),
        host_ms=host_ms(new, 20),
    )
    return row


def _picked(case: Case, args) -> bool:
    return not args.only or any(part in case.name for part in args.only.split(","))


def _time_new_and_bound(case: Case, device: torch.device, args) -> tuple[float, float]:
    table, seq, slots = make_batch(case, device)
    buffers = DecodePlanBuffers.allocate(table.shape[0], table.shape[1], case.block_size, device,
                                         max_keys=slots + table.shape[0] * case.qlen)
    keys = sum(max(s, case.qlen) for s in case.seq_lens)
    timing = (args.calls, args.replays, args.trials)
    ms = graph_ms(lambda: plan_decode_triton(buffers, table, seq, case.qlen, max(case.seq_lens)), *timing)
    target = torch.empty(keys, dtype=torch.int32, device=device)
    return ms, graph_ms(target.zero_, *timing)


def sweep(device: torch.device, args) -> int:
    shapes = [(1024, 256, 4, 8, 512, 2), (1024, 256, 4, 8, 512, 1), (1024, 256, 4, 8, 512, 4),
              (1024, 256, 4, 4, 512, 2), (2048, 256, 4, 8, 512, 1), (1024, 256, 4, 8, 256, 2)]
    if args.shapes:
        try:
            shapes = [tuple(int(x) for x in shape.split(":")) for shape in args.shapes.split(",")]
        except ValueError:
            shapes = []
        if not shapes or any(len(shape) != 6 or min(shape) < 1 for shape in shapes):
            print(f"--shapes {args.shapes!r}: expected LARGEST_TILE:SMALLEST_TILE:WARPS:PER_SM:GROUP_KEYS:"
                  "FAST_TILES,... (positive integers)", file=sys.stderr)
            return 2
    picked = [c for c in cases() if _picked(c, args)]
    print("| launch (largest tile, smallest tile, warps, programs/SM, group keys, fast tiles) | "
          + " | ".join(c.name for c in picked) + " |")
    print("|---|" + "---|" * len(picked))
    for block_t, min_block_t, warps, per_sm, group_keys, fast in shapes:
        planning_triton.BLOCK_T, planning_triton.MIN_BLOCK_T = block_t, min_block_t
        planning_triton.NUM_WARPS, planning_triton.PROGRAMS_PER_SM = warps, per_sm
        planning_triton.GROUP_KEYS, planning_triton.FAST_TILES = group_keys, fast
        planning_triton._num_programs.cache_clear()
        cells = []
        for case in picked:
            ms, bound = _time_new_and_bound(case, device, args)
            cells.append(f"{ms:.4f} ({ms / bound:.2f}x)")
            torch.cuda.empty_cache()
        print(f"| {block_t}, {min_block_t}, {warps}, {per_sm}, {group_keys}, {fast} | " + " | ".join(cells) + " |",
              flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10, help="planner calls per captured graph")
    ap.add_argument("--replays", type=int, default=10, help="graph replays per trial")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--only", default="",
                    help="run only the batches whose name contains one of these (comma-separated)")
    ap.add_argument("--sweep", action="store_true", help="time launch shapes of the new planner")
    ap.add_argument("--shapes", default="",
                    help="with --sweep: launch shapes to time, comma-separated "
                         "LARGEST_TILE:SMALLEST_TILE:WARPS:PER_SM:GROUP_KEYS:FAST_TILES")
    args = ap.parse_args()
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}")
    warm = torch.randn(4096, 4096, device=device)
    for _ in range(50):
        warm @ warm  # clocks up before the first case
    if args.sweep:
        return sweep(device, args)
    print("| batch | keys | previous ms | new ms | bound ms (write) | new / bound | write GB/s "
          "| copy ms (read + write) | new host ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for case in cases():
        if not _picked(case, args):
            continue
        row = run(case, device, args)
        if row is None:
            return 1
        rows.append(row)
        print(f"| {row.case} | {row.keys:,} | {row.previous_ms:.4f} | {row.new_ms:.4f} | {row.bound_ms:.4f} "
              f"| {row.ratio:.2f} | {4 * row.keys / row.bound_ms / 1e6:,.0f} | {row.copy_ms:.4f} "
              f"| {row.host_ms:.3f} |", flush=True)
        torch.cuda.empty_cache()
    worst = max(rows, key=lambda r: r.ratio)
    print(f"all plans equal; worst new / bound: {worst.ratio:.2f} ({worst.case})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
