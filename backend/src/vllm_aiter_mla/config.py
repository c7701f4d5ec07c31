"""Start-up settings and checks of a layer's configuration.

Plain functions; each failure raises ValueError naming the setting to change.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# KV-cache dtypes this backend passes to the kernel (fp8 = e4m3 with per-tensor scales); the
# others (float16, fp8_e5m2) go to vLLM's built-in.
SUPPORTED_KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")

# Latent cache row: kv_lora_rank (512) + rope (64).
SUPPORTED_LATENT_SIZES = (576,)


COMPILE_THREADS_ENV = "AITER_MLA_COMPILE_THREADS"
MAX_COMPILE_THREADS = 256


def compile_threads_setting(environ: Mapping[str, str] = os.environ) -> int | None:
    """How many of the decode planner's kernels its warm-up compiles at once: a whole number,
    1 or more (1: one at a time), or None where unset or empty (one per CPU, at most 16)."""
    text = environ.get(COMPILE_THREADS_ENV, "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 4 and 1 <= int(text) <= MAX_COMPILE_THREADS):
        shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
        raise ValueError(f"{COMPILE_THREADS_ENV}={shown!r} is not a whole number of threads from 1 to "
                         f"{MAX_COMPILE_THREADS} (1: compile one at a time; unset: one per CPU, at most 16)")
    return int(text)


def check_kv_cache_dtype(kv_cache_dtype: str) -> None:
    if kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
        raise ValueError(
            f"ROCM_AITER_MLA does not support --kv-cache-dtype {kv_cache_dtype}; "
            f"use one of {', '.join(SUPPORTED_KV_CACHE_DTYPES)}."
        )


def check_unsupported_features(
    alibi_slopes: object | None, sliding_window: int | None, logits_soft_cap: float | None
) -> None:
    found = []
    if alibi_slopes is not None:
        found.append("ALiBi slopes")
    if sliding_window is not None:
        found.append(f"sliding window ({sliding_window})")
    if logits_soft_cap:
        found.append(f"logit soft-cap ({logits_soft_cap})")
    if found:
        raise ValueError(
            f"ROCM_AITER_MLA does not support {', '.join(found)}; "
            "choose another backend with --attention-backend (e.g. TRITON_MLA)."
        )
