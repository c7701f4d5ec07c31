#!/usr/bin/env python3
"""The decode planner's warm-up with an empty Triton cache: its kernels compiled one at a time
against compiled in threads, side by side.

Plain PyTorch + Triton on a GPU (no vLLM). Each run is a process of its own with a Triton
cache folder of its own (empty), so nothing is taken from memory or disk: it allocates the plan
buffers of a server with ``--max-num-seqs`` requests of at most ``--max-len`` keys and times
``warm_up()`` (every launch shape compiled, then launched once), as the backend's metadata
builder calls it before the first request.

Usage::

    PYTHONPATH=backend/src python backend/bench/warm_up.py [--max-num-seqs 1024] [--max-len 163840]
        [--threads 1,4,16]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def child(threads: int, max_reqs: int, max_len: int, block_size: int) -> int:
    import torch  # noqa: PLC0415

    from vllm_aiter_mla.planning import DecodePlanBuffers  # noqa: PLC0415
    from vllm_aiter_mla.planning_triton import warm_up  # noqa: PLC0415

    buffers = DecodePlanBuffers.allocate(max_reqs, -(-max_len // block_size), block_size, "cuda",
                                         max_keys=2**22)
    torch.cuda.synchronize()
    started = time.perf_counter()
    shapes = warm_up(buffers, max_len, threads)
    torch.cuda.synchronize()
    print(f"{shapes} {time.perf_counter() - started:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--max-len", type=int, default=163840, help="max_model_len plus the longest query")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", default="1,4,16", help="compile threads per run, comma-separated")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        return child(args.child, args.max_num_seqs, args.max_len, args.block_size)
    try:
        counts = [int(t) for t in args.threads.split(",")]
    except ValueError:
        print(f"--threads: {args.threads!r} is not a comma-separated list of integers", file=sys.stderr)
        return 2
    if not counts or min(counts) < 1:
        print("--threads: give at least one count, each 1 or more", file=sys.stderr)
        return 2
    print(f"warm_up() for {args.max_num_seqs} requests of at most {args.max_len} keys, block size "
          f"{args.block_size}, empty Triton cache per run")
    print("| threads | shapes | seconds | against one at a time |")
    print("|---|---|---|---|")
    first = None
    for threads in counts:
        with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
            env = {**os.environ, "TRITON_CACHE_DIR": cache}
            cmd = [sys.executable, __file__, "--child", str(threads), "--max-num-seqs", str(args.max_num_seqs),
                   "--max-len", str(args.max_len), "--block-size", str(args.block_size)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"warm-up with {threads} threads failed:\n{done.stderr.strip()}", file=sys.stderr)
            return 1
        shapes, seconds = done.stdout.split()[-2:]
        first = first or (threads, float(seconds))
        ratio = f"{first[1] / float(seconds):.2f}x faster than {first[0]}" if threads != first[0] else "-"
        print(f"| {threads} | {shapes} | {float(seconds):.1f} | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
