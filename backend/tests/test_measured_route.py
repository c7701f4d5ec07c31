"""A layer's decode calls measured at start-up through the adapter, as vLLM constructs and calls it: the
own path's output never short by kv_scale (ROCm/aiter#6732 corrected, a right kernel left alone), a layer
whose AITER call is measured wrong served by the remedy or refused in one line, never handed to vLLM's
built-in (which makes the same AITER call), a measurement made once per process, failed or not, and the
same route with any installed AITER. These reach vLLM's code (the adapters), so they run again on every
release track; the measurement itself (test_measure.py) does not."""
from __future__ import annotations

import dataclasses
import logging
import types

import child_standins
import measure_standins as standins
import pytest
import remedy_standins
import torch
from adapter_kernels import use_kernels
from test_measure import BF16, FP8, REFERENCE, nan_at, probes_made_once, raising  # noqa: F401  (a fixture)

from mla_cases import KV_LORA_RANK, DecodeCase, dense_mla, make
from vllm_aiter_mla import backend, crash_safe, measure, measure_state, vllm_builtin
from vllm_aiter_mla.decode import mla_decode
from vllm_aiter_mla.kernels import MLAKernels
from vllm_aiter_mla.persistent import allocate_work, plan_work
from vllm_aiter_mla.planning import plan_decode

# ---- the own path's output, through the adapter as vLLM calls it ----


def _config(max_qlen: int):
    model = types.SimpleNamespace(dtype=BF16, max_model_len=256,
                                  model_arch_config=types.SimpleNamespace(total_num_attention_heads=16))
    spec = types.SimpleNamespace(num_speculative_tokens=max_qlen - 1, parallel_drafting=False,
                                 max_num_new_slots_for_drafting=0)  # read by vLLM 0.34
    return types.SimpleNamespace(model_config=model, speculative_config=spec if max_qlen > 1 else None,
                                 use_v2_model_runner=True, scheduler_config=types.SimpleNamespace(max_num_seqs=8),
                                 device_config=types.SimpleNamespace(device="cpu"))


class Impl(backend.DecodeKernelsMixin):
    def __init__(self, case: DecodeCase):
        self.kv_lora_rank = KV_LORA_RANK
        self.scale = case.scale
        self._init_decode(case.num_heads, "fp8")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """Measurements of this test only (the process keeps them otherwise). The first measurement's child
    finds every call safe (child_standins.all_served: test_crash_safe.py tests the child), so this
    process's measurement of the kernels the test gives the adapter decides; its records go to a folder
    of this test's."""
    monkeypatch.setattr(measure_state, "_MEASURED", {})
    monkeypatch.setattr(vllm_builtin, "platform_fp8_dtype", lambda: FP8)
    remedy = remedy_standins.triton_standin()  # one set of functions, as vLLM's module holds
    use_kernels(monkeypatch, load_triton_decode=lambda splits: dataclasses.replace(remedy, kv_splits=splits))
    monkeypatch.setattr(crash_safe, "run_child", child_standins.all_served())
    monkeypatch.setenv(crash_safe.RECORDS_ENV, str(tmp_path / "records"))
    monkeypatch.setattr(measure_state, "_AHEAD", {})  # measurements begun at construction: this test's only
    monkeypatch.setattr(crash_safe, "_BEGUN", {})


def _own_path(monkeypatch, kernels: MLAKernels, qlen: int):
    """The own path's decode of an fp8 cache with kv_scale 0.01 at query length ``qlen`` -> (its
    output projected like the dense computation, the dense computation, the impl)."""
    monkeypatch.setattr(backend, "get_current_vllm_config", lambda: _config(qlen))
    use_kernels(monkeypatch, load_kernels=lambda: kernels)
    case = make(DecodeCase([qlen] * 3, [9, 64, 33], 16, 16, torch.float32), seed=4)
    impl = Impl(case)
    q_scale, k_scale = torch.tensor([0.05]), torch.tensor([0.01])
    kv8 = (case.kv_cache / k_scale).to(FP8)
    plan = plan_decode(case.block_table, case.seq_lens_t, case.query_start_loc, case.block_size)
    work = allocate_work(kernels, 8, qlen, 16, FP8, FP8, "cpu")
    plan_work(kernels, work, plan, qlen)
    out = impl._decode(case.absorbed_q().to(BF16), kv8, plan, qlen, BF16,
                       types.SimpleNamespace(_q_scale=q_scale, _k_scale=k_scale), work)
    case.kv_cache = kv8.float() * k_scale
    return case.project_out(out), dense_mla(case), impl


