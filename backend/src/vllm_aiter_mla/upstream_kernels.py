"""The kernels a server measures and serves with, loaded from the packages that own them: AITER's
(``kernels.load_kernels``) and vLLM's Triton MLA decode of the running release
(``load_triton_decode``, the one place it is imported from vLLM).

The measurement (``measure``, ``crash_safe``, ``measure_child``) names ``production`` by a string
and imports nothing from here, so it holds the same on every vLLM release and is tested once; what
reads vLLM is this module and the adapters in ``backend``."""

from __future__ import annotations

from .kernels import MLAKernels, load_kernels
from .remedy import NAME, TritonDecode


def load_triton_decode(splits: int) -> TritonDecode:
    """vLLM's Triton MLA decode functions of the running release, with ``splits`` splits."""
    from vllm.v1.attention.ops import triton_decode_attention as ops  # noqa: PLC0415  (vLLM: lazily, here only)

    return TritonDecode(NAME, ops.decode_attention_fwd, getattr(ops, "decode_attention_fwd_verify", None), splits)


def production(kind: str, splits: int) -> MLAKernels | TritonDecode:
    """The kernels a server measures and serves with: AITER's (``AITER_MLA_KERNELS``) or vLLM's Triton
    decode with ``splits`` splits (the measurement child's factory, ``measure_child.PRODUCTION``)."""
    return load_kernels() if kind == "aiter" else load_triton_decode(splits)
