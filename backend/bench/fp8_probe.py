#!/usr/bin/env python3
"""ROCm/aiter#6732's start-up measurement, run by hand: what the own path's fp8 probe
(vllm_aiter_mla.fp8_probe) finds for each head count and verify length, and how long it takes.

    PYTHONPATH=backend/src python3 backend/bench/fp8_probe.py [--kernels aiter|reference] [--stand-ins]

--kernels aiter (default) on an AMD GPU with AITER: the answer the server would act on
(CORRECT: left alone; DROPS_V_SCALE: corrected by kv_scale; WRONG: the layer goes to vLLM's
built-in). --kernels reference runs the pure-PyTorch reference on any GPU (or the CPU);
--stand-ins adds two kernels wrapped around it, one that leaves V unscaled at query lengths 2-4 as
#6732 does and one that returns zeros there, to show the classifier on this machine. No vLLM needed.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from vllm_aiter_mla import fp8_probe
from vllm_aiter_mla.kernels import load_kernels

SHAPES = ((16, range(1, 5)), (128, range(1, 9)))  # heads, query lengths


def stand_in(kernels, change):
    def mla_decode_fwd(q, kv, o, qo, kv_indptr, kv_indices, last, max_seqlen_q, **kwargs):
        result = kernels.mla_decode_fwd(q, kv, o, qo, kv_indptr, kv_indices, last, max_seqlen_q, **kwargs)
        if kwargs.get("kv_scale") is not None and kwargs.get("work_meta_data") is not None and 2 <= max_seqlen_q <= 4:
            change(o, kwargs["kv_scale"])
        return result

    return dataclasses.replace(kernels, mla_decode_fwd=mla_decode_fwd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", choices=("aiter", "reference"), default="aiter")
    parser.add_argument("--stand-ins", action="store_true", help="also the #6732 and zeros stand-ins (reference)")
    ns = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    fp8 = torch.float8_e4m3fnuz if device.type == "cuda" and "gfx942" in getattr(
        torch.cuda.get_device_properties(device), "gcnArchName", "") else torch.float8_e4m3fn
    kernels = load_kernels(ns.kernels)
    runs = [(ns.kernels, kernels)]
    if ns.stand_ins:
        runs += [("drops V scale", stand_in(kernels, lambda o, s: o.div_(s))),
                 ("zeros", stand_in(kernels, lambda o, s: o.zero_()))]
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), {fp8}")
    for name, chosen in runs:
        for heads, qlens in SHAPES:
            started = time.perf_counter()
            found = fp8_probe.measure_all(chosen, heads=heads, qlens=qlens, persistent=True, fp8_dtype=fp8,
                                          device=device)
            if device.type == "cuda":
                torch.cuda.synchronize()
            took = (time.perf_counter() - started) * 1000
            print(f"{name:14} {heads:3} heads: " + ", ".join(f"qlen {q} {o.name}" for q, o in found.items())
                  + f"  ({took:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
