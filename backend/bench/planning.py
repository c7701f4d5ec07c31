#!/usr/bin/env python3
"""Decode planning per step: the plugin's Triton planner against the decode-metadata step of
vLLM's built-in ROCM_AITER_MLA backend, one column per vLLM release, side by side in one run.

Plain PyTorch + Triton on a GPU (no vLLM installed). backend/bench/README.md ("Decode planning speed")
tells what each column times and how the plans are compared. For each batch:

* ``ours``: ``plan_decode_triton`` as the backend calls it (``max_seq_len`` known on the
  host): one launch writing qo_indptr, kv_indptr and kv_indices into persistent buffers.
* one column per ``--vllm-source`` (an unpacked vLLM sdist folder or its
  ``vllm/v1/attention/backends/mla/rocm_aiter_mla.py``, labelled by the release it finds):
  the planning part of that release's ``AiterMLAMetadataBuilder._build_decode``
  (builtin_planner.py beside this file). ``full graphs``: the step as the builder runs it
  when vLLM runs decode batches in full CUDA graphs (its default cudagraph mode,
  FULL_AND_PIECEWISE, does for this backend), the ``fill_(-1)`` of its page-index buffer and
  its persistent copies included. ``no full graphs``: the prefix sum and the kernel only. Its
  buffer holds ``max_num_seqs x max_model_len`` entries: by default the smallest that holds the
  batch; ``--max-num-seqs`` and ``--max-model-len`` size it (and the block table's width, which
  sets the kernel's grid) as a server would.
* ``bound``: writing ``kv_indices`` (int32, one per key) at the GPU's write bandwidth (the faster
  of a fill kernel and a memset); ``copy``: a device-to-device copy of those bytes.

Both write slot ids and are compared as they are (kv_indptr and the first kv_indptr[-1] entries
of kv_indices), but for padding rows at query length 1 (the built-in plans them 0 keys, ours 1;
marked ``*``, compared on the keys both plan). Every plan is first checked (ours against the
PyTorch planner, each built-in against ours); a difference ends the run with status 1 before
anything is timed. GPU times are CUDA-graph replays: a graph of ``--calls`` calls, replayed
``--replays`` times behind a GPU sleep, median of ``--trials``, per call. Host times are the
eager call's (median of 100); for the built-in only the calls above, a lower bound of its
``_build_decode``. ``x ours``: the built-in's time over ours.

Usage::

    PYTHONPATH=backend/src python backend/bench/planning.py [--vllm-source PATH ...]
        [--only SUBSTRING,...] [--max-num-seqs N] [--max-model-len N] [--sweep [--configs ...]]

``--check-only`` checks the plans without timing them; without a GPU it runs on the CPU in
Triton's interpreter (``TRITON_INTERPRET=1``, the planner on a grid of ``--programs``).
``--sweep`` times our planner (and prints the launch each batch gets) under configurations
of its integer constants instead, e.g. ``--configs 'ROWS_MAX_LEN=2048,ROW_ELEMS=8192;NUM_WARPS=8'``
(one configuration per ``;``; none: as shipped).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import builtin_planner  # beside this file
import torch
import triton

from vllm_aiter_mla import planning_triton
from vllm_aiter_mla.planning import DecodePlanBuffers, plan_decode, plan_decode_into
from vllm_aiter_mla.planning_triton import plan_decode_triton

# ---------------------------------------------------------------------------------------
# Batches


@dataclass(frozen=True)
class Case:
    name: str
    seq_lens: tuple[int, ...]
    qlen: int = 1
    block_size: int = 16

    def __post_init__(self):
        # a decode batch: every request holds at least its query's keys; padding rows hold none
        if any(0 < s < self.qlen for s in self.seq_lens):
            raise ValueError(f"{self.name}: a request shorter than its query length {self.qlen}")

    @property
    def pad_rows(self) -> bool:
        """A padded multi-token batch: the built-in gives its padding rows qlen keys."""
        return self.qlen > 1 and 0 in self.seq_lens

    def our_lengths(self) -> list[int]:
        return [max(s, self.qlen) for s in self.seq_lens]

    def builtin_lengths(self) -> list[int]:
        return [s if s or not self.pad_rows else self.qlen for s in self.seq_lens]


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
        Case("512 random 3..8k, MTP qlen 3", _rand(4, 512, 3, 8192), qlen=3),
        Case("256 x 4k, MTP qlen 4", (4096,) * 256, qlen=4),
        Case("4096 random 2..8k, MTP qlen 2", _rand(5, 4096, 2, 8192), qlen=2),
        Case("1000 random 2..4k + 24 padding rows, qlen 2", _rand(6, 1000, 2, 4096) + (0,) * 24, qlen=2),
        Case("4000 x 512 + 96 padding rows, qlen 4", (512,) * 4000 + (0,) * 96, qlen=4),
        Case("4096 padding rows, qlen 1", (0,) * 4096),
        Case("60 random 3..2k + 4 padding rows, qlen 3", _rand(11, 60, 3, 2048) + (0,) * 4, qlen=3),
        Case("mixed 4032 random 1..256 + 64 random 100k..400k (block size 64)",
             _rand(7, 4032, 1, 256) + _rand(8, 64, 100_000, 400_000), block_size=64),
        Case("mixed 2048 x 2..32 and 2048 x 4k..12k, interleaved, qlen 2",
             tuple(x for pair in zip(_rand(9, 2048, 2, 32), _rand(10, 2048, 4096, 12288)) for x in pair), qlen=2),
    ]


def make_batch(case: Case, device: torch.device, width: int = 0):
    """Block table (each request's blocks a slice of a random permutation of the cache's
    blocks, stale random entries past its length; at least ``width`` columns), sequence
    lengths, cache slots."""
    bs, qlen = case.block_size, case.qlen
    gen = torch.Generator(device=device).manual_seed(0)
    lens = torch.tensor(case.seq_lens, dtype=torch.int64, device=device)
    blocks = (lens.clamp(min=qlen) + bs - 1) // bs
    width = max(width, int(blocks.max()))
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


def query_start_loc(case: Case, device: torch.device) -> torch.Tensor:
    """The batch's query_start_loc as vLLM hands it: qlen tokens per request, 0 per padding row."""
    qlens = [case.qlen if s else 0 for s in case.seq_lens]
    return torch.tensor([0] + qlens, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)


