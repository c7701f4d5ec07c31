"""Routing: which implementation runs a layer (this package's own path or vLLM's built-in), as a
plain function of the layer's facts, and the adapter classes vLLM instantiates acting on it."""
from __future__ import annotations

import types

import pytest

from routing_cases import FP8, facts
from vllm_aiter_mla import measure
from vllm_aiter_mla.routing import Route, choose_route, with_measurements

# each row: the layer's facts -> the own path (with its decode head count: the built-in's) or a word
# of the reason
ROWS = [
    ("bf16 16 heads", {}, 16),
    ("bf16 128 heads", {"num_heads": 128}, 128),
    ("fp8 KV", FP8, 16),
    ("8 heads: padded to 16, as the built-in pads", {"num_heads": 8}, 16),
    ("24 heads: the built-in's count, 24 where AITER has native H24 kernels", {"num_heads": 24, "decode_heads": 24},
     24),
    ("24 heads: padded to 32 where it has none", {"num_heads": 24}, 32),
    ("fp8 query length 5: the built-in's call", {**FP8, "max_qlen": 5}, 16),
    ("256 heads: the built-in's count", {"num_heads": 256}, 256),
    ("query length 9: measured like any other", {"max_qlen": 9}, 16),
    ("DCP", {"dcp_size": 2}, "decode context parallelism"),
    ("fp16 model", {"model_dtype": "float16"}, "model dtype float16"),
    ("fp16 KV", {"model_dtype": "float16", "kv_cache_dtype": "float16"}, "--kv-cache-dtype float16"),
    ("fp8_e5m2", {"kv_cache_dtype": "fp8_e5m2"}, "fp8_e5m2"),
    ("latent 512", {"latent_size": 512}, "latent size 512"),
    ("non-causal drafts", {"non_causal": True}, "non-causal"),
    ("adaptive verification", {"builtin_varlen_verify": True}, "adaptive"),
    ("gfx950 fp8 prefill", {**FP8, "builtin_fp8_prefill": True}, "fp8 prefill"),
    ("8 heads gfx950 (Gluon)", {"num_heads": 8, "builtin_unpadded_small_heads": True}, "unpadded"),
    ("8 heads bf16 query length 5: the built-in decodes without work buffers",
     {"num_heads": 8, "max_qlen": 5, "builtin_non_persistent": True}, "without persistent work buffers"),
    ("gfx942 fp8 query length 5, where the built-in verifies with Triton (vLLM 0.34)",
     {**FP8, "max_qlen": 5, "builtin_triton_verify": True}, "Triton kernel"),
    ("FlyDSL fp8 prefill configured (vLLM 0.34)", {**FP8, "builtin_flydsl_prefill": True}, "FlyDSL"),
    ("no head count from the built-in", {"decode_heads": None}, "names no decode head count"),
]


@pytest.mark.parametrize("name,change,expected", ROWS, ids=[r[0] for r in ROWS])
def test_route(name, change, expected):
    route = choose_route(facts(**change))
    if isinstance(expected, int):
        assert route.own and route.decode_heads == expected, route.describe()
        assert route.reasons == ()
    else:
        assert not route.own and route.decode_heads is None
        assert expected in "; ".join(route.reasons), route.reasons


def test_every_reason_is_named_at_once():
    route = choose_route(facts(dcp_size=4, model_dtype="float16", latent_size=512))
    assert len(route.reasons) == 3
    assert route.describe().startswith("vLLM's built-in: decode context parallelism (-dcp 4); model dtype float16")


def _measured(*outcomes: str) -> dict[int, measure.Measured]:
    return {q: measure.Measured(measure.Outcome[o], 0.001 if o == "CORRECT" else 0.5, 0.03)
            for q, o in enumerate(outcomes, start=1)}


