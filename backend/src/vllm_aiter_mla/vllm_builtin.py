"""What this package reads of vLLM's built-in ``ROCM_AITER_MLA`` backend of the running release.

Everything here changes when vLLM releases, and is read from the built-in's own helpers, predicates
and constants (by ``getattr``, never by version): the head count and the decode calls the built-in
makes for a layer (``decode_heads``, ``layer_calls``), what it does with a layer's configuration
(``layer_facts``, for ``routing.choose_route``) and what its prefill needs from a metadata builder
(``builtin_fused_context_gather``, ``builtin_context_chunk_kv_indices``). The adapters (``backend.py``)
subclass the built-in's classes under the names below (``BuiltinBackend``, ...). No other module of this
package imports the built-in's module or reads its private names (``test_vllm_builtin_boundary``): a new
vLLM release touches this module, ``routing.py`` and the tests' surface data, nothing else.
"""

from __future__ import annotations

import torch
from vllm.v1.attention.backend import max_decode_query_len
from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

from . import measure
from .routing import LayerFacts

BACKEND_NAME = "ROCM_AITER_MLA"
# vLLM's MLA prefill backend that calls aiter.flash_attn_varlen_func.
AITER_PREFILL_BACKEND = "ROCM_AITER_FA"

# The built-in's classes the adapters (backend.py) subclass: its backend, metadata, builder and impl.
BuiltinBackend = builtin.AiterMLABackend
BuiltinMetadata = builtin.AiterMLAMetadata
BuiltinMetadataBuilder = builtin.AiterMLAMetadataBuilder
BuiltinImpl = builtin.AiterMLAImpl


def decode_query_len_limit(vllm_config: object) -> int:
    """The longest decode query vLLM hands a layer in this configuration (vLLM's
    ``max_decode_query_len``: 1, or more with speculative decoding)."""
    return max_decode_query_len(vllm_config)


