#!/usr/bin/env python3
"""Decode planning + reference MLA decode under CUDA graph capture, and planning time.

Plain PyTorch (no vLLM). Two parts:

1. Correctness. Persistent buffers (block table, sequence lengths, query_start_loc,
   q, KV cache, plan buffers + workspace, output) are allocated once; one
   ``torch.cuda.CUDAGraph`` captures ``plan_decode_into`` followed by the reference
   ``mla_decode_fwd`` (with a static ``max_seqlen_k``). Every replay first rewrites the
   batch contents in place (new sequence lengths, block tables, q and KV values; same
   shapes) and is compared with an eager computation on fresh tensors
   (``plan_decode`` + ``decode.mla_decode`` with the reference kernels): the plan must
   be identical, the output equal within a tight tolerance. A per-request host loop
   builds the plan a third, independent way. The script also checks that
   ``plan_decode_into`` with a workspace makes no allocation (CUDA caching-allocator
   counters) and no host synchronisation (``torch.cuda.set_sync_debug_mode``).

2. Planning time per decode step for batch 1/64/256/512 x sequence length 4k/32k x
   block size 1/16 (every request at that length, random block tables):

   * loop:        per-request Python loop on host copies of the block table and
                  sequence lengths (as an engine keeps them), then a copy to the GPU
   * plan_decode: the allocating planner (one host synchronisation)
   * eager:       ``plan_decode_into`` with a workspace, block table narrowed to the
                  blocks the batch needs
   * graph:       the same call captured in a CUDA graph and replayed
   * graph/full:  captured on the whole block table (sized for the longest length
                  benchmarked, as a graph captured for the maximum model length
                  would be); equals "graph" at that length

   Device events around each step (synchronised between steps), warm-ups first,
   median of N.

Usage::

    PYTHONPATH=backend/src python backend/bench/decode_graph.py [--quick]
    PYTHONPATH=backend/src python backend/bench/decode_graph.py --device cpu --quick

On the CPU the graph parts are skipped and host clocks replace device events.
Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_aiter_mla import reference
from vllm_aiter_mla.decode import mla_decode
from vllm_aiter_mla.kernels import load_kernels
from vllm_aiter_mla.planning import DecodePlan, DecodePlanBuffers, PlanWorkspace, plan_decode, plan_decode_into

KV_LORA_RANK = 512
ROPE_DIM = 64
HEAD_DIM = KV_LORA_RANK + ROPE_DIM  # 576
SCALE = (128 + ROPE_DIM) ** -0.5  # DeepSeek-V2/V3 qk_head_dim 192

_failures: list[str] = []


def fail(msg: str) -> None:
    _failures.append(msg)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------
# The naive baseline: a per-request loop on the host.
# --------------------------------------------------------------------------------------


def plan_loop(
    block_table_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    query_start_loc_cpu: torch.Tensor,
    block_size: int,
    device: torch.device,
) -> DecodePlan:
    """Straightforward planning: loop over the requests on the host, build each
    request's slot ids from its block-table row, concatenate, copy to the device."""
    offsets = torch.arange(block_size, dtype=torch.int32)
    kv_indptr = [0]
    pieces = []
    for b, n in enumerate(seq_lens_cpu.tolist()):
        blocks = block_table_cpu[b, : cdiv(n, block_size)]
        slots = (blocks.unsqueeze(1) * block_size + offsets).reshape(-1)[:n]
        pieces.append(slots)
        kv_indptr.append(kv_indptr[-1] + n)
    num_reqs = len(kv_indptr) - 1
    kv_indices = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int32)
    return DecodePlan(query_start_loc_cpu.to(device=device, dtype=torch.int32),
                      torch.tensor(kv_indptr, dtype=torch.int32).to(device), kv_indices.to(device),
                      torch.ones(num_reqs, dtype=torch.int32).to(device))


