#!/usr/bin/env python3
"""The start-up measurement of the own path's decode calls, run by hand: what it finds for each
DeepSeek-V3 layer shape and how long the whole measurement takes (the start-up time it adds to a
server), first and warm.

    PYTHONPATH=backend/src python3 backend/bench/measure_calls.py [--kernels aiter|reference]
        [--device cpu|cuda|cuda:N] [--warm-runs 3] [--stand-ins] [--quick]

Configurations: 128 query heads per GPU (tensor parallel 1) and 16 (tensor parallel 8), bf16 and fp8
KV, each with the calls of query lengths 1-4 (MTP with 3 speculative tokens): each line is one server
configuration, every call it makes measured as start-up measures them (``measure.measure_all``).
The whole measurement is all four configurations: first (in a fresh process, the device already
initialised, as vLLM has it by then: the first probe's kernel loads and allocations included), then
the best of --warm-runs more. --kernels aiter (default) on an AMD GPU with AITER: the answer a server
acts on. --kernels reference: the pure-PyTorch reference on any GPU or the CPU (the timing stand-in
where there is no AMD GPU). --stand-ins adds kernels wrapped around the chosen ones that leave V
unscaled (ROCm/aiter#6732), are 5 % off, or return NaN, to show the classifier. --quick: 16 heads,
query length 1 only. No vLLM needed.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from vllm_aiter_mla import measure
from vllm_aiter_mla.kernels import load_kernels

HEADS = (16, 128)  # DeepSeek-V3's 128 heads at tensor parallel 8 and 1
MAX_QLEN = 4


def stand_in(kernels, change):
    def mla_decode_fwd(q, kv, o, qo, kv_indptr, kv_indices, last, max_seqlen_q, **kwargs):
        result = kernels.mla_decode_fwd(q, kv, o, qo, kv_indptr, kv_indices, last, max_seqlen_q, **kwargs)
        change(o, kwargs)
        return result

    return dataclasses.replace(kernels, mla_decode_fwd=mla_decode_fwd)


def configurations(quick: bool, fp8: torch.dtype) -> list[tuple[int, torch.dtype, int]]:
    return [(heads, dtype, 1 if quick else MAX_QLEN) for heads in ((16,) if quick else HEADS)
            for dtype in (torch.bfloat16, fp8)]


def measure_every(kernels, configs, device) -> list[tuple[float, dict]]:
    """Each configuration's calls measured: (seconds, what was found) per configuration."""
    timed = []
    for heads, dtype, max_qlen in configs:
        started = time.perf_counter()
        found, _ = measure.measure_all(kernels, measure.layer_calls(heads, max_qlen, dtype, dtype, torch.bfloat16),
                                       device)
        timed.append((time.perf_counter() - started, found))
    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", choices=("aiter", "reference"), default="aiter")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--stand-ins", action="store_true", help="also kernels that are wrong in known ways")
    parser.add_argument("--quick", action="store_true", help="16 heads, query length 1 only")
    ns = parser.parse_args(argv)
    device = torch.device(ns.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    started = time.perf_counter()
    torch.zeros(1, device=device).add_(1).sum().item()  # the device initialised, as vLLM's is by start-up
    initialised = time.perf_counter() - started
    arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "") if device.type == "cuda" else ""
    fp8 = torch.float8_e4m3fnuz if "gfx942" in arch else torch.float8_e4m3fn
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device {device} ({name}), initialised in {initialised:.2f} s; fp8 {fp8}; torch {torch.__version__}")
    configs = configurations(ns.quick, fp8)

    started = time.perf_counter()
    kernels = load_kernels(ns.kernels)
    first = measure_every(kernels, configs, device)
    first_total = time.perf_counter() - started
    warm = [measure_every(kernels, configs, device) for _ in range(ns.warm_runs)]
    best = min(warm, key=lambda timed: sum(t for t, _ in timed)) if warm else first
    for (heads, dtype, max_qlen), (took, found), (cold, _) in zip(configs, best, first):
        kv = "fp8" if dtype.itemsize == 1 else "bf16"
        print(f"{ns.kernels:14} {heads:3} heads {kv:4} qlen 1-{max_qlen}: {took * 1000:7.1f} ms warm "
              f"({cold * 1000:7.1f} ms first)  {measure.summary(found)}")
    warm_total = sum(t for t, _ in best)
    print(f"whole measurement ({ns.kernels}, {len(configs)} configurations): first {first_total:.2f} s "
          f"(kernels loaded), then {warm_total:.2f} s (best of {ns.warm_runs} warm)")

    if ns.stand_ins:
        for label, chosen in (
                ("drops V scale", stand_in(kernels, lambda o, kw: kw.get("kv_scale") is not None
                                           and o.div_(kw["kv_scale"]))),
                ("5% off", stand_in(kernels, lambda o, kw: o.mul_(1.05))),
                ("NaN", stand_in(kernels, lambda o, kw: o.fill_(float("nan"))))):
            for (heads, dtype, max_qlen), (took, found) in zip(configs, measure_every(chosen, configs, device)):
                kv = "fp8" if dtype.itemsize == 1 else "bf16"
                print(f"{label:14} {heads:3} heads {kv:4} qlen 1-{max_qlen}: {took * 1000:7.1f} ms  "
                      f"{measure.summary(found)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