def _is_fp8_cache(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype.startswith("fp8")


def decode_heads(num_heads: int) -> int | None:
    """The head count vLLM's built-in of the running release calls AITER's decode with for a layer
    of ``num_heads`` heads per GPU (``AiterMLAHelper.get_actual_mla_num_heads``: the next multiple
    of 16, or 24 natively where AITER has H24 kernels); None where it has no answer."""
    helper = getattr(builtin, "AiterMLAHelper", None)
    actual = getattr(helper, "get_actual_mla_num_heads", None)
    valid = getattr(helper, "is_valid_num_heads", lambda n: True)
    if actual is None:
        return None
    try:
        if not valid(num_heads):  # the built-in refuses the layer itself, in its own words
            return None
        heads = int(actual(num_heads))
    except Exception:  # noqa: BLE001  (the built-in's own probe failed: it has no answer)
        return None
    return heads if heads >= num_heads else None


def own_decode_heads(num_heads: int) -> int:
    """``decode_heads`` for a layer the own path runs; ValueError where the built-in names none
    (routing gives such layers to the built-in)."""
    heads = decode_heads(num_heads)
    if heads is None:
        raise ValueError(f"{BACKEND_NAME}: vLLM's built-in names no decode head count for {num_heads} heads per GPU; "
                         "change --tensor-parallel-size")
    return heads


def work_dtype(vllm_config, kv_cache_dtype: str) -> torch.dtype:
    """The q/KV dtype of the decode calls and their persistent-mode work buffers: the platform's fp8
    with an fp8 cache (vLLM hands decode fp8 queries there, as to the built-in), else the model's."""
    return platform_fp8_dtype() if _is_fp8_cache(kv_cache_dtype) else vllm_config.model_config.dtype


def layer_calls(vllm_config, heads: int, kv_cache_dtype: str) -> tuple[measure.DecodeCall, ...]:
    """The decode calls the own path makes for a layer run with ``heads`` heads (the built-in's)."""
    dtype = work_dtype(vllm_config, kv_cache_dtype)
    return measure.layer_calls(heads, max_decode_query_len(vllm_config), dtype, dtype, vllm_config.model_config.dtype)


def platform_fp8_dtype() -> torch.dtype:
    from vllm.platforms import current_platform  # noqa: PLC0415

    return current_platform.fp8_dtype()


def on_rocm() -> bool:
    from vllm.platforms import current_platform  # noqa: PLC0415

    return current_platform.is_rocm()


def _builtin_fp8_prefill(kv_cache_dtype: str, num_heads: int) -> bool:
    """Whether vLLM's built-in prefills this layer in fp8 (mla_prefill_ps_asm_fwd + mla_reduce_v1;
    gfx950 with an AITER that has them), by the built-in's own predicates. Only on ROCm: the
    predicate imports AITER."""
    if not (on_rocm() and _is_fp8_cache(kv_cache_dtype)):
        return False
    helper = builtin.AiterMLAHelper
    # vLLM 0.34 keeps 1-8 heads in bf16 prefill (is_valid_fp8_prefill_num_heads); earlier releases
    # prefill every valid head count in fp8.
    valid = getattr(helper, "is_valid_fp8_prefill_num_heads", helper.is_valid_num_heads)
    return bool(builtin._fp8_mla_prefill_supported() and valid(num_heads))


def builtin_fused_context_gather(kv_cache_dtype: str, dcp_size: int) -> bool:
    """Whether vLLM's built-in builder flattens chunked-prefill context for the fused gather
    (``gather_kv_b_proj``) its prefill code runs: vLLM 0.34's predicate (gfx950, any KV dtype but
    ``fp8_ds_mla``, no DCP; held against each release's source by the tests). Releases without
    the method have no fused gather."""
    if not hasattr(builtin.AiterMLAMetadataBuilder, "_build_context_chunk_kv_indices") or not on_rocm():
        return False
    return kv_cache_dtype != "fp8_ds_mla" and dcp_size == 1 and _on_gfx950()


def builtin_context_chunk_kv_indices(builder: object, prefill: object) -> list[torch.Tensor]:
    """The built-in builder's flattened KV indices of a step's chunked-prefill context, for the
    fused gather its prefill code runs (its ``_build_context_chunk_kv_indices``, called on
    ``builder``, one index tensor per context chunk); only where ``builtin_fused_context_gather`` holds."""
    return builtin.AiterMLAMetadataBuilder._build_context_chunk_kv_indices(builder, prefill)


def _on_gfx950() -> bool:
    from vllm.platforms.rocm import on_gfx950  # noqa: PLC0415  (reads the GPU: ROCm only)

    return bool(on_gfx950())


def _builtin_non_persistent(num_heads: int, heads: int | None, max_qlen: int, kv_cache_dtype: str) -> bool:
    """Whether vLLM's built-in decodes some query length of this layer without persistent work
    buffers (its builder's gate, 0.32-0.34: a padded bf16 layer of fewer than
    ``_AITER_MIN_MLA_HEADS`` heads past ``_ASM_PADDED_MAX_PS_QLEN``), read from the built-in's own
    constants; where a release lacks them, every padded bf16 multi-token layer counts."""
    if max_qlen == 1 or _is_fp8_cache(kv_cache_dtype):
        return False
    helper = builtin.AiterMLAHelper
    min_heads = getattr(helper, "_AITER_MIN_MLA_HEADS", None)
    max_ps_qlen = getattr(helper, "_ASM_PADDED_MAX_PS_QLEN", None)
    if min_heads is None or max_ps_qlen is None:
        return heads != num_heads
    return num_heads < min_heads and max_qlen > max_ps_qlen


def _builtin_triton_verify(num_heads: int, max_qlen: int, kv_cache_dtype: str, dcp_size: int) -> bool:
    """Whether vLLM's built-in verifies this layer's drafts with its Triton verify kernel where
    AITER's asm decode has no correct kernel (vLLM 0.34, gfx942, query length past 4), by the
    built-in's own predicate; releases without it have none."""
    unsupported = getattr(builtin, "_asm_causal_verify_unsupported", None)
    if unsupported is None or not on_rocm():
        return False
    return bool(unsupported(num_heads, max_qlen, kv_cache_dtype, dcp_size))


def _builtin_flydsl_prefill(vllm_config) -> bool:
    """Whether the configured MLA prefill backend is the built-in's opt-in FlyDSL fp8 prefill
    (vLLM 0.34), which the built-in prepares fp8 inputs for."""
    flydsl = getattr(builtin, "AiterFlyDSLFP8PrefillBackend", None)
    chosen = getattr(getattr(vllm_config, "attention_config", None), "mla_prefill_backend", None)
    if flydsl is None or chosen is None:
        return False
    return str(getattr(chosen, "name", chosen)) == flydsl.get_name()


def _builtin_unpadded_small_heads(num_heads: int, max_qlen: int, kv_cache_dtype: str) -> bool:
    """Whether vLLM's built-in runs fewer than 16 heads without padding (its Gluon decode or
    verify, gfx950), by the built-in's own predicates."""
    if not on_rocm():
        return False
    helper = builtin.AiterMLAHelper
    if max_qlen == 1:
        return bool(helper.use_gluon_decode(num_heads, 1, kv_cache_dtype))
    return bool(helper.use_gluon_verify(num_heads, max_qlen, kv_cache_dtype))


def _builtin_varlen_verify(vllm_config) -> bool:
    """Whether vLLM's built-in verifies drafts of variable length (0.33's adaptive verification,
    ``QueryLenSupport.VARLEN``); releases without it have no such predicate."""
    enabled = getattr(builtin, "_adaptive_varlen_verify_enabled", None)
    return bool(enabled(vllm_config)) if enabled is not None else False


def layer_facts(vllm_config, num_heads: int, latent_size: int, kv_cache_dtype: str) -> LayerFacts:
    """What routing needs to know of one MLA layer, read from vLLM's config and built-in."""
    longest = max_decode_query_len(vllm_config)
    heads = decode_heads(num_heads)
    dcp_size = vllm_config.parallel_config.decode_context_parallel_size
    return LayerFacts(
        num_heads=num_heads,
        latent_size=latent_size,
        model_dtype=str(vllm_config.model_config.dtype).removeprefix("torch."),
        kv_cache_dtype=kv_cache_dtype,
        max_qlen=longest,
        decode_heads=heads,
        dcp_size=dcp_size,
        non_causal=bool(getattr(vllm_config.attention_config, "use_non_causal", False)),
        builtin_varlen_verify=_builtin_varlen_verify(vllm_config),
        builtin_fp8_prefill=_builtin_fp8_prefill(kv_cache_dtype, num_heads),
        builtin_unpadded_small_heads=_builtin_unpadded_small_heads(num_heads, longest, kv_cache_dtype),
        builtin_triton_verify=_builtin_triton_verify(num_heads, longest, kv_cache_dtype, dcp_size),
        builtin_flydsl_prefill=_builtin_flydsl_prefill(vllm_config),
        builtin_non_persistent=_builtin_non_persistent(num_heads, heads, longest, kv_cache_dtype),
    )


def prefill_backend_name(vllm_config, layer_names: list[str]) -> str:
    layer = vllm_config.compilation_config.static_forward_context[layer_names[0]]
    backend = getattr(layer, "prefill_backend", None)
    return backend.get_name() if backend is not None else "none"