def compare_plans(got: DecodePlan, want: DecodePlan, num_reqs: int) -> str | None:
    """None if equal (kv_indices compared over the meaningful prefix), else why not."""
    if not torch.equal(got.qo_indptr[: num_reqs + 1].cpu(), want.qo_indptr.cpu()):
        return "qo_indptr differs"
    if not torch.equal(got.kv_indptr[: num_reqs + 1].cpu(), want.kv_indptr.cpu()):
        return "kv_indptr differs"
    total = int(want.kv_indptr[-1])
    a = got.kv_indices[:total].cpu()
    b = want.kv_indices[:total].cpu()
    if not torch.equal(a, b):
        bad = int((a != b).sum())
        return f"kv_indices differ at {bad} of {total} entries"
    if not torch.equal(got.kv_last_page_lens[:num_reqs].cpu(), want.kv_last_page_lens.cpu()):
        return "kv_last_page_lens differs"
    return None


# --------------------------------------------------------------------------------------
# Part 1: correctness under capture
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    num_reqs: int
    heads: int
    block_size: int
    max_blocks: int
    q_len: int
    dtype: torch.dtype
    rtol: float
    atol: float


CASES = (
    Case("fp32 B=8 H=16 bs=16 q_len=1", 8, 16, 16, 32, 1, torch.float32, 1e-5, 1e-5),
    Case("bf16 B=6 H=128 bs=1 q_len=2", 6, 128, 1, 300, 2, torch.bfloat16, 1.6e-2, 1e-2),
    Case("bf16 B=32 H=16 bs=64 q_len=1", 32, 16, 64, 8, 1, torch.bfloat16, 1.6e-2, 1e-2),
)


def _new_lens(replay: int, case: Case, gen: torch.Generator) -> torch.Tensor:
    b, bs, ql = case.num_reqs, case.block_size, case.q_len
    max_slots = case.max_blocks * bs
    if replay == 0:
        lens = torch.full((b,), max_slots)
    elif replay == 1:
        lens = torch.full((b,), ql)  # the shortest possible: only the new tokens
    else:
        lens = torch.randint(ql, max_slots + 1, (b,), generator=gen)
        # block boundaries: exactly k blocks, one past, and the longest
        edges = torch.tensor([bs, bs + 1, 2 * bs - 1, max_slots]).clamp(ql, max_slots)
        lens[: min(b, 4)] = edges[torch.randperm(4, generator=gen)][: min(b, 4)]
        lens = lens[torch.randperm(b, generator=gen)]
        if replay == 3:
            lens[-1] = ql  # a CUDA-graph padding row as the builder plans it: qlen keys (AITER needs keys >= queries)
    return lens.to(torch.int32)


