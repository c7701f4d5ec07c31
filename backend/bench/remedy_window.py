#!/usr/bin/env python3
"""The remedy on a GPU, where ROCm/aiter#5765 lives: a stand-in for AITER with a 32-bit window from
the cache's base (rows past 4 GiB read as zero) measured in the highest slots of a layer cache
larger than the window, and vLLM's own Triton MLA decode measured on the same probe; then the
whole start-up measurement of DeepSeek-V3's call sets (16 and 128 heads, bf16 and fp8, query
lengths 1-4), both kernels per call, first and warm. Prints one line per call and the times.

    PYTHONPATH=backend/src:backend/tests python3 backend/bench/remedy_window.py \
        --triton-file <vLLM's vllm/v1/attention/ops/triton_decode_attention.py> [--window-gib 4]

The reference kernel stands in for a right AITER (no AMD GPU needed); vLLM's Triton file is loaded
alone (remedy_interpreted.load: its two vLLM imports answered by a shim), so vLLM need not be
installed. Exits 1 unless the window stand-in is measured wrong, the Triton kernel correct, and the
served kernel for each query length is Triton's.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from vllm_aiter_mla import measure, remedy
from vllm_aiter_mla.kernels import load_kernels

BF16 = torch.bfloat16


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--triton-file", required=True)
    ap.add_argument("--window-gib", type=int, default=4)
    ap.add_argument("--warm-runs", type=int, default=3)
    args = ap.parse_args(argv)
    import measure_standins  # noqa: PLC0415  (backend/tests)
    from remedy_interpreted import load  # noqa: PLC0415  (backend/tests)

    ops = load(args.triton_file)
    device = torch.device("cuda")
    units = torch.cuda.get_device_properties(device).multi_processor_count
    triton = remedy.TritonDecode(remedy.NAME, ops.decode_attention_fwd,
                                 getattr(ops, "decode_attention_fwd_verify", None),
                                 remedy.kv_splits(4096, units))
    reference = load_kernels("reference")
    window = args.window_gib << 30
    rows = window // (576 * 2) + 300_000  # past the window by 300,000 bf16 rows
    cache = torch.zeros(rows, 1, 576, dtype=BF16, device=device)
    print(f"{torch.cuda.get_device_name(device)}: layer cache {cache.numel() * 2 / 2**30:.2f} GiB, "
          f"window {args.window_gib} GiB, Triton splits {triton.kv_splits}")
    stand_in = measure_standins.address_window(window)
    ok = True
    for qlen in range(1, 5):
        call = measure.DecodeCall(16, qlen, BF16, BF16, BF16)
        aiter, tri, seconds = measure.measure_both(stand_in, triton, [call], device, cache=cache)
        chosen = measure.serving(aiter, tri)
        print(f"query length {qlen}: window stand-in {aiter[qlen].describe()}; {triton.function(qlen)} "
              f"{tri[qlen].describe()}; served by {chosen[qlen]} ({seconds:.2f} s)")
        ok &= aiter[qlen].outcome is measure.Outcome.WRONG and tri[qlen].outcome is measure.Outcome.CORRECT
        ok &= chosen[qlen] == "triton"
    right = measure.measure(reference, measure.DecodeCall(16, 2, BF16, BF16, BF16), device, cache=cache)
    print(f"reference in the same slots: {right.describe()}")
    ok &= right.outcome is measure.Outcome.CORRECT
    del cache
    torch.cuda.empty_cache()

    sets = [measure.layer_calls(heads, 4, dtype, dtype, BF16)
            for heads in (16, 128) for dtype in (BF16, torch.float8_e4m3fn)]

    def whole() -> float:
        started = time.perf_counter()
        for calls in sets:
            aiter, tri, _ = measure.measure_both(reference, triton, calls, device)
            assert all(v == "aiter" for v in measure.serving(aiter, tri).values()), measure.summary(aiter)
        torch.cuda.synchronize(device)
        return time.perf_counter() - started

    first = whole()
    warm = min(whole() for _ in range(args.warm_runs))
    print(f"whole measurement, both kernels, DeepSeek-V3's 4 call sets (16 calls): first {first:.2f} s, "
          f"warm {warm:.2f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
