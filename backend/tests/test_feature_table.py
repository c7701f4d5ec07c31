"""backend/README.md's feature table is true: each row's built-in column for the installed vLLM
(0.32 here, 0.33 in its track's environment) against vLLM's built-in ROCM_AITER_MLA classes, and
the plugin column against routing (own / delegated), the own impl's inheritance of the built-in's
prefill (inherited) or the own path's refusals."""
from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from routing_cases import FP8, facts
from vllm_aiter_mla import measure
from vllm_aiter_mla.routing import choose_route, with_measurements

README = Path(__file__).resolve().parents[1] / "README.md"


def table_rows() -> dict[str, dict[str, str]]:
    text = README.read_text()
    body = text.split("<!-- feature-table:start -->", 1)[1].split("<!-- feature-table:end -->", 1)[0]
    lines = [line for line in body.strip().splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return rows


def builtin():
    from vllm.v1.attention.backends.mla import rocm_aiter_mla

    return rocm_aiter_mla


def release_column() -> str:
    from vllm_aiter_mla.plugin import _installed_vllm_version

    return "built-in " + ".".join(_installed_vllm_version().split("+")[0].split(".")[:2])




def routed(**change) -> str:
    return "own" if choose_route(facts(**change)).own else "delegated"


def _source(obj) -> str:
    return inspect.getsource(obj)


def _refuses(call: Callable[[], object]) -> bool:
    try:
        call()
    except ValueError:
        return True
    return False


def _own_refusals() -> str:
    from vllm_aiter_mla.config import check_unsupported_features

    cases = [(None, 128, None), ([0.1], None, None), (None, None, 30.0)]
    return "refused" if all(_refuses(lambda c=c: check_unsupported_features(*c)) for c in cases) else "own"


def _own_non_uniform() -> str:
    from vllm_aiter_mla.planning import decode_query_len

    return "refused" if _refuses(lambda: decode_query_len(torch.tensor([0, 1, 3, 4]), 4)) else "own"


def _own_capacity() -> str:
    from vllm_aiter_mla.backend import AiterMLAMetadataBuilder
    from vllm_aiter_mla.planning import DecodePlanBuffers

    whole = DecodePlanBuffers.allocate(4, 8, 16, "cpu").capacity == 4 * 8 * 16
    return "own" if whole and "max_keys" not in _source(AiterMLAMetadataBuilder.__init__) else "refused"


def _own_workspace() -> str:
    from vllm_aiter_mla.backend import AiterMLAImpl, DecodeKernelsMixin

    return "own" if AiterMLAImpl.reserve_workspace is DecodeKernelsMixin.reserve_workspace else "refused"


def _own_v_scale_fix() -> str:
    from vllm_aiter_mla.decode import mla_decode

    route = choose_route(facts(max_qlen=4, **FP8))
    found = {2: measure.Measured(measure.Outcome.DROPS_V_SCALE, 0.001, 0.03)}
    kept = with_measurements(route, found).own
    return "own" if kept and "v_scale_dropped" in inspect.signature(mla_decode).parameters else "refused"


def _own_measured() -> str:
    """Every decode call of an own layer measured: one wrong, not finite or raising call hands the
    layer to the built-in."""
    from vllm_aiter_mla import backend

    route = choose_route(facts(max_qlen=3))
    right = measure.Measured(measure.Outcome.CORRECT, 0.001, 0.03)
    remedy = {1: right, 2: right, 3: right}
    handed = all(with_measurements(route, {1: right, 2: right, 3: measure.Measured(o, 1.0, 0.03)}, remedy
                                   ).triton_qlens == {3} for o in measure.Outcome if not o.served)
    every = "measured_route(" in _source(backend.layer_route)
    return "own" if handed and every else "delegated"


def _own_head_count() -> str:
    from vllm_aiter_mla import vllm_builtin

    helper = builtin().AiterMLAHelper
    heads = vllm_builtin.decode_heads
    same = all(heads(n) == helper.get_actual_mla_num_heads(n) for n in range(1, 129))
    return "own" if same and all(choose_route(facts(num_heads=n, decode_heads=heads(n))).decode_heads
                                 == heads(n) for n in (8, 16, 24, 100, 128)) else "delegated"


def _builtin_start_up_probes(b) -> int:
    """Functions of the built-in's module (outside its classes) that call AITER's MLA decode: its
    start-up measurements (0.34: the fp8 verify V scale, ROCm/aiter#6732)."""
    return sum(1 for f in vars(b).values()
               if inspect.isfunction(f) and f.__module__ == b.__name__ and "mla_decode_fwd(" in _source(f))


def _own_largest_work() -> str:
    import dataclasses

    from vllm_aiter_mla.kernels import load_kernels
    from vllm_aiter_mla.persistent import allocate_work

    reference = load_kernels("reference")
    asked = []

    def info(batch, qlen, *args, **kwargs):
        asked.append(qlen)
        return reference.get_mla_metadata_info_v1(batch, qlen, *args, **kwargs)

    allocate_work(dataclasses.replace(reference, get_mla_metadata_info_v1=info), 2, 3, 16, torch.bfloat16,
                  torch.bfloat16, "cpu")
    return "own" if asked == [1, 2, 3] else "refused"


def _inherited(*methods: str) -> str:
    """"inherited" when the own impl runs the built-in's code for these methods of the running
    release (those it has; backend/tests/test_prefill_inherited.py holds every method), else
    "own" (the own path would have code of its own there)."""
    from vllm_aiter_mla.backend import AiterMLAImpl

    impl = builtin().AiterMLAImpl
    same = all(inspect.getattr_static(AiterMLAImpl, m) is inspect.getattr_static(impl, m)
               for m in methods if m in vars(impl))
    return "inherited" if issubclass(AiterMLAImpl, impl) and same else "own"


def _inherited_context_gather() -> str:
    from vllm_aiter_mla.backend import AiterMLAMetadataBuilder

    # the own builder makes the indices the built-in's gather reads, with the built-in builder's method
    # (through vllm_builtin.builtin_context_chunk_kv_indices)
    feeds = "builtin_context_chunk_kv_indices(" in _source(AiterMLAMetadataBuilder.build)
    return _inherited("_compute_prefill_context", "_gather_context_chunk", "_can_fuse_context_gather") if feeds \
        else "own"


# row -> (what the built-in has, read from its classes; what the plugin does)
CHECKS: dict[str, tuple[Callable[[object], bool], Callable[[], str]]] = {
    "bf16 model, bf16 KV cache (`auto`, `bfloat16`)": (
        lambda b: torch.bfloat16 in b.AiterMLABackend.supported_dtypes
        and {"auto", "bfloat16"} <= set(b.AiterMLABackend.supported_kv_cache_dtypes),
        lambda: routed()),
    "fp8 KV cache (`fp8`, `fp8_e4m3`), bf16 prefill": (
        lambda b: {"fp8", "fp8_e4m3"} <= set(b.AiterMLABackend.supported_kv_cache_dtypes),
        lambda: routed(**FP8)),
    "fp16 model and fp16 KV cache": (
        lambda b: torch.float16 in b.AiterMLABackend.supported_dtypes
        and "float16" in b.AiterMLABackend.supported_kv_cache_dtypes,
        lambda: routed(model_dtype="float16", kv_cache_dtype="float16")),
    "fp8_e5m2 KV cache": (
        lambda b: "fp8_e5m2" in b.AiterMLABackend.supported_kv_cache_dtypes,
        lambda: routed(kv_cache_dtype="fp8_e5m2")),
    "latent sizes other than 576": (
        lambda b: b.AiterMLABackend.supports_head_size(512) and b.AiterMLABackend.supports_head_size(320),
        lambda: routed(latent_size=512)),
    "any KV block size": (
        lambda b: all(b.AiterMLABackend.supports_block_size(n) for n in (1, 7, 16, 64)),
        lambda: routed()),
    "decode context parallelism (`-dcp`)": (
        lambda b: b.AiterMLAImpl.supports_dcp, lambda: routed(dcp_size=2)),
    "DCP with MTP verification": (
        lambda b: hasattr(b, "_segmented_dcp_verify_supported"), lambda: routed(dcp_size=2, max_qlen=2)),
    "fused fp8 DCP prefill": (
        lambda b: hasattr(b, "_supports_fused_dcp_prefill_config"), lambda: routed(dcp_size=2, **FP8)),
    "non-causal multi-token drafts": (
        lambda b: b.AiterMLAMetadataBuilder.supports_non_causal_multi_token_decode,
        lambda: routed(non_causal=True, max_qlen=2)),
    "adaptive (variable-length) verification": (
        lambda b: hasattr(b, "_adaptive_varlen_verify_enabled"),
        lambda: routed(builtin_varlen_verify=True, max_qlen=3)),
    "gfx950 fp8 prefill (`mla_prefill_ps_asm_fwd`)": (
        lambda b: "mla_prefill_ps_asm_fwd" in _source(b._fp8_mla_prefill_supported),
        lambda: routed(builtin_fp8_prefill=True, **FP8)),
    "gfx950 fused chunked-context gather for prefill (`gather_kv_b_proj`)": (
        lambda b: hasattr(b.AiterMLAImpl, "_can_fuse_context_gather"), _inherited_context_gather),
    "fused k_nope/k_pe concat for prefill (`fused_kimi_k3_mla_kv_concat`)": (
        lambda b: "fused_kimi_k3_mla_kv_concat" in _source(b.AiterMLAImpl),
        lambda: _inherited("_concat_k_nope_k_pe")),
    "gfx950 fewer than 16 heads unpadded (Gluon)": (
        lambda b: hasattr(b.AiterMLAHelper, "use_gluon_decode") and hasattr(b.AiterMLAHelper, "use_gluon_verify"),
        lambda: routed(num_heads=8, builtin_unpadded_small_heads=True)),
    "24 heads unpadded where AITER has native H24 kernels": (
        lambda b: hasattr(b, "_aiter_mla_native_h24_supported"),
        lambda: routed(num_heads=24, decode_heads=24)),
    "decode head count: the built-in's (`get_actual_mla_num_heads`)": (
        lambda b: hasattr(b.AiterMLAHelper, "get_actual_mla_num_heads"), _own_head_count),
    "gfx942 fewer than 16 heads, padded to 16": (
        lambda b: b.AiterMLAHelper.get_actual_mla_num_heads(8) == 16,
        lambda: routed(num_heads=8)),
    "MTP verification, query length 2-4": (
        lambda b: b.AiterMLAMetadataBuilder.query_len_support.name in ("UNIFORM", "VARLEN"),
        lambda: routed(max_qlen=4)),
    "MTP verification, query length 5-8, by AITER's asm decode": (
        lambda b: b.AiterMLAMetadataBuilder.query_len_support.name in ("UNIFORM", "VARLEN"),
        lambda: "own" if all(routed(max_qlen=q) == routed(max_qlen=q, **FP8) == "own" for q in range(5, 9))
        else "delegated"),
    "fewer than 16 heads, bf16, past query length 4: no persistent work buffers": (
        lambda b: hasattr(b.AiterMLAHelper, "_ASM_PADDED_MAX_PS_QLEN"),
        lambda: routed(num_heads=8, max_qlen=5, builtin_non_persistent=True)),
    "gfx942 MTP past query length 4 by a Triton verify kernel": (
        lambda b: hasattr(b, "_asm_causal_verify_unsupported"),
        lambda: routed(max_qlen=5, builtin_triton_verify=True, **FP8)),
    "fp8 MTP output corrected where AITER leaves V unscaled (ROCm/aiter#6732, measured at start-up)": (
        lambda b: hasattr(b, "_aiter_fp8_mla_decode_drops_v_scale"), _own_v_scale_fix),
    "every decode call measured on the GPU at start-up (a wrong one: served by vLLM's Triton decode)": (
        lambda b: _builtin_start_up_probes(b) > 1, _own_measured),
    "FlyDSL fp8 prefill (opt-in `mla_prefill_backend`)": (
        lambda b: hasattr(b, "AiterFlyDSLFP8PrefillBackend"), lambda: routed(builtin_flydsl_prefill=True, **FP8)),
    "more than 128 heads per GPU": (
        lambda b: b.AiterMLAHelper.is_valid_num_heads(256), lambda: routed(num_heads=256)),
    "kv_indices for max_num_seqs x max_model_len keys (prefix sharing)": (
        lambda b: re.search(r"max_num_pages = max_num_reqs \* max_num_pages_per_req",
                            _source(b.AiterMLAMetadataBuilder.__init__)) is not None,
        _own_capacity),
    "decode rows not laid out num_reqs x qlen: qo_indptr from query_start_loc": (
        lambda b: re.search(r"query_start_loc_device\[:\s*1 \+ num_kernel_reqs\]",
                            _source(b.AiterMLAMetadataBuilder._build_decode)) is not None,
        _own_non_uniform),
    "persistent work buffers sized by the largest need over every query length": (
        lambda b: hasattr(b, "_max_mla_metadata_info"), _own_largest_work),
    "persistent work buffers counted in the memory profile (`reserve_workspace`)": (
        lambda b: "reserve_workspace" in vars(b.AiterMLAImpl), _own_workspace),
    "ALiBi, sliding window, logit soft-cap": (
        lambda b: "does not support one of the following" not in _source(b.AiterMLAImpl.__init__), _own_refusals),
}


def test_the_table_has_a_check_for_every_row_and_a_row_for_every_check():
    assert list(table_rows()) == list(CHECKS)


@pytest.mark.parametrize("feature", list(CHECKS))
def test_built_in_column_of_the_installed_vllm(feature):
    column = release_column()
    row = table_rows()[feature]
    assert column in row, f"the feature table has no column {column!r} (the installed vLLM's release)"
    has, _ = CHECKS[feature]
    assert row[column] == ("yes" if has(builtin()) else "no"), f"{feature}: {column} says {row[column]}"


@pytest.mark.parametrize("feature", list(CHECKS))
def test_plugin_column(feature):
    _, plugin = CHECKS[feature]
    assert table_rows()[feature]["plugin"] == plugin()
