"""Which implementation runs a layer: this package's own decode path, or vLLM's built-in
``ROCM_AITER_MLA`` implementation of the running vLLM (delegation).

The plugin takes over vLLM's ``ROCM_AITER_MLA`` entry, so anything the built-in serves must
still be served: the layer runs this package's path only where that path implements the
configuration and is not behind the built-in on it; everywhere else it is handed to the
built-in, with the reasons in one start-up line. Plain functions on plain data: the facts
about vLLM and its built-in (``LayerFacts``) are read by the adapter (``backend.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import contract, fp8_probe
from .config import SUPPORTED_KV_CACHE_DTYPES, SUPPORTED_LATENT_SIZES, DecodeShape

OWN_MODEL_DTYPES = ("bfloat16",)


@dataclass(frozen=True)
class LayerFacts:
    """One MLA layer's configuration, and what vLLM's built-in would do with it."""

    num_heads: int  # query heads per GPU
    latent_size: int  # kv_lora_rank + rope dim (the KV cache row)
    model_dtype: str  # torch dtype name without "torch.": bfloat16, float16, ...
    kv_cache_dtype: str  # --kv-cache-dtype: auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, ...
    shape: DecodeShape  # query lengths, q/KV dtype class, decode mode, GPU arch(s)
    total_heads: int | None = None  # the model's heads (for the tensor-parallel hint)
    dcp_size: int = 1  # --decode-context-parallel-size
    non_causal: bool = False  # non-causal multi-token drafts (attention_config.use_non_causal)
    # What vLLM's built-in ROCM_AITER_MLA does with this layer (read from the running vLLM):
    builtin_varlen_verify: bool = False  # adaptive (variable-length) spec-decode verification
    builtin_fp8_prefill: bool = False  # fp8 prefill with mla_prefill_ps_asm_fwd (gfx950)
    builtin_unpadded_small_heads: bool = False  # fewer than 16 heads unpadded (Gluon, gfx950)
    builtin_triton_verify: bool = False  # Triton verify past query length 4 (gfx942, vLLM 0.34)
    builtin_flydsl_prefill: bool = False  # the opt-in FlyDSL fp8 prefill is configured (vLLM 0.34)
    builtin_native_heads: bool = False  # this head count runs unpadded (24 heads, AITER with H24 kernels)


@dataclass(frozen=True)
class Route:
    """``own``: this package's decode path, with ``decode_heads`` heads; else vLLM's built-in,
    for ``reasons``."""

    own: bool
    reasons: tuple[str, ...] = ()
    decode_heads: int | None = None

    def describe(self) -> str:
        return "own" if self.own else "vLLM's built-in: " + "; ".join(self.reasons)


def delegation_reasons(facts: LayerFacts) -> list[str]:
    """Why this package's path does not take the layer (empty: it does). Every reason is a
    configuration the built-in serves and this path either does not implement or does less
    well."""
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
        reasons.append(f"{facts.num_heads} heads run unpadded by the built-in (the own path pads to 16)")
    if facts.builtin_triton_verify:
        reasons.append(f"query length {facts.shape.max_qlen} verified by the built-in's Triton kernel (the own path "
                       "pads to 128 heads or has no kernel)")
    if facts.builtin_native_heads:
        reasons.append(f"{facts.num_heads} heads run natively by the built-in (AITER's H{facts.num_heads} kernels; "
                       "the own path pads them)")
    if facts.builtin_flydsl_prefill:
        reasons.append("FlyDSL fp8 prefill (--attention-config.mla_prefill_backend)")
    if facts.num_heads > contract.MAX_HEADS:
        reasons.append(f"{facts.num_heads} heads per GPU (own path: at most {contract.MAX_HEADS})")
    if facts.shape.max_qlen > contract.MAX_QLEN:
        reasons.append(f"query length {facts.shape.max_qlen} (own path: at most {contract.MAX_QLEN})")
    return reasons


def choose_route(facts: LayerFacts, table: contract.KernelTable | None = None) -> Route:
    """The implementation of ``facts``' layer. Where the own path would take it, its head count
    comes from the kernel contract (``contract.kernel_head_count``): with no correct kernel for
    every query length, the layer goes to the built-in."""
    reasons = delegation_reasons(facts)
    if reasons:
        return Route(False, tuple(reasons))
    shape = facts.shape
    table = table or contract.active_table()
    heads = contract.kernel_head_count(facts.num_heads, shape.archs, shape.mode, range(1, shape.max_qlen + 1),
                                       shape.q_dtype, shape.kv_dtype, table)
    if heads is None:
        problem = contract.first_problem(shape.archs, shape.mode, facts.num_heads, range(1, shape.max_qlen + 1),
                                         shape.q_dtype, shape.kv_dtype, table)
        return Route(False, (f"no correct AITER {table.tag} kernel in the own path's contract for {facts.num_heads} "
                             f"heads, {shape.mode} decode, query length up to {shape.max_qlen}, q {shape.q_dtype} / "
                             f"KV {shape.kv_dtype} on {', '.join(shape.archs)} ({problem})",))
    return Route(True, (), heads)


def with_measurements(route: Route, outcomes: dict[int, fp8_probe.Outcome]) -> Route:
    """The route once AITER's fp8 verify decode was measured on the GPU (``fp8_probe``): a query
    length measured wrong (other than the V scale it leaves out, which the own path restores,
    ROCm/aiter#6732) sends the layer to the built-in."""
    wrong = fp8_probe.wrong_qlens(outcomes)
    if not route.own or not wrong:
        return route
    return Route(False, (f"AITER's fp8 decode with {route.decode_heads} heads measured wrong at query length "
                         f"{', '.join(map(str, wrong))} (start-up check)",))
