"""Which implementation runs a layer: this package's own decode path, or vLLM's built-in
``ROCM_AITER_MLA`` implementation of the running vLLM (delegation).

The plugin takes over vLLM's ``ROCM_AITER_MLA`` entry, so anything the built-in serves must
still be served. The own path makes the decode calls the built-in makes for the same layer (its
head count, query lengths, dtypes, persistent work buffers), so it never asks AITER for a call the
built-in would not make. A layer runs the own path where that path implements the configuration
the way the built-in does, and every one of its decode calls was measured right on this GPU at
start-up (``measure``); everywhere else it is handed to the built-in, with the reasons in one
start-up line. Plain functions on plain data: the facts about vLLM and its built-in
(``LayerFacts``) are read by ``vllm_builtin.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from . import measure
from .config import SUPPORTED_KV_CACHE_DTYPES, SUPPORTED_LATENT_SIZES

OWN_MODEL_DTYPES = ("bfloat16",)


@dataclass(frozen=True)
class LayerFacts:
    """One MLA layer's configuration, and what vLLM's built-in does with it."""

    num_heads: int  # query heads per GPU
    latent_size: int  # kv_lora_rank + rope dim (the KV cache row)
    model_dtype: str  # torch dtype name without "torch.": bfloat16, float16, ...
    kv_cache_dtype: str  # --kv-cache-dtype: auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, ...
    max_qlen: int = 1  # 1 + speculative tokens
    decode_heads: int | None = None  # the head count the built-in calls AITER with (None: it has no answer)
    dcp_size: int = 1  # --decode-context-parallel-size
    non_causal: bool = False  # non-causal multi-token drafts (attention_config.use_non_causal)
    # What vLLM's built-in ROCM_AITER_MLA does with this layer (read from the running vLLM):
    builtin_varlen_verify: bool = False  # adaptive (variable-length) spec-decode verification
    builtin_fp8_prefill: bool = False  # fp8 prefill with mla_prefill_ps_asm_fwd (gfx950)
    builtin_unpadded_small_heads: bool = False  # fewer than 16 heads unpadded (Gluon, gfx950)
    builtin_triton_verify: bool = False  # Triton verify past query length 4 (gfx942, vLLM 0.34)
    builtin_flydsl_prefill: bool = False  # the opt-in FlyDSL fp8 prefill is configured (vLLM 0.34)
    builtin_non_persistent: bool = False  # some decode call runs without work buffers (padded bf16 past qlen 4)


@dataclass(frozen=True)
class Route:
    """``own``: this package's decode path, with ``decode_heads`` heads; else vLLM's built-in,
    for ``reasons``."""

    own: bool
    reasons: tuple[str, ...] = ()  # why the built-in runs the layer; for an own one: which kernel serves what
    decode_heads: int | None = None
    triton_qlens: frozenset[int] = frozenset()  # query lengths vLLM's Triton decode serves (the rest: AITER)
    refusal: str = ""  # no kernel was measured right for some call: the server must not start
    # own, its calls' measurement begun at the model's construction and not collected yet: which kernel
    # serves each query length is not known, and nothing may decode on it before it is collected
    pending: bool = False

    def describe(self) -> str:
        if self.refusal:
            return "refused: " + self.refusal
        if self.pending:
            return "own (its decode calls' measurement begun, not collected yet)"
        if self.own:
            return "own" + (": " + "; ".join(self.reasons) if self.reasons else "")
        return "vLLM's built-in: " + "; ".join(self.reasons)


def delegation_reasons(facts: LayerFacts) -> list[str]:
    """Why this package's path does not take the layer (empty: it does). Every reason is a
    configuration the built-in serves and this path either does not implement or does less
    well, or a decode call it would make differently from the built-in."""
    reasons = []
    if facts.dcp_size > 1:
        reasons.append(f"decode context parallelism (-dcp {facts.dcp_size})")
    if facts.model_dtype not in OWN_MODEL_DTYPES:
        reasons.append(f"model dtype {facts.model_dtype} (own path: {', '.join(OWN_MODEL_DTYPES)})")
    if facts.kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
        reasons.append(f"--kv-cache-dtype {facts.kv_cache_dtype} (own path: {', '.join(SUPPORTED_KV_CACHE_DTYPES)})")
    if facts.latent_size not in SUPPORTED_LATENT_SIZES:
        reasons.append(f"latent size {facts.latent_size} (own path: {', '.join(map(str, SUPPORTED_LATENT_SIZES))})")
    if facts.non_causal:
        reasons.append("non-causal multi-token drafts")
    if facts.builtin_varlen_verify:
        reasons.append("adaptive (variable-length) speculative verification")
    if facts.builtin_fp8_prefill:
        reasons.append("fp8 prefill with mla_prefill_ps_asm_fwd (the own path prefills in bf16)")
    if facts.builtin_unpadded_small_heads:
        reasons.append(f"{facts.num_heads} heads run unpadded by the built-in (Gluon; AITER's asm decode takes "
                       "them padded)")
    if facts.builtin_triton_verify:
        reasons.append(f"query length {facts.max_qlen} verified by the built-in's Triton kernel (not AITER's "
                       "asm decode)")
    if facts.builtin_flydsl_prefill:
        reasons.append("FlyDSL fp8 prefill (--attention-config.mla_prefill_backend)")
    if facts.builtin_non_persistent:
        reasons.append(f"{facts.num_heads} heads at query length up to {facts.max_qlen}: the built-in decodes "
                       "without persistent work buffers there (the own path decodes with them only)")
    if facts.decode_heads is None:
        reasons.append(f"the built-in names no decode head count for {facts.num_heads} heads")
    return reasons


def choose_route(facts: LayerFacts) -> Route:
    """The implementation of ``facts``' layer before measurement: the own path with the built-in's
    decode head count, or the built-in for the reasons found."""
    reasons = delegation_reasons(facts)
    if reasons:
        return Route(False, tuple(reasons))
    return Route(True, (), facts.decode_heads)


def with_measurements(route: Route, measured: dict[int, measure.Measured],
                      remedy: dict[int, measure.Measured] | None = None,
                      flags: tuple[frozenset[int], frozenset[int]] | None = None,
                      avoid: str = "") -> Route:
    """The route once each decode call of the layer was measured on this GPU (``measure``): AITER
    serves the query lengths it was measured right at (an output short by exactly kv_scale corrected:
    ROCm/aiter#6732); vLLM's Triton decode the others, where it was measured right (``remedy``, keyed
    by query length); where neither was, the route is a refusal naming the call, both measurements
    and ``avoid`` (the setting that avoids the call). ``flags``: the tensor-parallel group's
    (``measure.agree_flags``), so that every rank serves each query length with the same kernel."""
    if not route.own:
        return route
    route = dataclasses.replace(route, pending=False)
    remedy = remedy or {}
    chosen = measure.serving(measured, remedy, flags)
    local_need, _ = measure.local_flags(measured, remedy)
    missing = [q for q, kernel in chosen.items() if kernel is None]
    if missing:
        q = missing[0]
        why = (f"AITER {measured[q].describe()}, vLLM's Triton decode "
               f"{remedy[q].describe() if q in remedy else 'not measured'}")
        if q not in local_need or (q in remedy and remedy[q].outcome is measure.Outcome.CORRECT):
            why += " on this rank; another tensor-parallel rank measured a kernel wrong"
        return Route(False, (), route.decode_heads, refusal=(
            f"no decode kernel was measured right for the call with {route.decode_heads} heads at query length "
            f"{q}: {why}" + (f"; {avoid}" if avoid else "")))
    triton = frozenset(q for q, kernel in chosen.items() if kernel == "triton")
    if not triton:
        return route
    sentences = []
    if len(triton) < len(chosen):
        sentences.append(f"AITER's decode serves query length {measure._ranges(sorted(set(chosen) - triton))}")
    for q in sorted(triton):
        why = (f"AITER's measured {measured[q].describe()}" if q in local_need
               else "another tensor-parallel rank measured AITER's wrong (every rank runs the same kernel)")
        sentences.append(f"vLLM's Triton MLA decode serves query length {q} ({why})")
    return Route(True, tuple(sentences), route.decode_heads, triton)