@pytest.mark.parametrize("qlen", [2, 3, 4])
def test_the_own_path_output_is_never_short_by_kv_scale(monkeypatch, fresh, qlen):
    out, expected, impl = _own_path(monkeypatch, standins.at_query_lengths(standins.drops_v_scale(), (2, 3, 4)), qlen)
    assert impl._v_scale_fix_qlens == set(range(2, qlen + 1))  # measured at the verify lengths served
    assert (out - expected).abs().max() < 0.1
    # without the correction, the stand-in's output is 100x off (kv_scale 0.01): the check can fail
    assert (out * 0.01 - expected).abs().max() > 10 * (out - expected).abs().max()


@pytest.mark.parametrize("qlen", [1, 3])
def test_a_correct_kernel_is_left_alone(monkeypatch, fresh, qlen):
    out, expected, impl = _own_path(monkeypatch, REFERENCE, qlen)
    assert impl._v_scale_fix_qlens == frozenset()
    assert (out - expected).abs().max() < 0.1


def test_the_correction_is_the_kv_scale_the_kernel_was_given():
    q = torch.ones(2, 16, 576).to(FP8)
    kv = torch.ones(4, 576).to(FP8)
    plan = plan_decode(torch.tensor([[0]]), torch.tensor([4], dtype=torch.int32),
                       torch.tensor([0, 2], dtype=torch.int32), 4)
    kw = dict(kernels=REFERENCE, kv_lora_rank=KV_LORA_RANK, scale=0.1, max_seqlen_q=2, decode_heads=16,
              out_dtype=BF16, q_scale=torch.tensor([1.0]), kv_scale=torch.tensor([3.0]))
    plain = mla_decode(q, kv, plan, **kw)
    fixed = mla_decode(q, kv, plan, v_scale_dropped=True, **kw)
    torch.testing.assert_close(fixed.float(), plain.float() * 3, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="kv_scale"):
        mla_decode(q.float().to(BF16), kv.float().to(BF16), plan,
                   **{**kw, "q_scale": None, "kv_scale": None}, v_scale_dropped=True)


def test_a_wrong_kernel_and_a_wrong_remedy_stop_the_impl_in_one_line(monkeypatch, fresh):
    """Neither AITER's call nor vLLM's Triton decode measured right: the impl stops, naming the call, both
    measurements and the setting that avoids it."""
    use_kernels(monkeypatch, load_triton_decode=lambda splits: remedy_standins.triton_standin(1.2))
    with pytest.raises(ValueError, match=r"query length 3: AITER wrong \(20\.\d+% off.*Triton decode wrong") as err:
        _own_path(monkeypatch, standins.at_query_lengths(standins.scaled(1.2), (3,)), 3)
    assert "\n" not in str(err.value) and "fewer num_speculative_tokens" in str(err.value)


# ---- routing through the adapter: vLLM's layer construction never sees an exception ----


def _route_config(max_qlen: int, kv_cache_dtype: str = "fp8"):
    config = _config(max_qlen)
    config.parallel_config = types.SimpleNamespace(decode_context_parallel_size=1)
    config.attention_config = types.SimpleNamespace(use_non_causal=False)
    config.cache_config = types.SimpleNamespace(cache_dtype=kv_cache_dtype)
    return config


