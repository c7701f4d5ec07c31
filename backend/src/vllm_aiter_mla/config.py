"""Start-up checks of a layer's configuration against what the AITER MLA kernels support.

Plain functions; each failure raises ValueError naming the setting to change.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import contract

# KV-cache dtypes this backend passes to the kernel (fp8 = e4m3 with per-tensor scales).
# No float16: AITER's MLA decode has no fp16 kernels (contract.py).
SUPPORTED_KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")

# Latent cache row: kv_lora_rank (512) + rope (64).
SUPPORTED_LATENT_SIZES = (576,)

DECODE_MODE_ENV = "AITER_MLA_DECODE_MODE"


def decode_mode(environ: Mapping[str, str] = os.environ) -> str:
    """``persistent`` (default: get_mla_metadata_v1 work buffers, as vLLM's built-in) or
    ``non-persistent``."""
    mode = environ.get(DECODE_MODE_ENV, contract.PERSISTENT).strip().lower() or contract.PERSISTENT
    if mode not in contract.DECODE_MODES:
        raise ValueError(f"{DECODE_MODE_ENV}={environ[DECODE_MODE_ENV]!r} is not one of "
                         f"{', '.join(contract.DECODE_MODES)}")
    return mode


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


@dataclass(frozen=True)
class DecodeShape:
    """What the decode kernel is asked for, fixed at start-up."""

    max_qlen: int = 1  # 1 + speculative tokens
    q_dtype: str = contract.BF16  # contract dtype class of the queries handed to the kernel
    kv_dtype: str = contract.BF16
    mode: str = contract.PERSISTENT
    archs: tuple[str, ...] = contract.ARCHS  # the GPU's arch, or every supported arch


def _heads_for(num_heads: int, shape: DecodeShape, table: contract.KernelTable, **change) -> int | None:
    """kernel_head_count for ``shape`` with some fields changed (max_qlen, mode, q_dtype, kv_dtype)."""
    s = {"max_qlen": shape.max_qlen, "mode": shape.mode, "q_dtype": shape.q_dtype, "kv_dtype": shape.kv_dtype,
         **change}
    return contract.kernel_head_count(num_heads, shape.archs, s["mode"], range(1, s["max_qlen"] + 1), s["q_dtype"],
                                      s["kv_dtype"], table)


def _hints(num_heads: int, total_heads: int | None, shape: DecodeShape, table: contract.KernelTable) -> list[str]:
    """Settings that would make this layer run, one phrase each."""
    hints = []
    shorter = [m for m in range(1, min(shape.max_qlen, contract.MAX_QLEN + 1)) if _heads_for(num_heads, shape, table,
                                                                                            max_qlen=m) is not None]
    if shorter:
        hints.append(f"use at most {shorter[-1] - 1} num_speculative_tokens in --speculative-config")
    other = contract.NON_PERSISTENT if shape.mode == contract.PERSISTENT else contract.PERSISTENT
    if _heads_for(num_heads, shape, table, mode=other) is not None:
        hints.append(f"set {DECODE_MODE_ENV}={other}")
    if shape.kv_dtype == contract.FP8 and _heads_for(num_heads, shape, table, q_dtype=contract.BF16,
                                                     kv_dtype=contract.BF16) is not None:
        hints.append("use --kv-cache-dtype auto")
    sizes = [tp for tp in range(1, (total_heads or 0) + 1) if total_heads % tp == 0
             and _heads_for(total_heads // tp, shape, table) is not None]
    if sizes:
        hints.append(f"use --tensor-parallel-size in {sizes} (this model has {total_heads} heads)")
    elif num_heads > contract.MAX_HEADS or not hints:
        hints.append("change --tensor-parallel-size")
    return hints


def decode_head_count(num_heads: int, total_heads: int | None = None, shape: DecodeShape = DecodeShape()) -> int:
    """Heads the decode kernel runs with: the smallest count >= num_heads that has a correct
    AITER kernel (contract.py: the pinned AITER's kernel table minus known defects) for every
    query length 1..max_qlen (zero query heads pad up to it). Anything else fails at start-up
    with one line naming the settings that would work."""
    table = contract.active_table()
    heads = _heads_for(num_heads, shape, table)
    if heads is not None:
        return heads
    qlens = range(1, shape.max_qlen + 1)
    reason = contract.first_problem(shape.archs, shape.mode, max(num_heads, 1), qlens, shape.q_dtype,
                                    shape.kv_dtype, table)
    raise ValueError(
        f"ROCM_AITER_MLA cannot run {num_heads} attention heads per GPU with {shape.mode} decode at query length "
        f"up to {shape.max_qlen} ({shape.max_qlen - 1} speculative tokens), q {shape.q_dtype} / KV {shape.kv_dtype} "
        f"on {', '.join(shape.archs)} ({reason}); {' or '.join(_hints(num_heads, total_heads, shape, table))}."
    )


def kernel_family(num_heads: int, shape: DecodeShape) -> str:
    """The AITER kernels the decode runs with ``num_heads`` (decode_head_count's result), for
    the start-up log line."""
    return contract.describe(shape.archs, shape.mode, num_heads, range(1, shape.max_qlen + 1), shape.q_dtype,
                             shape.kv_dtype)


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