def reference_plan(case: Case, table: torch.Tensor, seq: torch.Tensor):
    """The PyTorch planner's qo_indptr, kv_indptr and kv_indices (uniform layout)."""
    num_reqs, width = table.shape
    if num_reqs * width * case.block_size <= 2**27:
        buffers = DecodePlanBuffers.allocate(num_reqs, width, case.block_size, table.device)
        plan = plan_decode_into(buffers, table, seq, None, uniform_qlen=case.qlen)
        total = int(plan.kv_indptr[-1])
        return plan.qo_indptr, plan.kv_indptr, plan.kv_indices[:total]
    qsl = torch.arange(num_reqs + 1, dtype=torch.int32, device=table.device) * case.qlen
    plan = plan_decode(table, seq.clamp(min=case.qlen), qsl, case.block_size)
    return plan.qo_indptr, plan.kv_indptr, plan.kv_indices


def builtin_differences(case: Case, indptr: torch.Tensor, indices: torch.Tensor, ours, fills: bool) -> list[str]:
    """What differs between a built-in's plan and ours (empty: the same plan); see the module
    docstring for the padding rows at query length 1."""
    keys = int(ours.kv_indptr[-1])
    theirs = case.builtin_lengths()
    failed = []
    if theirs == case.our_lengths():
        want_indptr, want_indices = ours.kv_indptr, ours.kv_indices[:keys]
    else:  # compared on the keys both plan
        device = indptr.device
        lens = torch.tensor(theirs, dtype=torch.int64, device=device)
        req = torch.repeat_interleave(torch.arange(len(theirs), device=device),
                                      torch.tensor(case.our_lengths(), device=device), output_size=keys)
        pos = torch.arange(keys, device=device) - ours.kv_indptr[req]
        want_indices = ours.kv_indices[:keys][pos < lens[req]]
        want_indptr = torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(torch.int32)
    if not torch.equal(indptr, want_indptr):
        failed.append("kv_indptr")
    total = want_indices.numel()
    if not torch.equal(indices[:total], want_indices):
        failed.append("kv_indices")
    if fills and not bool((indices[total:] == -1).all()):
        failed.append("-1 past its keys")
    return failed


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