@pytest.mark.parametrize("kernels,triton,reason", [
    (REFERENCE, None, None),
    (standins.at_query_lengths(standins.drops_v_scale(), (2, 3, 4)), None, None),
    (standins.at_query_lengths(standins.scaled(1.2), (3,)), 3, "query length 3 (AITER's measured wrong"),
    (raising((2,)), 2, "query length 2 (AITER's measured raised RuntimeError: AITER: no kernel"),
    (nan_at((4,)), 4, "query length 4 (AITER's measured not finite"),
], ids=["right", "6732", "wrong", "raises", "nan"])
def test_layer_route_measures_every_call(monkeypatch, fresh, caplog, kernels, triton, reason):
    """Both kernels measured on each call's probe; a call AITER gets wrong is served by vLLM's Triton decode
    (here its CPU stand-in), never by the built-in; one start-up line names, per query length, the kernel
    serving it, its deviation and both kernels' time per call."""
    use_kernels(monkeypatch, load_kernels=lambda: kernels)
    with caplog.at_level(logging.INFO, logger="vllm.aiter_mla"):
        route = backend.layer_route(_route_config(4), 16, 576, "fp8")
    assert route.own and route.triton_qlens == (frozenset({triton}) if triton else frozenset()), route.describe()
    if reason:
        assert "AITER's decode serves query length " in route.reasons[0] and reason in route.reasons[1], route.reasons
    lines = [r.getMessage() for r in caplog.records if "measured on cpu in" in r.getMessage()]
    assert len(lines) == 1 and "16 heads, q float8_e4m3fn / KV float8_e4m3fn" in lines[0], lines
    served = f"query length {triton}: Triton decode_attention_fwd_verify (" if triton else "query length 4: AITER ("
    assert served in lines[0] and lines[0].count(" ms a call") == 4, lines[0]


def test_the_kernels_not_loading_is_a_measurement_too(monkeypatch, fresh):
    def unavailable():
        raise RuntimeError("import aiter failed")

    use_kernels(monkeypatch, load_kernels=unavailable)
    route = backend.layer_route(_route_config(2, "auto"), 16, 576, "auto")
    assert not route.own and "loading the kernels: RuntimeError: import aiter failed" in route.reasons[0]


def test_a_measurement_is_made_once_per_process_failed_or_not(monkeypatch, fresh):
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[7])
        raise RuntimeError("no kernel")

    use_kernels(monkeypatch, load_kernels=lambda: dataclasses.replace(REFERENCE, mla_decode_fwd=counting))
    for _ in range(3):  # three layers of one model
        assert backend.layer_route(_route_config(2), 16, 576, "fp8").triton_qlens == {1, 2}
    assert calls == [1, 2]  # each query length once, for every layer


