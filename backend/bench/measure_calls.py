#!/usr/bin/env python3
"""The start-up measurement of the own path's decode calls, run by hand: what it finds for each
DeepSeek-V3 layer shape and how long it takes (the start-up time it adds to a server).

    PYTHONPATH=backend/src python3 backend/bench/measure_calls.py [--kernels aiter|reference] [--stand-ins]

Shapes: 128 query heads per GPU (tensor parallel 1) and 16 (tensor parallel 8), bf16 and fp8 KV,
query length up to 1-4 (MTP with 0-3 speculative tokens): each line is one server configuration,
every call it makes (one per query length), timed as start-up runs them (the first line also pays
for loading the kernels). --kernels aiter (default) on an AMD GPU with AITER: the answer a server
acts on. --kernels reference: the pure-PyTorch reference on any GPU or the CPU (the timing stand-in
where there is no AMD GPU). --stand-ins adds kernels wrapped around the chosen ones that leave V
unscaled at query lengths 2-4 (ROCm/aiter#6732), are 5 % off, or return NaN, to show the classifier.
No vLLM needed.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from vllm_aiter_mla import measure
from vllm_aiter_mla.kernels import load_kernels

HEADS = (16, 128)  # DeepSeek-V3's 128 heads at tensor parallel 8 and 1
MAX_QLENS = (1, 2, 3, 4)


def stand_in(kernels, change):
    def mla_decode_fwd(q, kv, o, qo, kv_indptr, kv_indices, last, max_seqlen_q, **kwargs):
        result = kernels.mla_decode_fwd(q, kv, o, qo, kv_indptr, kv_indices, last, max_seqlen_q, **kwargs)
        if 2 <= max_seqlen_q <= 4:
            change(o, kwargs)
        return result

    return dataclasses.replace(kernels, mla_decode_fwd=mla_decode_fwd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", choices=("aiter", "reference"), default="aiter")
    parser.add_argument("--stand-ins", action="store_true", help="also kernels that are wrong in known ways")
    ns = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    fp8 = torch.float8_e4m3fnuz if device.type == "cuda" and "gfx942" in getattr(
        torch.cuda.get_device_properties(device), "gcnArchName", "") else torch.float8_e4m3fn
    kernels = load_kernels(ns.kernels)
    runs = [(ns.kernels, kernels)]
    if ns.stand_ins:
        runs += [("drops V scale", stand_in(kernels, lambda o, kw: kw.get("kv_scale") is not None
                                            and o.div_(kw["kv_scale"]))),
                 ("5% off", stand_in(kernels, lambda o, kw: o.mul_(1.05))),
                 ("NaN", stand_in(kernels, lambda o, kw: o.fill_(float("nan"))))]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {device} ({name}), fp8 {fp8}")
    worst = 0.0
    for label, chosen in runs:
        for heads in HEADS:
            for dtype in (torch.bfloat16, fp8):
                for max_qlen in MAX_QLENS:
                    calls = measure.layer_calls(heads, max_qlen, dtype, dtype, torch.bfloat16)
                    started = time.perf_counter()
                    found, _ = measure.measure_all(chosen, calls, device)
                    took = time.perf_counter() - started
                    if label == ns.kernels:
                        worst = max(worst, took)
                    kv = "fp8" if dtype.itemsize == 1 else "bf16"
                    print(f"{label:14} {heads:3} heads {kv:4} qlen<={max_qlen}: {took * 1000:7.1f} ms  "
                          f"{measure.summary(found)}")
    print(f"start-up time added, slowest configuration ({ns.kernels}): {worst * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
