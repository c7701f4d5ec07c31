"""Layer facts for routing tests: a DeepSeek-style layer (16 heads per GPU of 128, latent 576,
bf16, query length 1, the built-in's decode head count 16), changed field by field."""
from __future__ import annotations

import dataclasses

from vllm_aiter_mla.routing import LayerFacts

FP8 = {"kv_cache_dtype": "fp8"}


def facts(**change) -> LayerFacts:
    """The layer with ``change`` applied (LayerFacts fields by name); the decode head count follows
    the head count unless given."""
    base = LayerFacts(num_heads=16, latent_size=576, model_dtype="bfloat16", kv_cache_dtype="auto",
                      decode_heads=16)
    if "num_heads" in change and "decode_heads" not in change:
        change["decode_heads"] = -(-change["num_heads"] // 16) * 16
    return dataclasses.replace(base, **change)
