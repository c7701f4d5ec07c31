#!/usr/bin/env python3
"""What the crash-safe start-up measurement costs: a measurement child that only starts (imports and
the device's initialisation), then a layer's calls measured as a first start measures them (in a
child, recorded, then again in this process where the child found them served) and as a later start
does (its record read, then in this process: here the same process, so its kernels are warm; a new
server process measures as the first start's in-process part does). Prints one line each.

    PYTHONPATH=backend/src:runtime/src:backend/tests python3 backend/bench/crash_safe_start.py \
        [--device cuda:0] [--factory child_standins:right] [--heads 16] [--max-qlen 4] [--fp8]

--factory: how the child loads its kernels (``vllm_aiter_mla.measure_child:production`` on an AMD GPU
with AITER and vLLM; the default, the reference kernel and the remedy's CPU stand-in, runs anywhere,
e.g. an NVIDIA GPU without vLLM). The records go to a fresh temporary folder.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from vllm_aiter_mla import crash_safe, measure, measure_child


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--factory", default="child_standins:right")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--max-qlen", type=int, default=4)
    parser.add_argument("--fp8", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # this process's device initialised, as a server's is by then
    dtype = torch.float8_e4m3fn if args.fp8 else torch.bfloat16
    calls = measure.layer_calls(args.heads, args.max_qlen, dtype, dtype, torch.bfloat16)
    factory = measure_child.factory_of(args.factory)
    kernels, triton = factory("aiter", 4), factory("triton", 4)
    timeout = crash_safe.timeout_setting()

    started = time.perf_counter()
    out = crash_safe.run_child(measure_child.command(args.factory, calls, [], 4, device), timeout)
    print(f"a child that only starts: {time.perf_counter() - started:.2f} s (exit {out.returncode})", flush=True)

    with tempfile.TemporaryDirectory(prefix="measured-") as folder:
        for start in ("first start", "later start"):
            began = time.perf_counter()
            found = crash_safe.measure_layer(kernels, triton, calls, 4, device, args.factory,
                                             environ={**os.environ, crash_safe.RECORDS_ENV: folder})
            total = time.perf_counter() - began
            chosen = measure.serving(found.measured, found.remedy, found.flags)
            print(f"{start}: {total:.2f} s in all, {found.seconds:.2f} s of it in this process; the first "
                  f"measurement {found.first}; serving {chosen}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