def _routed_impl(monkeypatch, max_qlen: int):
    """A layer's impl as vLLM constructs it (the class it instantiates), the built-in's own constructor and
    weight processing left out (they import AITER and read the layer's weights)."""
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    monkeypatch.setattr(builtin.AiterMLAImpl, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(builtin.AiterMLAImpl, "process_weights_after_loading", lambda self, act_dtype: None,
                        raising=False)
    monkeypatch.setattr(backend, "get_current_vllm_config", lambda: _route_config(max_qlen))
    args = dict(num_heads=16, head_size=576, scale=0.1, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype="fp8", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None)
    return backend.AiterMLABackend.get_impl_cls()(**args)


def test_the_routed_impl_never_hands_a_failing_layer_to_the_built_in(monkeypatch, fresh):
    """The class vLLM instantiates: where AITER's calls fail it is the own impl, serving them with vLLM's
    Triton decode once their measurement is collected after the weights are loaded (the built-in would make
    the same AITER calls); where the remedy fails too, the server stops there, in one line."""
    use_kernels(monkeypatch, load_kernels=lambda: raising((1, 2, 3)))
    impl = _routed_impl(monkeypatch, 3)
    assert isinstance(impl, backend.AiterMLAImpl) and impl._route_generation == backend.ROUTE_PENDING
    impl.process_weights_after_loading(BF16)
    assert impl._triton_qlens == {1, 2, 3}
    monkeypatch.setattr(measure_state, "_MEASURED", {})
    use_kernels(monkeypatch, load_triton_decode=lambda splits: remedy_standins.triton_standin(0.5))
    impl = _routed_impl(monkeypatch, 3)  # constructed: the measurement is begun, not judged yet
    with pytest.raises(ValueError, match="no decode kernel was measured right .* query length 1: AITER raised") as err:
        impl.process_weights_after_loading(BF16)
    assert "\n" not in str(err.value)


# ---- begun at the model's construction, collected after its weights are loaded ----


class Child:
    """``crash_safe.run_child`` running the child in this process on ``aiter`` and ``triton`` (what the
    server loads too), counting its starts and the threads they ran in."""

    def __init__(self, aiter: MLAKernels, triton):
        self.run = child_standins.in_process(lambda kind, splits: aiter if kind == "aiter" else triton)
        self.threads: list[str] = []

    def __call__(self, argv, timeout_s):
        import threading

        self.threads.append(threading.current_thread().name)
        return self.run(argv, timeout_s)


def _begun(monkeypatch, aiter: MLAKernels, triton, max_qlen: int = 2) -> Child:
    """A layer constructed with ``aiter`` and ``triton`` loaded, its first measurement begun in a child
    measuring the same kernels; nothing measured in this process yet."""
    child = Child(aiter, triton)
    monkeypatch.setattr(crash_safe, "run_child", child)
    use_kernels(monkeypatch, load_kernels=lambda: aiter, load_triton_decode=lambda splits: triton)
    route = backend.layer_route(_route_config(max_qlen), 16, 576, "fp8", ahead=True)
    assert route.own and route.pending and not route.triton_qlens, route.describe()
    assert measure_state._MEASURED == {}  # nothing judged, nothing exchanged at construction
    return child


def test_a_measurement_begun_at_construction_is_collected_before_the_first_decode_call(monkeypatch, fresh, caplog):
    """The first layer's construction begins the first measurement in a child (a thread waits on it) and
    goes on; the child finds AITER's call wrong at query length 2; the first decode call (no collection
    point reached before it) collects the measurement and is served by the remedy, right. Every layer of
    the set shares the one child, and each call is measured in this process once."""
    import threading

    wrong = standins.at_query_lengths(standins.scaled(1.2), (2,))
    here: list[tuple[str, int]] = []  # (thread, query length) of each AITER call

    def mla_decode_fwd(*args, **kwargs):
        here.append((threading.current_thread().name, args[7]))
        return wrong.mla_decode_fwd(*args, **kwargs)

    counted = dataclasses.replace(wrong, mla_decode_fwd=mla_decode_fwd)
    child = _begun(monkeypatch, counted, remedy_standins.triton_standin())
    for _ in range(2):  # more layers of the model: nothing more is begun
        assert backend.layer_route(_route_config(2), 16, 576, "fp8", ahead=True).pending
    with caplog.at_level(logging.INFO, logger="vllm.aiter_mla"):
        out, expected, impl = _own_path(monkeypatch, counted, 2)
    assert (out - expected).abs().max() < 0.1  # AITER's x1.2 would be 20 % off
    assert impl._triton_qlens == {2} and measure_state._AHEAD == {}
    assert child.threads == ["aiter-mla-first-measurement"], child.threads  # one child, begun ahead
    lines = [r.getMessage() for r in caplog.records if "measured on cpu in" in r.getMessage()]
    assert len(lines) == 1 and "begun ahead" in lines[0], lines
    child_calls = {q: here.count(("aiter-mla-first-measurement", q)) for q in (1, 2)}
    own_calls = {q: here.count(("MainThread", q)) for q in (1, 2)}
    # the probe once in the child; here only where the child found AITER served, once; no decode on it at 2
    assert child_calls[1] == child_calls[2] == own_calls[1] > 0 and own_calls[2] == 0, here
    backend.layer_route(_route_config(2), 16, 576, "fp8")  # a builder's route later: measured already
    assert len(child.threads) == 1 and len(here) == sum(child_calls.values()) + own_calls[1]


def test_a_call_the_begun_child_finds_wrong_with_a_wrong_remedy_refuses_once_the_weights_are_loaded(monkeypatch,
                                                                                                   fresh):
    """Both kernels wrong at query length 2, found by the begun child: the model is constructed (nothing
    judged yet), and the server stops in one line where the loader hands over the weights, before its KV
    cache, CUDA graphs and first request."""
    _begun(monkeypatch, standins.at_query_lengths(standins.scaled(1.2), (2,)), remedy_standins.triton_standin(1.2))
    impl = _routed_impl(monkeypatch, 2)
    assert isinstance(impl, backend.AiterMLAImpl) and impl._route_generation == backend.ROUTE_PENDING
    with pytest.raises(ValueError, match=r"query length 2: AITER wrong \(20\.\d+% off.*Triton decode wrong") as err:
        impl.process_weights_after_loading(BF16)
    assert "\n" not in str(err.value) and "fewer num_speculative_tokens" in str(err.value)


@pytest.mark.parametrize("loads", [True, False], ids=["own", "aiter-not-loading"])
def test_every_rank_makes_its_exchange_where_the_others_do(monkeypatch, fresh, loads):
    """A rank whose layers are own and one whose AITER does not load (its layers go to the built-in) make
    no exchange at construction and the same ones (a first, and a second that the agreed flags call for)
    when the first layer's weights are processed (the built-in's impl collects too), none later. The other
    rank measured AITER's call wrong: an own rank serves it with the remedy."""
    seen: list[str] = []
    point = ["construction"]

    def agree(flags, qlens, group):
        seen.append(point[0])
        # the other rank needs the remedy at query length 1 and left it unmeasured there (a second exchange)
        return (flags[0] | {1}, flags[1], *[{1}] * (len(flags) - 2))

    monkeypatch.setattr(measure, "agree_flags", agree)
    monkeypatch.setattr(measure_state, "_tensor_parallel_group", lambda: "the group")

    def unloadable():
        raise RuntimeError("import aiter failed")

    use_kernels(monkeypatch, load_kernels=(lambda: REFERENCE) if loads else unloadable)
    monkeypatch.setattr(crash_safe, "run_child", Child(REFERENCE, remedy_standins.triton_standin()))
    impls = [_routed_impl(monkeypatch, 1) for _ in range(3)]  # three layers
    assert all(isinstance(i, backend.AiterMLAImpl) == loads for i in impls) and seen == []
    point[0] = "weights"
    for impl in impls:
        impl.process_weights_after_loading(BF16)
    point[0] = "later"
    for impl in impls:
        impl.reserve_workspace() if loads else None
    backend.layer_route(_route_config(1), 16, 576, "fp8")
    assert seen == ["weights", "weights"], seen
    if loads:
        assert all(i._triton_qlens == {1} for i in impls)


def test_cpu_development_mode_measures_at_construction_as_before(monkeypatch, fresh):
    """The pure-PyTorch reference on the CPU has no child: nothing is begun, the layer is measured when
    it is constructed and its route is final there."""
    monkeypatch.setenv("AITER_MLA_KERNELS", "reference")

    def no_child(argv, timeout_s):
        raise AssertionError("a measurement child was started")

    monkeypatch.setattr(crash_safe, "run_child", no_child)
    use_kernels(monkeypatch, load_kernels=lambda: REFERENCE)
    route = backend.layer_route(_route_config(1), 16, 576, "fp8", ahead=True)
    assert route.own and not route.pending and measure_state._AHEAD == {} and len(measure_state._MEASURED) == 1


# ---- first contact: nothing depends on AITER's version ----

def _pinned_aiter_versions() -> list[str]:
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[2] / "versions.json").read_text())
    return sorted({track["aiter"].removeprefix("v") for track in data["tracks"].values()} | {"0.1.99"})


@pytest.mark.parametrize("version", _pinned_aiter_versions())
def test_a_layer_routes_and_measures_alike_with_any_installed_aiter(monkeypatch, fresh, tmp_path, version):
    """With an installed AITER distribution of every version a track pins, and of one not released
    yet, a layer is routed and measured as with any other (the engine test runs two of them)."""
    import importlib
    from importlib import metadata

    dist = tmp_path / f"amd_aiter-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: amd-aiter\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert metadata.version("amd-aiter") == version
    use_kernels(monkeypatch, load_kernels=lambda: REFERENCE)
    for kv, qlen in (("auto", 1), ("fp8", 2)):
        route = backend.layer_route(_route_config(qlen, kv), 16, 576, kv)
        assert route.own and route.decode_heads == 16, route.describe()


