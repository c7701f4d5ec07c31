#!/usr/bin/env python3
"""Decode planning per step: the fused Triton planner against the PyTorch planner, side by side.

Plain PyTorch + Triton on a GPU (no vLLM). For each batch:

* ``pytorch``: ``plan_decode_into`` as the metadata builder called it before the Triton
  planner (no workspace, block table narrowed to the longest request, query_start_loc);
  its scratch is requests x longest request.
* ``triton``: ``plan_decode_triton`` (one launch; persistent memory: plan buffers sized by
  the KV cache's slot count).

Both plans are checked equal first. Times are device time per step (CUDA events around
each call, the GPU kept busy while the host launches it, synchronised between calls,
median of N after warm-up) and host time per call until it returns (what the eager
metadata builder pays each step; vLLM builds metadata eagerly, then replays the graph).
Scratch is the caching allocator's peak above the persistent buffers during one call.

Usage::

    PYTHONPATH=backend/src python backend/bench/planning.py [--reps N]

Exit status 1 if a plan differs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from vllm_aiter_mla.planning import DecodePlanBuffers, plan_decode_into
from vllm_aiter_mla.planning_triton import plan_decode_triton


@dataclass(frozen=True)
class Case:
    name: str
    seq_lens: tuple[int, ...]
    block_size: int
    max_model_len: int


def cases() -> list[Case]:
    return [
        Case("64 requests x 4k", (4096,) * 64, 16, 4096),
        Case("512 x 32k", (32768,) * 512, 16, 32768),
        Case("256: one at 128k, 255 at 1k", (131072,) + (1024,) * 255, 16, 131072),
        Case("1024: one at 160k, 1023 at 512 (block size 1)", (163840,) + (512,) * 1023, 1, 163840),
    ]


def make_batch(case: Case, device: torch.device, gen: torch.Generator):
    bs = case.block_size
    blocks = [-(-s // bs) for s in case.seq_lens]
    num_cache_blocks = sum(blocks) + 16
    width = -(-case.max_model_len // bs)
    perm = torch.randperm(num_cache_blocks, generator=gen).to(torch.int32)
    table = torch.zeros(len(blocks), width, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks):
        table[b, :n] = perm[used : used + n]
        used += n
    seq = torch.tensor(case.seq_lens, dtype=torch.int32)
    qsl = torch.arange(len(blocks) + 1, dtype=torch.int32)
    return table.to(device), seq.to(device), qsl.to(device), num_cache_blocks * bs


def device_ms(fn, reps: int) -> float:
    """GPU time of one call: the GPU is kept busy (about 1 ms) while the host launches it,
    so the interval between the events holds the planner's kernels, not launch latency."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
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


def scratch_mb(fn) -> float:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def _mib(*tensors: torch.Tensor) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def run(case: Case, device: torch.device, reps: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    table, seq, qsl, slots = make_batch(case, device, gen)
    num_reqs, width = table.shape
    bs = case.block_size
    max_seq = max(case.seq_lens)
    narrow = table[:, : -(-max_seq // bs)]
    old_buffers = DecodePlanBuffers.allocate(num_reqs, width, bs, device)
    new_buffers = DecodePlanBuffers.allocate(num_reqs, width, bs, device, max_keys=slots + num_reqs)

    def old():
        return plan_decode_into(old_buffers, narrow, seq, qsl)

    def new():
        return plan_decode_triton(new_buffers, table, seq, 1, max_seq)

    a, b = old(), new()
    total = sum(case.seq_lens)
    same = (torch.equal(a.qo_indptr, b.qo_indptr) and torch.equal(a.kv_indptr, b.kv_indptr)
            and torch.equal(a.kv_indices[:total], b.kv_indices[:total]))
    row = {
        "case": case.name,
        "same": same,
        "old_ms": device_ms(old, reps),
        "new_ms": device_ms(new, reps),
        "old_host_ms": host_ms(old, reps),
        "new_host_ms": host_ms(new, reps),
        "old_scratch": scratch_mb(old),
        "new_scratch": scratch_mb(new),
        "old_persistent": _mib(old_buffers.kv_indices, old_buffers.positions),
        "new_persistent": _mib(new_buffers.kv_indices, new_buffers.positions),
    }
    # frees them (old and new share these variables, so rebinding, not del)
    table = seq = qsl = narrow = old_buffers = new_buffers = a = b = None
    torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    warm = torch.randn(4096, 4096, device=device)
    for _ in range(50):
        warm @ warm  # clocks up before the first case
    rows = [run(c, device, args.reps) for c in cases()]
    print("| batch | PyTorch planner: GPU / host ms per step | scratch per step "
          "| Triton planner: GPU / host ms per step | scratch per step "
          "| plan buffers (PyTorch -> Triton) | plans equal |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['old_ms']:.3f} / {r['old_host_ms']:.3f} | {r['old_scratch']:.0f} MB "
              f"| {r['new_ms']:.3f} / {r['new_host_ms']:.3f} | {r['new_scratch']:.0f} MB "
              f"| {r['old_persistent']:.0f} MB -> {r['new_persistent']:.0f} MB | {r['same']} |")
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
