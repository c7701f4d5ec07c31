"""Start-up checks of a layer's configuration against what the AITER MLA kernels support.

Plain functions; each failure raises ValueError naming the setting to change.
"""

from __future__ import annotations

# Head counts per rank the AITER MLA decode kernels run natively on gfx942/gfx950.
NATIVE_DECODE_HEADS = (16, 128)
MAX_DECODE_HEADS = 128
HEAD_MULTIPLE = 16

# KV-cache dtypes this backend passes to the kernel (fp8 = e4m3 with per-tensor scales).
SUPPORTED_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3")

# Latent cache row: kv_lora_rank (512) + rope (64).
SUPPORTED_LATENT_SIZES = (576,)


def is_supported_head_count(num_heads: int) -> bool:
    return num_heads in NATIVE_DECODE_HEADS or (
        num_heads % HEAD_MULTIPLE == 0 and HEAD_MULTIPLE < num_heads < MAX_DECODE_HEADS
    )


def decode_head_count(num_heads: int, total_heads: int | None = None) -> int:
    """Heads the decode kernel runs with: native counts as they are, other multiples
    of 16 below 128 padded to 128. Anything else fails with a tensor-parallel hint."""
    if num_heads in NATIVE_DECODE_HEADS:
        return num_heads
    if is_supported_head_count(num_heads):
        return MAX_DECODE_HEADS
    hint = ""
    if total_heads:
        sizes = [tp for tp in range(1, total_heads + 1) if total_heads % tp == 0 and is_supported_head_count(total_heads // tp)]
        if sizes:
            hint = f" For this model ({total_heads} heads) use --tensor-parallel-size in {sizes}."
    raise ValueError(
        f"ROCM_AITER_MLA supports 16 or 128 attention heads per GPU (other multiples of 16 "
        f"below 128 are padded to 128), but this layer has {num_heads} heads per GPU. "
        f"Change --tensor-parallel-size.{hint}"
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
