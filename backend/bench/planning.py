#!/usr/bin/env python3
"""Decode planning per step at the memory-bandwidth limit: the fused Triton planner against
its previous version and against the time to write its index array, side by side.

Plain PyTorch + Triton on a GPU (no vLLM). For each batch:

* ``previous``: the Triton planner before its tile walk planned short requests as rows and
  walked the long requests' keys alone (``planning_previous.py`` beside this file, a frozen copy
  of the module, for this comparison only).
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

    PYTHONPATH=backend/src python backend/bench/planning.py [--only SUBSTRING,...] [--sweep [--configs ...]]

``--sweep`` times the new planner (and prints the launch each batch gets) under
configurations of its integer constants instead, e.g. ``--configs
'ROWS_MAX_LEN=2048,ROW_ELEMS=8192;NUM_WARPS=8'`` (one configuration per ``;``; none: as
shipped).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass

import planning_previous  # the previous planner: a frozen copy of the module, beside this file
import torch
import triton

from vllm_aiter_mla import planning_triton
from vllm_aiter_mla.planning import DecodePlanBuffers, plan_decode, plan_decode_into
from vllm_aiter_mla.planning_triton import plan_decode_triton

# ---------------------------------------------------------------------------------------
# The previous planner, for comparison only


def previous_plan_decode_triton(buffers, block_table, seq_lens, qlen, max_seq_len=None):
    plan = planning_previous.plan_decode_triton(buffers, block_table, seq_lens, qlen, max_seq_len)
    return plan.kv_indptr, plan.kv_indices


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


def launch_of(case: Case, device: torch.device) -> str:
    """The launch shape the planner picks for a batch (kernel, its constants, programs)."""
    num_reqs = len(case.seq_lens)
    shape = planning_triton.launch_shape_of(planning_triton._num_programs(device.index or 0), num_reqs,
                                            max(max(case.seq_lens), case.qlen))
    return " ".join(str(x) for x in shape)


def _time_new_and_bound(case: Case, device: torch.device, args) -> tuple[float, float]:
    table, seq, slots = make_batch(case, device)
    buffers = DecodePlanBuffers.allocate(table.shape[0], table.shape[1], case.block_size, device,
                                         max_keys=slots + table.shape[0] * case.qlen)
    keys = sum(max(s, case.qlen) for s in case.seq_lens)
    timing = (args.calls, args.replays, args.trials)
    ms = graph_ms(lambda: plan_decode_triton(buffers, table, seq, case.qlen, max(case.seq_lens)), *timing)
    target = torch.empty(keys, dtype=torch.int32, device=device)
    return ms, graph_ms(target.zero_, *timing)


def parse_configs(text: str) -> list[dict[str, int]] | str:
    """``NAME=VALUE,NAME=VALUE;NAME=VALUE`` -> one dict of planner constants per configuration,
    or an error line."""
    configs = []
    for part in text.split(";"):
        config = {}
        for item in filter(None, part.split(",")):
            name, sep, value = item.partition("=")
            name = name.strip()
            current = getattr(planning_triton, name, None)
            if not sep or not name.isupper() or not isinstance(current, int):
                return f"--configs: {item!r} is not NAME=VALUE for an integer constant of planning_triton"
            try:
                config[name] = type(current)(int(value))
            except ValueError:
                return f"--configs: {item!r}: the value is not an integer"
        configs.append(config)
    return configs


def sweep(device: torch.device, args) -> int:
    configs = parse_configs(args.configs) if args.configs else [{}]
    if isinstance(configs, str):
        print(configs, file=sys.stderr)
        return 2
    defaults = {name: getattr(planning_triton, name) for config in configs for name in config}
    picked = [c for c in cases() if _picked(c, args)]
    print("| planner constants | " + " | ".join(c.name for c in picked) + " |")
    print("|---|" + "---|" * len(picked))
    for config in configs:
        for name, value in {**defaults, **config}.items():
            setattr(planning_triton, name, value)
        planning_triton._num_programs.cache_clear()
        cells = []
        for case in picked:
            ms, bound = _time_new_and_bound(case, device, args)
            cells.append(f"{ms:.4f} ({ms / bound:.2f}x, {launch_of(case, device)})")
            torch.cuda.empty_cache()
        label = ", ".join(f"{k}={v}" for k, v in config.items()) or "as shipped"
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10, help="planner calls per captured graph")
    ap.add_argument("--replays", type=int, default=10, help="graph replays per trial")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--only", default="",
                    help="run only the batches whose name contains one of these (comma-separated)")
    ap.add_argument("--sweep", action="store_true", help="time launch shapes of the new planner")
    ap.add_argument("--configs", default="",
                    help="with --sweep: planner constants to time, e.g. "
                         "'ROWS_MAX_LEN=2048,ROW_ELEMS=8192;RUN_TILES=4' (one configuration per ';')")
    args = ap.parse_args()
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}")
    warm = torch.randn(4096, 4096, device=device)
    for _ in range(50):
        warm @ warm  # clocks up before the first case
    if args.sweep:
        return sweep(device, args)
    print("| batch | keys | previous ms | new ms | bound ms (write) | new / bound | write GB/s "
          "| copy ms (read + write) | new host ms | new launch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
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
              f"| {row.host_ms:.3f} | {launch_of(case, device)} |", flush=True)
        torch.cuda.empty_cache()
    worst = max(rows, key=lambda r: r.ratio)
    print(f"all plans equal; worst new / bound: {worst.ratio:.2f} ({worst.case})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
