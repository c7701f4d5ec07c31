"""Layer facts for routing tests: a DeepSeek-style layer (16 heads per GPU of 128, latent 576,
bf16, gfx942, persistent decode, query length 1), changed field by field."""
from __future__ import annotations

import dataclasses

from vllm_aiter_mla import contract
from vllm_aiter_mla.config import DecodeShape
from vllm_aiter_mla.routing import LayerFacts

TABLE = contract.load_table("v0.1.20.post1")
FP8 = {"kv_cache_dtype": "fp8", "q_dtype": contract.FP8, "kv_dtype": contract.FP8}
SHAPE_FIELDS = ("max_qlen", "q_dtype", "kv_dtype", "mode", "archs")


def facts(**change) -> LayerFacts:
    """The layer with ``change`` applied: LayerFacts fields, or DecodeShape fields by name."""
    base = LayerFacts(num_heads=16, latent_size=576, model_dtype="bfloat16", kv_cache_dtype="auto",
                      shape=DecodeShape(archs=("gfx942",)), total_heads=128)
    shape = {k: change.pop(k) for k in SHAPE_FIELDS if k in change}
    return dataclasses.replace(base, shape=dataclasses.replace(base.shape, **shape), **change)
