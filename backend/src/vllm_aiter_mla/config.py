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


@dataclass(frozen=True)
class DecodeShape:
    """What the decode kernel is asked for, fixed at start-up."""

    max_qlen: int = 1  # 1 + speculative tokens
    q_dtype: str = contract.BF16  # contract dtype class of the queries handed to the kernel
    kv_dtype: str = contract.BF16
    mode: str = contract.PERSISTENT
    archs: tuple[str, ...] = contract.ARCHS  # the GPU's arch, or every supported arch


def _qlen_problem(shape: DecodeShape) -> str | None:
    spec = shape.max_qlen - 1
    if shape.kv_dtype == contract.FP8 and shape.max_qlen > 4:
        return (f"ROCM_AITER_MLA has no AITER decode kernel for an fp8 KV cache at query length {shape.max_qlen} "
                f"({spec} speculative tokens, ROCm/aiter#2760); use --kv-cache-dtype auto or at most 3 "
                "num_speculative_tokens in --speculative-config.")
    if shape.mode == contract.NON_PERSISTENT and shape.max_qlen >= 3:
        return (f"ROCM_AITER_MLA non-persistent decode is wrong at query length 3 (ROCm/aiter#2720), which "
                f"{spec} speculative tokens produce; set {DECODE_MODE_ENV}={contract.PERSISTENT} or use at most 1 "
                "num_speculative_tokens in --speculative-config.")
    return None


def decode_head_count(num_heads: int, total_heads: int | None = None, shape: DecodeShape = DecodeShape()) -> int:
    """Heads the decode kernel runs with: the smallest count >= num_heads that has a correct
    AITER kernel for every query length 1..max_qlen (zero query heads pad up to it).
    Anything else fails at start-up with one line naming the setting to change."""
    problem = _qlen_problem(shape)
    if problem is not None:
        raise ValueError(problem)
    qlens = range(1, shape.max_qlen + 1)
    heads = contract.kernel_head_count(num_heads, shape.archs, shape.mode, qlens, shape.q_dtype, shape.kv_dtype)
    if heads is not None:
        return heads
    reason = contract.first_problem(shape.archs, shape.mode, max(num_heads, 1), qlens, shape.q_dtype, shape.kv_dtype)
    hint = ""
    if total_heads:
        sizes = [tp for tp in range(1, total_heads + 1) if total_heads % tp == 0
                 and contract.kernel_head_count(total_heads // tp, shape.archs, shape.mode, qlens, shape.q_dtype,
                                                shape.kv_dtype) is not None]
        if sizes:
            hint = f" For this model ({total_heads} heads) use --tensor-parallel-size in {sizes}."
    raise ValueError(
        f"ROCM_AITER_MLA cannot run {num_heads} attention heads per GPU ({reason}); "
        f"change --tensor-parallel-size.{hint}"
    )


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