def run_case(case: Case, replays: int, device: torch.device, use_graph: bool, seed: int) -> bool:
    gen = torch.Generator().manual_seed(seed)
    b, h, bs, mb, ql = case.num_reqs, case.heads, case.block_size, case.max_blocks, case.q_len
    max_slots = mb * bs
    num_cache_blocks = b * mb + mb  # a few spare so tables differ between replays
    tokens = b * ql

    # Persistent inputs, outputs and plan buffers: fixed addresses for the graph.
    block_table = torch.zeros(b, mb, dtype=torch.int32, device=device)
    seq_lens = torch.full((b,), max_slots, dtype=torch.int32, device=device)
    query_start_loc = torch.arange(0, tokens + 1, ql, dtype=torch.int32, device=device)
    q = torch.zeros(tokens, h, HEAD_DIM, dtype=case.dtype, device=device)
    kv_cache = torch.zeros(num_cache_blocks, bs, HEAD_DIM, dtype=case.dtype, device=device)
    o = torch.zeros(tokens, h, KV_LORA_RANK, dtype=case.dtype, device=device)
    buffers = DecodePlanBuffers.allocate(b, mb, bs, device)
    workspace = PlanWorkspace.allocate(buffers)

    def fill(replay: int) -> None:
        lens = _new_lens(replay, case, gen)
        table = torch.randperm(num_cache_blocks, generator=gen)[: b * mb].view(b, mb).to(torch.int32)
        if replay % 2:
            # entries past a request's blocks: zero padding on odd replays, stale ids otherwise
            used = (lens.to(torch.int64) + bs - 1) // bs
            table[torch.arange(mb).unsqueeze(0) >= used.unsqueeze(1)] = 0
        seq_lens.copy_(lens)
        block_table.copy_(table)
        q.copy_(torch.randn(q.shape, generator=gen).to(case.dtype))
        kv_cache.copy_(torch.randn(kv_cache.shape, generator=gen).to(case.dtype))
        # Every row must be rewritten; the non-persistent multi-token contract wants a zeroed o.
        o.fill_(float("nan") if ql == 1 else 0.0)

    def step() -> DecodePlan:
        plan = plan_decode_into(buffers, block_table, seq_lens, query_start_loc, workspace=workspace)
        reference.mla_decode_fwd(q, kv_cache.view(-1, 1, 1, HEAD_DIM), o, *_plan_args(plan), ql, page_size=1,
                                 nhead_kv=1, sm_scale=SCALE, max_seqlen_k=max_slots)
        return plan

    graph = None
    fill(0)
    if use_graph:
        try:
            graph, plan = capture(step, warmup=3)
        except Exception as exc:  # report the capture failure precisely
            print(f"  [{case.name}] capture FAIL: {type(exc).__name__}: {exc}")
            fail(f"capture {case.name}: {type(exc).__name__}: {exc}")
            return False

    ok_all = True
    kernels = load_kernels("reference")
    for r in range(replays):
        fill(r)
        if graph is not None:
            graph.replay()
        else:
            plan = step()
        got_o = o.clone()

        # Eager oracle on fresh tensors.
        bt_e, sl_e, qsl_e = block_table.clone(), seq_lens.clone(), query_start_loc.clone()
        plan_e = plan_decode(bt_e, sl_e, qsl_e, bs)
        o_e = mla_decode(q.clone(), kv_cache.clone(), plan_e, kernels=kernels, kv_lora_rank=KV_LORA_RANK, scale=SCALE,
                         max_seqlen_q=ql, decode_heads=h, out_dtype=case.dtype)
        plan_l = plan_loop(bt_e.cpu(), sl_e.cpu(), qsl_e.cpu(), bs, device)

        problems = []
        why = compare_plans(plan, plan_e, b)
        if why:
            problems.append(f"plan vs plan_decode: {why}")
        why = compare_plans(plan_l, plan_e, b)
        if why:
            problems.append(f"loop plan vs plan_decode: {why}")
        diff = (got_o.float() - o_e.float()).abs()
        max_diff = float(diff.nan_to_num(nan=float("inf")).max())
        if not torch.allclose(got_o.float(), o_e.float(), rtol=case.rtol, atol=case.atol):
            problems.append(f"output differs: max |diff| {max_diff:.3g} (rtol {case.rtol}, atol {case.atol})")
        lens = sl_e.tolist()
        total = sum(lens)
        tag = "PASS" if not problems else "FAIL"
        print(
            f"  [{case.name}] replay {r}: {tag}  keys={total} lens min/max={min(lens)}/{max(lens)} "
            f"max|out diff|={max_diff:.2e}" + ("" if not problems else "  <- " + "; ".join(problems))
        )
        if problems:
            ok_all = False
            fail(f"{case.name} replay {r}: {'; '.join(problems)}")
    return ok_all