HOST_REPS = 100


def host_ms(fns: list, reps: int) -> list[float]:
    """Host time of one eager call of each of ``fns``, called in turn ``reps`` times (so that
    a slower stretch of the host falls on all of them), median each."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, spent in zip(fns, times):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            spent.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return [statistics.median(spent) for spent in times]


@dataclass
class BuiltinTimes:
    full_ms: float  # under full CUDA graphs: prefix sum, fill, kernel, persistent copies
    bare_ms: float  # without full CUDA graphs: prefix sum and kernel
    host_ms: float  # the full-graph step, eager, host clock


@dataclass
class Row:
    case: str
    keys: int
    ours_ms: float = 0.0
    ours_host_ms: float = 0.0
    bound_ms: float = 0.0
    copy_ms: float = 0.0
    builtins: list[BuiltinTimes] = field(default_factory=list)
    differs_by_design: bool = False  # padding rows at query length 1 (see the module docstring)

    @property
    def ratio(self) -> float:
        return self.ours_ms / self.bound_ms


def run(case: Case, device: torch.device, builtins: list, args) -> Row | None:
    """Check the batch's plans (None: they differ) and, unless --check-only, time them."""
    max_len = max(case.our_lengths())
    max_model_len = max(max_len, args.max_model_len)
    max_num_seqs = max(len(case.seq_lens), args.max_num_seqs)
    bs, qlen = case.block_size, case.qlen
    table, seq, slots = make_batch(case, device, -(-max_model_len // bs))
    num_reqs = table.shape[0]
    keys = sum(case.our_lengths())
    buffers = DecodePlanBuffers.allocate(num_reqs, table.shape[1], bs, device, max_keys=slots + num_reqs * qlen)

    def ours():
        return plan_decode_triton(buffers, table, seq, qlen, max(case.seq_lens))

    want_qo, want_indptr, want_indices = reference_plan(case, table, seq)
    buffers.kv_indices.fill_(-1)
    got = ours()
    checks = {
        "qo_indptr": torch.equal(got.qo_indptr, want_qo),
        "kv_indptr": torch.equal(got.kv_indptr, want_indptr),
        "kv_indices": torch.equal(got.kv_indices[:keys], want_indices),
        "untouched past the keys": bool((buffers.kv_indices[keys:] == -1).all()),
    }
    del want_qo, want_indptr, want_indices
    failed = [f"ours: {k}" for k, ok in checks.items() if not ok]

    qsl = query_start_loc(case, device)
    indices = torch.full((max_num_seqs * max_model_len,), -7, dtype=torch.int32, device=device)
    steps = [builtin_planner.BuiltinStep(b, table, seq, qsl, qlen, bs, case.pad_rows, indices, max_num_seqs)
             for b in builtins]
    for step in steps:
        indices.fill_(-7)  # a kernel that wrote nothing shows
        indptr, written = step()
        failed += [f"{step.builtin.label}: {what}"
                   for what in builtin_differences(case, indptr, written, got, step.builtin.fills)]
    if failed:
        print(f"{case.name}: plans differ: {failed}", flush=True)
        return None
    row = Row(case=case.name, keys=keys, differs_by_design=case.builtin_lengths() != case.our_lengths())
    if args.check_only:
        return row

    fill_target = torch.empty(keys, dtype=torch.int32, device=device)
    copy_source = torch.ones(keys, dtype=torch.int32, device=device)
    timing = (args.calls, args.replays, args.trials)
    row.ours_ms = graph_ms(ours, *timing)
    row.ours_host_ms, *builtin_host = host_ms([ours, *steps], HOST_REPS)
    for step, step_host_ms in zip(steps, builtin_host):
        row.builtins.append(BuiltinTimes(full_ms=graph_ms(step, *timing),
                                         bare_ms=graph_ms(lambda s=step: s(full_graphs=False), *timing),
                                         host_ms=step_host_ms))
    row.bound_ms = min(graph_ms(lambda: fill_target.fill_(7), *timing), graph_ms(fill_target.zero_, *timing))
    row.copy_ms = graph_ms(lambda: fill_target.copy_(copy_source), *timing)
    return row


def _picked(case: Case, args) -> bool:
    return not args.only or any(part in case.name for part in args.only.split(","))


def launch_of(case: Case, device: torch.device) -> str:
    """The launch shape the planner picks for a batch (kernel, its constants, programs)."""
    num_reqs = len(case.seq_lens)
    shape = planning_triton.launch_shape_of(planning_triton._num_programs(device.index or 0), num_reqs,
                                            max(max(case.seq_lens), case.qlen))
    return " ".join(str(x) for x in shape)


def _time_ours_and_bound(case: Case, device: torch.device, args) -> tuple[float, float]:
    table, seq, slots = make_batch(case, device)
    buffers = DecodePlanBuffers.allocate(table.shape[0], table.shape[1], case.block_size, device,
                                         max_keys=slots + table.shape[0] * case.qlen)
    keys = sum(case.our_lengths())
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
            ms, bound = _time_ours_and_bound(case, device, args)
            cells.append(f"{ms:.4f} ({ms / bound:.2f}x, {launch_of(case, device)})")
            torch.cuda.empty_cache()
        label = ", ".join(f"{k}={v}" for k, v in config.items()) or "as shipped"
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


# ---------------------------------------------------------------------------------------
# Report


def header(builtins: list) -> str:
    labels = [b.label for b in builtins]
    cols = (["batch", "keys", "ours ms"] + [f"{x} ms, full graphs (x ours)" for x in labels]
            + [f"{x} ms, no full graphs (x ours)" for x in labels]
            + ["ours host ms"] + [f"{x} host ms (x ours)" for x in labels]
            + ["bound ms (write)", "ours / bound", "copy ms (read + write)", "ours launch"])
    return "| " + " | ".join(cols) + " |\n" + "|---" * len(cols) + "|"


def line(row: Row, launch: str) -> str:
    def vs(ms: float, base: float, digits: int) -> str:
        return f"{ms:.{digits}f} ({ms / base:.1f}x)"

    cells = [row.case + (" *" if row.differs_by_design else ""), f"{row.keys:,}", f"{row.ours_ms:.4f}"]
    cells += [vs(b.full_ms, row.ours_ms, 4) for b in row.builtins]
    cells += [vs(b.bare_ms, row.ours_ms, 4) for b in row.builtins]
    cells += [f"{row.ours_host_ms:.3f}"] + [vs(b.host_ms, row.ours_host_ms, 3) for b in row.builtins]
    cells += [f"{row.bound_ms:.4f}", f"{row.ratio:.2f}", f"{row.copy_ms:.4f}", launch]
    return "| " + " | ".join(cells) + " |"


def summary(rows: list[Row], builtins: list) -> list[str]:
    out = []
    for i, b in enumerate(builtins):
        def span(ratios: list[float]) -> str:
            return (f"{min(ratios):.1f}x to {max(ratios):.1f}x, geometric mean "
                    f"{statistics.geometric_mean(ratios):.1f}x")

        full = [r.builtins[i].full_ms / r.ours_ms for r in rows]
        bare = [r.builtins[i].bare_ms / r.ours_ms for r in rows]
        host = [r.builtins[i].host_ms / r.ours_host_ms for r in rows]
        out.append(f"{b.label} over ours: GPU under full graphs {span(full)}; without full graphs {span(bare)}; "
                   f"host {span(host)}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-source", action="append", default=[], type=Path, metavar="PATH",
                    help="an unpacked vLLM sdist folder, or its vllm/v1/attention/backends/mla/"
                         "rocm_aiter_mla.py: time that release's built-in step beside ours (repeatable)")
    ap.add_argument("--max-num-seqs", type=int, default=0,
                    help="size the built-in's page-index buffer for this many requests (default: the batch's)")
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="size the built-in's page-index buffer and the block table's width for this many "
                         "keys per request (default: the batch's longest request)")
    ap.add_argument("--calls", type=int, default=10, help="planner calls per captured graph")
    ap.add_argument("--replays", type=int, default=10, help="graph replays per trial")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--only", default="",
                    help="run only the batches whose name contains one of these (comma-separated)")
    ap.add_argument("--check-only", action="store_true",
                    help="check the plans, time nothing (runs on the CPU under TRITON_INTERPRET=1)")
    ap.add_argument("--programs", type=int, default=16,
                    help="on the CPU: the planner's grid (no GPU to ask for its multiprocessors)")
    ap.add_argument("--sweep", action="store_true", help="time launch shapes of our planner")
    ap.add_argument("--configs", default="",
                    help="with --sweep: planner constants to time, e.g. "
                         "'ROWS_MAX_LEN=2048,ROW_ELEMS=8192;RUN_TILES=4' (one configuration per ';')")
    args = ap.parse_args()
    try:
        builtins = [builtin_planner.load(path) for path in args.vllm_source]
    except builtin_planner.SourceError as exc:
        print(f"--vllm-source: {exc}", file=sys.stderr)
        return 2
    for b in builtins:
        fill = "fills its index buffer with -1" if b.fills else "does not fill its index buffer"
        print(f"{b.label}: {b.path}: {b.kernel_name} (chunks of {b.chunk} keys), {fill} under full CUDA graphs")
    if torch.cuda.is_available():
        device = torch.device("cuda")
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}")
    elif args.check_only:
        device = torch.device("cpu")
        planning_triton._num_programs = lambda device_index: args.programs
        print(f"CPU (Triton's interpreter), torch {torch.__version__}, Triton {triton.__version__}")
    else:
        print("timing needs a GPU (--check-only checks the plans on the CPU)", file=sys.stderr)
        return 2
    if args.sweep:
        return sweep(device, args)
    if not args.check_only:
        warm = torch.randn(4096, 4096, device=device)
        for _ in range(50):
            warm @ warm  # clocks up before the first case
        print(header(builtins))
    rows = []
    for case in cases():
        if not _picked(case, args):
            continue
        row = run(case, device, builtins, args)
        if row is None:
            return 1
        rows.append(row)
        if args.check_only:
            print(f"ok: {case.name}: {row.keys:,} keys", flush=True)
        else:
            print(line(row, launch_of(case, device)), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if not rows:
        print("no batch matches --only", file=sys.stderr)
        return 2
    if any(r.differs_by_design for r in rows):
        print("* padding rows at query length 1: the built-in plans them 0 keys, ours 1; compared on the keys "
              "both plan")
    print(f"all plans equal ({len(rows)} batches, {len(builtins)} built-in)")
    if not args.check_only:
        worst = max(rows, key=lambda r: r.ratio)
        print(f"worst ours / bound: {worst.ratio:.2f} ({worst.case})")
        for text in summary(rows, builtins):
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