def test_measurements_decide_which_kernel_serves_each_query_length():
    """AITER where it was measured right; vLLM's Triton decode where AITER was not and it was; a refusal
    naming the call where neither was; every rank the group's choice."""
    own = choose_route(facts(max_qlen=4, **FP8))
    right = _measured("CORRECT", "CORRECT", "CORRECT", "CORRECT")
    assert with_measurements(own, _measured("CORRECT", "DROPS_V_SCALE", "CORRECT", "DROPS_V_SCALE"), right) == own
    for bad in ("WRONG", "NOT_FINITE", "RAISED"):
        route = with_measurements(own, _measured("CORRECT", "CORRECT", bad, "DROPS_V_SCALE"), right)
        assert route.own and route.triton_qlens == {3}, route.describe()
        assert route.reasons == ("AITER's decode serves query length 1-2,4",
                                 f"vLLM's Triton MLA decode serves query length 3 (AITER's measured "
                                 f"{measure.Measured(measure.Outcome[bad], 0.5, 0.03).describe()})"), route.reasons
        refused = with_measurements(own, _measured("CORRECT", "CORRECT", bad, "CORRECT"),
                                    _measured("CORRECT", "CORRECT", "WRONG", "CORRECT"), avoid="use X")
        assert not refused.own and refused.refusal.startswith("no decode kernel was measured right for the call "
                                                              "with 16 heads at query length 3: AITER ")
        assert "vLLM's Triton decode wrong (50.00% off" in refused.refusal and refused.refusal.endswith("; use X")
    # another rank needs the remedy at query length 2: every rank serves it with Triton
    other = with_measurements(own, right, right, (frozenset({2}), frozenset()))
    assert other.triton_qlens == {2} and "another tensor-parallel rank" in other.reasons[1], other.reasons
    # another rank's remedy is wrong where this rank's AITER is too: refused on every rank
    assert with_measurements(own, right, right, (frozenset({2}), frozenset({2}))).refusal
    delegated = Route(False, ("decode context parallelism (-dcp 2)",))
    assert with_measurements(delegated, _measured("WRONG")) == delegated


# ---- the classes vLLM instantiates ----


def _impl_kwargs(num_heads: int, kv_cache_dtype: str = "auto") -> dict:
    """What vLLM's MLAAttention passes (all by keyword)."""
    return dict(num_heads=num_heads, head_size=576, scale=0.1, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype=kv_cache_dtype, logits_soft_cap=None, attn_type="decoder",
                kv_sharing_target_layer_name=None, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=32,
                qk_rope_head_dim=64, qk_head_dim=96, v_head_dim=32, kv_b_proj=None, indexer=None)


@pytest.fixture
def constructors(monkeypatch, tmp_path):
    """Both implementations' constructors recorded instead of run (the built-in's imports AITER);
    the decode calls measured with the reference kernels (right), the measurement child finding every
    call safe (child_standins.all_served; test_crash_safe.py tests the child), records in this test's
    folder; measurements begun at construction are this test's only."""
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    from vllm_aiter_mla import backend, crash_safe, measure_state
    from vllm_aiter_mla.kernels import load_kernels

    import child_standins
    from adapter_kernels import use_kernels

    use_kernels(monkeypatch, load_kernels=lambda: load_kernels("reference"))
    monkeypatch.setattr(crash_safe, "run_child", child_standins.all_served())
    monkeypatch.setattr(measure_state, "_AHEAD", {})
    monkeypatch.setattr(crash_safe, "_BEGUN", {})
    monkeypatch.setenv(crash_safe.RECORDS_ENV, str(tmp_path / "records"))

    seen = []

    def record(which):
        def init(self, *args, **kwargs):
            seen.append((which, args, kwargs))
        return init

    monkeypatch.setattr(backend.AiterMLAImpl, "__init__", record("own"))
    monkeypatch.setattr(builtin.AiterMLAImpl, "__init__", record("built-in"))
    monkeypatch.setattr(backend.AiterMLAMetadataBuilder, "__init__", record("own builder"))
    monkeypatch.setattr(builtin.AiterMLAMetadataBuilder, "__init__", record("built-in builder"))
    return seen