def check_no_alloc_no_sync(device: torch.device) -> None:
    """plan_decode_into with a workspace: no allocation, no host synchronisation."""
    b, mb, bs = 64, 256, 16
    table = torch.randperm(b * mb, device=device).view(b, mb).to(torch.int32)
    lens = torch.randint(1, mb * bs + 1, (b,), device=device, dtype=torch.int32)
    qsl = torch.arange(b + 1, dtype=torch.int32, device=device)
    buffers = DecodePlanBuffers.allocate(b, mb, bs, device)
    workspace = PlanWorkspace.allocate(buffers)
    plan_decode_into(buffers, table, lens, qsl, workspace=workspace)  # warm
    plan_decode_into(buffers, table, lens, qsl)
    torch.cuda.synchronize()

    def count(fn: Callable[[], object]) -> tuple[int, int]:
        torch.cuda.synchronize()
        s0 = torch.cuda.memory_stats(device)
        fn()
        torch.cuda.synchronize()
        s1 = torch.cuda.memory_stats(device)
        key_n, key_b = "allocation.all.allocated", "requested_bytes.all.allocated"
        return s1.get(key_n, 0) - s0.get(key_n, 0), s1.get(key_b, 0) - s0.get(key_b, 0)

    n_ws, bytes_ws = count(lambda: plan_decode_into(buffers, table, lens, qsl, workspace=workspace))
    n_no, bytes_no = count(lambda: plan_decode_into(buffers, table, lens, qsl))
    tag = "PASS" if n_ws == 0 else "FAIL"
    print(
        f"  allocation check (B={b}, {mb} blocks x {bs}): with workspace {n_ws} allocations "
        f"({bytes_ws} bytes) -> {tag}; without workspace {n_no} allocations ({bytes_no} bytes)"
    )
    if n_ws:
        fail(f"plan_decode_into with a workspace allocated {n_ws} times ({bytes_ws} bytes)")
        for site in _alloc_sites(lambda: plan_decode_into(buffers, table, lens, qsl, workspace=workspace)):
            print(f"    allocated by: {site}")

    # Host synchronisation: the sync debug mode raises on any synchronising call.
    o = torch.empty(b, 16, KV_LORA_RANK, device=device, dtype=torch.bfloat16)
    qx = torch.randn(b, 16, HEAD_DIM, device=device, dtype=torch.bfloat16)
    kv = torch.randn(b * mb * bs, 1, 1, HEAD_DIM, device=device, dtype=torch.bfloat16)
    for label, fn in (
        ("plan_decode_into (workspace)", lambda: plan_decode_into(buffers, table, lens, qsl, workspace=workspace)),
        (
            "reference mla_decode_fwd (static max_seqlen_k)",
            lambda: reference.mla_decode_fwd(
                qx, kv, o, *_plan_args(plan_decode_into(buffers, table, lens, qsl, workspace=workspace)),
                1, sm_scale=SCALE, max_seqlen_k=mb * bs,
            ),
        ),
    ):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
            result = "PASS (no host sync)"
        except RuntimeError as exc:
            result = f"FAIL: {exc}"
            fail(f"{label} synchronises with the host: {exc}")
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        print(f"  sync check, {label}: {result}")


def _alloc_sites(fn: Callable[[], object]) -> list[str]:
    """Where the caching allocator was asked for memory during fn (Python frames)."""
    try:
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
        try:
            fn()
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    except Exception as exc:  # diagnostics only
        return [f"(memory history unavailable: {type(exc).__name__}: {exc})"]
    sites = []
    for trace in snap.get("device_traces", []):
        for ev in trace:
            if ev.get("action") != "alloc":
                continue
            frames = [
                f"{fr['filename'].rsplit('/', 1)[-1]}:{fr['line']} ({fr['name']})"
                for fr in ev.get("frames", [])
                if fr.get("filename", "").endswith(".py")
            ]
            sites.append(f"{ev.get('size')} bytes at " + " <- ".join(frames[:2]))
    return sites or ["(no allocation recorded)"]


def _plan_args(plan: DecodePlan) -> tuple[torch.Tensor, ...]:
    return plan.qo_indptr, plan.kv_indptr, plan.kv_indices, plan.kv_last_page_lens


# --------------------------------------------------------------------------------------
# Part 2: planning time
# --------------------------------------------------------------------------------------


