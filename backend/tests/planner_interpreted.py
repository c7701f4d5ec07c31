"""Run the Triton planner's kernels in Triton's interpreter (on the CPU) and compare every plan
with the PyTorch planner's; used by test_planning_triton_interpreted.py, in a process of its
own because TRITON_INTERPRET must be set before Triton is imported.

    TRITON_INTERPRET=1 python planner_interpreted.py PROGRAMS FAMILY

Prints one line per batch (its launch shape, requests and keys) and ends with status 1 at the
first plan that differs, naming the batch.
"""

from __future__ import annotations

import os
import random
import sys

import torch
from planning_batches import table_for

from vllm_aiter_mla import planning_triton as pt
from vllm_aiter_mla.planning import DecodePlanBuffers, plan_decode_into


def launch_kind(num_reqs: int, qlen: int, hint: int | None) -> str:
    """The kernel a batch gets: rows, grouped, walk or direct (the walk's direct search)."""
    shape = pt.launch_shape_of(pt._num_programs(0), num_reqs, None if hint is None else max(hint, qlen))
    return "direct" if shape[0] == "walk" and shape[2] else shape[0]


def check(name: str, lens: list[int], qlen: int, block_size: int, hint: int | None, seed: int = 0,
          short_by: int = 0) -> bool:
    """The Triton plan equals the PyTorch plan; with ``short_by`` the buffers hold that many keys
    fewer than the batch has: kv_indptr is clamped to the capacity, the keys that fit are the
    plan's, nothing is written past the capacity and the overflow counter says how many were
    dropped."""
    table, seq, slots = table_for(lens, qlen, block_size, seed)
    want = plan_decode_into(DecodePlanBuffers.allocate(len(lens), table.shape[1], block_size, "cpu"), table, seq,
                            None, uniform_qlen=qlen)
    total = int(want.kv_indptr[-1])
    capacity = total - short_by if short_by else slots + len(lens) * qlen
    buffers = DecodePlanBuffers.allocate(len(lens), table.shape[1], block_size, "cpu", max_keys=capacity)
    buffers.kv_indices.fill_(-7)
    buffers.kv_indptr.fill_(99)
    got = pt.plan_decode_triton(buffers, table, seq, qlen, hint)
    shape = pt.launch_shape_of(pt._num_programs(0), len(lens), None if hint is None else max(hint, qlen))
    fits = min(total, buffers.capacity)
    same = (torch.equal(got.qo_indptr, want.qo_indptr)
            and torch.equal(got.kv_indptr, want.kv_indptr.clamp(max=buffers.capacity))
            and torch.equal(got.kv_indices[:fits], want.kv_indices[:fits])
            and bool((buffers.kv_indices[fits:] == -7).all())
            and int(buffers.overflow) == total - fits)
    print(f"{'ok' if same else 'DIFFERENT'}: {name}: {shape}, {len(lens)} requests, {total} keys, qlen {qlen}, "
          f"block size {block_size}{f', capacity {buffers.capacity}' if short_by else ''}", flush=True)
    return same


def families(programs: int) -> dict[str, list[tuple]]:
    """Batches (name, lengths, qlen, block size, hint) that reach each kernel and each path of
    the tile walk at this grid size."""
    rng = random.Random(programs)
    t = pt.BLOCK_T
    walk = [
        ("ends on, before and after tiles", [t, t - 1, t + 1, 2 * t, 1, t - 2, 3 * t + 5, 1], 1, 16, None),
        ("short runs between long requests", [rng.choice([1, 7, t - 1, t, t + 1, rng.randint(1, 5000)])
                                              for _ in range(80)], 2, 1, None),
        ("one long among short ones", [rng.randint(1, 30) for _ in range(60)] + [9 * t + 3]
         + [rng.randint(1, 30) for _ in range(60)], 2, 16, None),
        ("interleaved short and long", [n for _ in range(30) for n in (rng.randint(1, 32), rng.randint(t, 4 * t))],
         3, 64, None),
        ("padding rows", [rng.randint(1, 3 * t) for _ in range(40)] + [0] * 5, 4, 16, None),
        ("short first and last, hint", [5] + [rng.randint(1, 4 * t) for _ in range(50)] + [t - 1], 1, 1, 4 * t),
        ("short requests only, a table narrower than the rows' tile", [rng.randint(0, 20) for _ in range(40)], 1,
         16, None),
    ]
    return {
        "walk": walk,
        "rows": [("rows", [rng.randint(0, 300) for _ in range(200)], 2, 16, 300),
                 ("one-key rows", [1] * 300, 1, 1, 1)],
        "grouped": [("grouped", [rng.randint(1, 2048) for _ in range(3)] + [2048], 1, 16, 2048),
                    ("grouped, two", [3, 2048], 2, 1, 2048)],
        "direct": [(f"direct, {n}", [rng.randint(1, 9000) for _ in range(n - 1)] + [9000], 2, 16, 9000)
                   for n in (1, 2, 3)],
    }


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("set TRITON_INTERPRET=1: this runs the kernels in Triton's interpreter", file=sys.stderr)
        return 2
    programs, family = int(argv[0]), argv[1]
    pt._num_programs = lambda device_index: programs  # no GPU to ask for its multiprocessors
    for case in families(programs)[family]:
        name, lens, qlen, _, hint = case
        kind = launch_kind(len(lens), qlen, hint)
        if kind != family:
            print(f"{name}: planned by {kind}, not {family}, with {programs} programs", file=sys.stderr)
            return 1
        if not check(*case):
            return 1
    # every kernel again with buffers too small for the batch (by one key, and by a third)
    name, lens, qlen, block_size, hint = families(programs)[family][0]
    total = sum(max(n, qlen) for n in lens)
    for short_by in sorted({1, total // 3}):
        if not check(f"{name}, too small", lens, qlen, block_size, hint, short_by=short_by):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