def _config(monkeypatch, dcp: int = 1, dtype: str = "bfloat16", layers: dict | None = None):
    """A config object with what routing and the builder read (MLA, 16 heads per GPU)."""
    import torch

    model = types.SimpleNamespace(dtype=getattr(torch, dtype), max_model_len=256,
                                  model_arch_config=types.SimpleNamespace(total_num_attention_heads=16),
                                  get_num_attention_heads=lambda parallel: 16)
    return types.SimpleNamespace(
        model_config=model, speculative_config=None, use_v2_model_runner=False,
        parallel_config=types.SimpleNamespace(decode_context_parallel_size=dcp),
        attention_config=types.SimpleNamespace(use_non_causal=False),
        cache_config=types.SimpleNamespace(cache_dtype="auto"),
        compilation_config=types.SimpleNamespace(static_forward_context=layers or {}))


@pytest.mark.parametrize("dcp,dtype,own", [(1, "bfloat16", True), (2, "bfloat16", False), (1, "float16", False)])
def test_the_impl_vllm_instantiates_is_the_routed_one(monkeypatch, constructors, dcp, dtype, own):
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    from vllm_aiter_mla import backend

    monkeypatch.setattr(backend, "get_current_vllm_config", lambda: _config(monkeypatch, dcp, dtype))
    impl = backend.AiterMLABackend.get_impl_cls()(**_impl_kwargs(16))
    if own:
        assert type(impl) is backend.AiterMLAImpl
        assert constructors[-1][0] == "own" and constructors[-1][2] == _impl_kwargs(16)
    else:
        assert isinstance(impl, builtin.AiterMLAImpl) and not isinstance(impl, backend.AiterMLAImpl)
        assert constructors[-1][0] == "built-in" and constructors[-1][2] == _impl_kwargs(16)


def test_the_builder_follows_its_layers_impls(monkeypatch, constructors):
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    from vllm_aiter_mla import backend

    spec = types.SimpleNamespace(head_size=576)
    own_layer = types.SimpleNamespace(impl=object.__new__(backend.AiterMLAImpl))
    builtin_layer = types.SimpleNamespace(impl=object.__new__(backend.RoutedMLAImpl))
    builder_cls = backend.AiterMLABackend.get_builder_cls()

    config = _config(monkeypatch, layers={"a": own_layer, "b": own_layer})
    assert type(builder_cls(spec, ["a", "b"], config, "cpu")) is backend.AiterMLAMetadataBuilder
    # the layers' impls decide, even where the configuration alone would route to the own path
    config = _config(monkeypatch, layers={"a": builtin_layer})
    built = builder_cls(spec, ["a"], config, "cpu", block_table_width=8)
    assert isinstance(built, builtin.AiterMLAMetadataBuilder) and not isinstance(built, backend.AiterMLAMetadataBuilder)
    assert constructors[-1][0] == "built-in builder" and constructors[-1][2] == {"block_table_width": 8}
    # no layer registered: the configuration is routed
    assert type(builder_cls(spec, ["x"], _config(monkeypatch), "cpu")) is backend.AiterMLAMetadataBuilder
    assert not isinstance(builder_cls(spec, ["x"], _config(monkeypatch, dcp=2), "cpu"), backend.AiterMLAMetadataBuilder)
    with pytest.raises(ValueError, match="different implementations"):
        builder_cls(spec, ["a", "b"], _config(monkeypatch, layers={"a": own_layer, "b": builtin_layer}), "cpu")


def test_the_builder_class_vllm_reads_is_the_built_ins():
    """vLLM reads CUDA-graph and query-length support from the builder class before building
    one: the built-in's answers (the own path answers the same for what it takes)."""
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    from vllm_aiter_mla import backend

    routed, own = backend.RoutedMLAMetadataBuilder, backend.AiterMLAMetadataBuilder
    assert issubclass(routed, builtin.AiterMLAMetadataBuilder)
    assert routed._cudagraph_support == own._cudagraph_support == builtin.AiterMLAMetadataBuilder._cudagraph_support
    assert routed.query_len_support == own.query_len_support
    assert backend.AiterMLABackend.supports_non_causal_dcp() == builtin.AiterMLABackend.supports_non_causal_dcp()