class Timer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def one(self, fn: Callable[[], object]) -> float:
        """Milliseconds of one call, device idle before it and drained after it."""
        self.sync()
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def median(self, fn: Callable[[], object], warmup: int, reps: int) -> float:
        for _ in range(warmup):
            fn()
        return statistics.median(self.one(fn) for _ in range(reps))


def capture(fn: Callable[[], object], warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm `fn` up on a side stream, capture one call; return the graph and what
    the captured call returned (its tensors are the graph's outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    torch.cuda.synchronize()
    return graph, result


@dataclass
class Row:
    batch: int
    seq_len: int
    block_size: int
    loop: float
    loop_note: str
    alloc: float
    eager: float
    graph: float | None
    graph_full: float | None


def bench(
    device: torch.device,
    batches: list[int],
    seq_lens: list[int],
    block_sizes: list[int],
    reps: int,
    loop_reps: int,
    loop_budget_s: float,
    use_graph: bool,
) -> list[Row]:
    timer = Timer(device)
    rows = []
    max_len = max(seq_lens)
    for bs in block_sizes:
        for b in batches:
            mb_full = cdiv(max_len, bs)
            buffers = DecodePlanBuffers.allocate(b, mb_full, bs, device)
            workspace = PlanWorkspace.allocate(buffers)
            table = torch.zeros(b, mb_full, dtype=torch.int32, device=device)
            lens = torch.empty(b, dtype=torch.int32, device=device)
            qsl = torch.arange(b + 1, dtype=torch.int32, device=device)

            def plan_full() -> DecodePlan:
                return plan_decode_into(buffers, table, lens, qsl, workspace=workspace)

            lens.fill_(max_len)
            graph_full = capture(plan_full)[0] if use_graph else None

            for seq_len in seq_lens:
                nb = cdiv(seq_len, bs)
                table.zero_()
                table[:, :nb] = torch.randperm(b * nb, device=device).view(b, nb).to(torch.int32)
                lens.fill_(seq_len)
                narrow = table[:, :nb]

                def plan_eager() -> DecodePlan:
                    return plan_decode_into(buffers, narrow, lens, qsl, workspace=workspace)

                # Same tensors from every path (checked before timing).
                want = plan_decode(narrow, lens, qsl, bs)
                table_cpu, lens_cpu, qsl_cpu = narrow.cpu(), lens.cpu(), qsl.cpu()
                checks = {"eager": plan_eager, "loop": lambda: plan_loop(table_cpu, lens_cpu, qsl_cpu, bs, device)}
                graph = None
                if use_graph:
                    graph = capture(plan_eager)[0]
                    checks["graph"] = _replayed(graph, buffers, b)
                    checks["graph/full"] = _replayed(graph_full, buffers, b)
                for name, fn in checks.items():
                    buffers.kv_indices.fill_(-7)
                    why = compare_plans(fn(), want, b)
                    if why:
                        print(f"  B={b} L={seq_len} bs={bs}: {name} plan differs from plan_decode: {why}")
                        fail(f"bench B={b} L={seq_len} bs={bs}: {name}: {why}")

                alloc_ms = timer.median(lambda: plan_decode(narrow, lens, qsl, bs), 3, reps)
                eager_ms = timer.median(plan_eager, 5, reps)
                graph_ms = timer.median(graph.replay, 5, reps) if graph else None
                full_ms = timer.median(graph_full.replay, 5, reps) if graph_full else None

                def loop() -> DecodePlan:
                    return plan_loop(table_cpu, lens_cpu, qsl_cpu, bs, device)

                first = timer.one(loop)  # also the warm-up
                n = max(1, min(loop_reps, int(loop_budget_s * 1e3 / max(first, 1e-3))))
                loop_ms = statistics.median(timer.one(loop) for _ in range(n))
                note = "" if n >= loop_reps else f"median of {n}"
                rows.append(Row(b, seq_len, bs, loop_ms, note, alloc_ms, eager_ms, graph_ms, full_ms))
                print(
                    f"  B={b:3d} L={seq_len:5d} bs={bs:2d}: loop {loop_ms:9.3f}  plan_decode {alloc_ms:7.3f}  "
                    f"eager {eager_ms:7.3f}  graph {_fmt(graph_ms)}  graph/full {_fmt(full_ms)} ms",
                    flush=True,
                )
                del graph
            # frees them (plan_full and plan_eager share these variables, so rebinding, not del)
            graph_full = buffers = workspace = table = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _replayed(graph: torch.cuda.CUDAGraph, buffers: DecodePlanBuffers, b: int) -> Callable[[], DecodePlan]:
    def fn() -> DecodePlan:
        graph.replay()
        return buffers.plan(b)

    return fn


def _fmt(ms: float | None, width: int = 7) -> str:
    return f"{ms:{width}.3f}" if ms is not None else f"{'-':>{width}}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.1f}x" if a is not None and b else "-"


def print_table(rows: list[Row]) -> None:
    head = (
        "| batch | seq len | block size | loop (ms) | plan_decode (ms) | eager (ms) | graph (ms) "
        "| graph, full width (ms) | loop/eager | eager/graph |"
    )
    print(head)
    print("|" + "|".join("---:" for _ in range(head.count("|") - 1)) + "|")
    for r in rows:
        loop = f"{r.loop:.3f}" + (f" ({r.loop_note})" if r.loop_note else "")
        print(
            f"| {r.batch} | {r.seq_len // 1024}k | {r.block_size} | {loop} | {r.alloc:.3f} | {r.eager:.3f} "
            f"| {_fmt(r.graph, 0).strip()} | {_fmt(r.graph_full, 0).strip()} "
            f"| {_ratio(r.loop, r.eager)} | {_ratio(r.eager, r.graph)} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (no graph capture)")
    ap.add_argument("--quick", action="store_true", help="small correctness run and a few benchmark points")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    device = torch.device(args.device)
    use_graph = device.type == "cuda"
    if use_graph and not torch.cuda.is_available():
        print("CUDA is not available; run with --device cpu", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)

    name = torch.cuda.get_device_name(device) if use_graph else "CPU"
    print(f"GPU: {name}")
    print(f"torch {torch.__version__}" + (f", CUDA {torch.version.cuda}" if use_graph else ""))
    if not use_graph:
        print("(CPU: CUDA graph capture, allocation and sync checks are skipped)")

    how = "captured in one CUDA graph ==" if use_graph else "eager on persistent buffers =="
    print("\n== Correctness: plan_decode_into + reference decode " + how)
    replays = 4 if args.quick else 8
    for i, case in enumerate(CASES):
        run_case(case, replays, device, use_graph, seed=args.seed + i)
    if use_graph:
        print("\n== Allocation and host-sync checks ==")
        check_no_alloc_no_sync(device)

    if args.quick:
        batches, seqs, block_sizes, reps, loop_reps = [1, 64], [4096], [1, 16], 10, 3
    else:
        batches, seqs, block_sizes, reps, loop_reps = [1, 64, 256, 512], [4096, 32768], [1, 16], 50, 7
    print(
        f"\n== Decode planning time per step (ms; median of {reps}, loop: median of up to {loop_reps}; "
        + ("CUDA events" if use_graph else "host clock")
        + ") =="
    )
    rows = bench(device, batches, seqs, block_sizes, reps, loop_reps, loop_budget_s=10.0, use_graph=use_graph)
    print()
    print(f"GPU: {name}; torch {torch.__version__}")
    print_table(rows)
    print(
        "\nloop: per-request Python loop over host copies of the block table and sequence lengths, "
        "then a copy to the GPU; plan_decode: allocating, one host sync; eager: plan_decode_into with "
        "a workspace, block table narrowed to the needed blocks; graph: that call captured and replayed; "
        f"graph, full width: captured on a block table sized for {max(seqs) // 1024}k keys."
    )

    print()
    if _failures:
        print(f"FAILED ({len(_failures)}):")
        for f in _failures:
            print(f"  - {f}")
        return 1
    print("ALL CHECKS PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