# ---- facts read from the running vLLM's built-in where that release has the predicate ----


def test_predicates_of_newer_built_ins_are_read_where_they_exist(monkeypatch):
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    from vllm_aiter_mla import vllm_builtin

    asked = []

    def unsupported(heads, qlen, kv_cache_dtype, dcp):
        asked.append((heads, qlen, kv_cache_dtype, dcp))
        return qlen > 4

    monkeypatch.setattr(vllm_builtin, "on_rocm", lambda: True)
    if not hasattr(builtin, "_asm_causal_verify_unsupported"):  # releases before 0.34: never
        assert vllm_builtin._builtin_triton_verify(16, 5, "fp8", 1) is False
    monkeypatch.setattr(builtin, "_asm_causal_verify_unsupported", unsupported, raising=False)
    verify = vllm_builtin._builtin_triton_verify
    assert verify(16, 5, "fp8", 1) and not verify(16, 4, "fp8", 1)
    assert asked == [(16, 5, "fp8", 1), (16, 4, "fp8", 1)]

    class FlyDSL:
        @staticmethod
        def get_name():
            return "ROCM_AITER_FLYDSL_FP8"

    def chosen(name):
        member = None if name is None else types.SimpleNamespace(name=name)
        return types.SimpleNamespace(attention_config=types.SimpleNamespace(mla_prefill_backend=member))

    if not hasattr(builtin, "AiterFlyDSLFP8PrefillBackend"):
        assert vllm_builtin._builtin_flydsl_prefill(chosen("ROCM_AITER_FLYDSL_FP8")) is False
    monkeypatch.setattr(builtin, "AiterFlyDSLFP8PrefillBackend", FlyDSL, raising=False)
    assert vllm_builtin._builtin_flydsl_prefill(chosen("ROCM_AITER_FLYDSL_FP8"))
    assert not vllm_builtin._builtin_flydsl_prefill(chosen("ROCM_AITER_FA"))
    assert not vllm_builtin._builtin_flydsl_prefill(chosen(None))


def test_fp8_prefill_head_counts_follow_the_built_ins_own_predicate(monkeypatch):
    """vLLM 0.34 keeps 1-8 heads in bf16 prefill (is_valid_fp8_prefill_num_heads): the own path
    then keeps the layer; earlier releases decide by is_valid_num_heads."""
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    from vllm_aiter_mla import vllm_builtin

    monkeypatch.setattr(vllm_builtin, "on_rocm", lambda: True)
    monkeypatch.setattr(builtin, "_fp8_mla_prefill_supported", lambda: True)
    monkeypatch.setattr(builtin.AiterMLAHelper, "is_valid_num_heads", staticmethod(lambda n: True))
    monkeypatch.setattr(builtin.AiterMLAHelper, "is_valid_fp8_prefill_num_heads", staticmethod(lambda n: n > 8),
                        raising=False)
    assert not vllm_builtin._builtin_fp8_prefill("fp8", 8) and vllm_builtin._builtin_fp8_prefill("fp8", 16)
    assert not vllm_builtin._builtin_fp8_prefill("auto", 16)


@pytest.mark.parametrize("native_h24", [False, True])
def test_the_own_decode_head_count_is_the_built_ins(monkeypatch, native_h24):
    """For every head count per GPU, the own path calls AITER with the head count the running
    release's built-in calls it with (AiterMLAHelper.get_actual_mla_num_heads), native H24 or not;
    none where the built-in refuses the count itself."""
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    from vllm_aiter_mla import vllm_builtin

    monkeypatch.setattr(builtin, "_aiter_mla_native_h24_supported", lambda: native_h24)
    helper = builtin.AiterMLAHelper
    for heads in range(1, 300):
        expected = helper.get_actual_mla_num_heads(heads) if helper.is_valid_num_heads(heads) else None
        assert vllm_builtin.decode_heads(heads) == expected, heads
    assert vllm_builtin.decode_heads(24) == (24 if native_h24 else 32)
    assert vllm_builtin.decode_heads(8) == 16 and vllm_builtin.decode_heads(128) == 128
