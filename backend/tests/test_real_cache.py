"""Each own layer's decode calls measured again on its real KV cache once vLLM allocated it, before
CUDA-graph capture: through vLLM's warm-up registry of kernels that depend on the allocated cache
(``JitWarmupRegistry``, where the running release has it), else at the first decode call outside
capture. The probe's keys go to the cache's highest rows, which hold what they held before afterwards.

The adversary: a kernel that reads the cache through an offset window from its base (ROCm/aiter#5765: a
4 GiB window on the GPU; here WINDOW bytes, a cache twice that size). The private probe cache lies inside
the window, so it is measured right there and served at first; only the real cache's measurement finds it
wrong, and then vLLM's Triton decode (its CPU stand-in) serves that call, or the layer refuses where the
remedy is wrong there too."""
from __future__ import annotations

import dataclasses
import logging
import types

import child_standins
import measure_standins as standins
from adapter_kernels import use_kernels
import pytest
import remedy_standins
import torch

from mla_cases import DecodeCase, dense_mla, make
from vllm_aiter_mla import backend, crash_safe, measure, measure_state, persistent, remedy
from vllm_aiter_mla.planning import DecodePlanBuffers, plan_decode
from vllm_aiter_mla.remedy import TritonDecode

BF16 = torch.bfloat16
Outcome = measure.Outcome
WINDOW = 4 << 20  # the window stand-in's, in bytes: past the private cache, inside the real one
ROW_BYTES = 576 * 2  # a bf16 cache row
CALLS = (measure.DecodeCall(16, 1, BF16, BF16, BF16),)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # where test lanes share two cores, more threads spin more than they compute
    yield
    torch.set_num_threads(threads)


def real_cache(fill: float = 0.0) -> torch.Tensor:
    """A layer cache of 2 x WINDOW bytes, [blocks, 16, 576] bf16, as vLLM allocates it; ``fill``: the
    standard deviation of what its rows already hold (0: zeros)."""
    blocks = 2 * WINDOW // ROW_BYTES // 16
    gen = torch.Generator().manual_seed(5765)
    return (torch.randn(blocks, 16, 576, generator=gen) * fill).to(BF16)


def windowed(triton: TritonDecode, window_bytes: int) -> TritonDecode:
    """vLLM's Triton decode (a stand-in) reading the cache through the same window as AITER's."""
    def cut(k_buffer, v_buffer):
        k = k_buffer.clone()
        k.view(-1, 576)[window_bytes // (576 * k.element_size()):] = 0
        return k, k[..., :v_buffer.shape[-1]]

    def fwd(q, k_buffer, v_buffer, *args, **kwargs):
        return triton.decode_attention_fwd(q, *cut(k_buffer, v_buffer), *args, **kwargs)

    def verify(q, k_buffer, v_buffer, *args, **kwargs):
        return triton.decode_attention_fwd_verify(q, *cut(k_buffer, v_buffer), *args, **kwargs)

    return dataclasses.replace(triton, name=f"{triton.name} in a window", decode_attention_fwd=fwd,
                               decode_attention_fwd_verify=verify if triton.decode_attention_fwd_verify else None)


# ---- crash_safe.measure_on_cache: the measurement itself ----


def test_a_window_the_private_cache_misses_is_caught_on_the_real_cache_and_its_rows_restored(monkeypatch):
    window, triton = standins.address_window(WINDOW), remedy_standins.triton_standin()
    private, remedied, _ = measure.measure_both(window, triton, CALLS, "cpu")
    assert private[1].outcome is Outcome.CORRECT and remedied[1].outcome is Outcome.CORRECT  # served as it stands
    cache = real_cache(fill=1.0)  # rows a live request may hold at a first eager step
    before = cache.clone()
    exchanges = []
    monkeypatch.setattr(measure, "agree_flags", lambda flags, qlens, group=None: exchanges.append(flags) or flags)
    found = crash_safe.measure_on_cache(window, triton, CALLS, cache, private, remedied)
    assert found.measured[1].outcome is Outcome.WRONG and found.measured[1].deviation > 0.5, found.measured[1]
    assert found.remedy[1].outcome is Outcome.CORRECT and found.flags == (frozenset({1}), frozenset())
    assert measure.serving(found.measured, found.remedy, found.flags) == {1: "triton"}
    assert torch.equal(cache.view(torch.int16), before.view(torch.int16))  # every row as it was
    rows = measure.probe_rows(CALLS)
    start = ((8 << 20) - rows * ROW_BYTES) / 2**20  # past the 4 MiB window
    assert len(exchanges) == 1 and found.cache == (f"the layer's KV cache (8.0 MiB, the probe's keys in its highest "
                                                   f"{rows} rows, {start:.1f} MiB and more past its base)")


def test_a_call_found_not_served_never_runs_on_the_real_cache():
    """What the first measurement (the child, or its record) found not served keeps that outcome: it may
    have ended the child."""
    def fails(d):
        raise AssertionError("ran on the real cache")

    ended = measure.Measured(Outcome.ENDED, float("nan"), float("nan"), "killed by SIGABRT")
    right = measure.Measured(Outcome.CORRECT, 0.001, 0.03)
    found = crash_safe.measure_on_cache(standins.stand_in("never runs", fails), remedy_standins.triton_standin(),
                                        CALLS, real_cache(), {1: ended}, {1: right})
    assert found.measured[1] is ended and found.remedy[1].outcome is Outcome.CORRECT


@pytest.mark.parametrize("cache,why", [
    (torch.zeros(100, 16, 576, dtype=BF16), f"its 1600 rows are fewer than the probe's {measure.probe_rows(CALLS)}"),
    (torch.zeros(400, 16, 576, dtype=torch.float16), "it holds float16, the calls read bfloat16"),
    (torch.zeros(400, 576, 16, dtype=BF16).transpose(1, 2), "no contiguous"),
], ids=["small", "dtype", "strided"])
def test_a_cache_the_probe_cannot_use_leaves_the_outcomes_and_still_exchanges(monkeypatch, cache, why):
    exchanges = []
    monkeypatch.setattr(measure, "agree_flags", lambda flags, qlens, group=None: exchanges.append(flags) or flags)
    right = measure.Measured(Outcome.CORRECT, 0.001, 0.03)
    found = crash_safe.measure_on_cache(standins.REFERENCE, None, CALLS, cache, {1: right}, {})
    assert found.measured == {1: right} and why in found.cache and len(exchanges) == 1


# ---- the impl: vLLM's warm-up registry, else the first eager decode call ----


def _config(context: dict):
    model = types.SimpleNamespace(dtype=BF16, max_model_len=256,
                                  model_arch_config=types.SimpleNamespace(total_num_attention_heads=16))
    return types.SimpleNamespace(model_config=model, speculative_config=None, use_v2_model_runner=True,
                                 scheduler_config=types.SimpleNamespace(max_num_seqs=8),
                                 device_config=types.SimpleNamespace(device="cpu"),
                                 compilation_config=types.SimpleNamespace(static_forward_context=context),
                                 kernel_config=types.SimpleNamespace(enable_jit_warmup=True))


class Impl(backend.DecodeKernelsMixin):
    kv_lora_rank = 512

    def __init__(self, scale: float):
        self.scale = scale
        self._init_decode(16, "auto")


@pytest.fixture
def own(monkeypatch, tmp_path):
    """Measurements of this test only; the first measurement's child finds every call safe; AITER is the
    window stand-in, vLLM's Triton decode its CPU stand-in; the layers' forward context is ``context``."""
    monkeypatch.setattr(measure_state, "_MEASURED", {})
    monkeypatch.setattr(measure_state, "_ON_CACHE", set())
    monkeypatch.setattr(measure_state, "generation", 0)
    monkeypatch.setattr(remedy, "_RESERVED_TABLES", {})
    monkeypatch.setattr(persistent, "_RESERVED", {})
    monkeypatch.setattr(crash_safe, "run_child", child_standins.all_served())
    monkeypatch.setenv(crash_safe.RECORDS_ENV, str(tmp_path / "records"))
    window = standins.address_window(WINDOW)  # one set of kernels, as AITER's module holds
    use_kernels(monkeypatch, load_kernels=lambda: window)
    triton = remedy_standins.triton_standin()
    use_kernels(monkeypatch, load_triton_decode=lambda splits: dataclasses.replace(triton, kv_splits=splits))
    measured = []
    real = crash_safe.measure_on_cache
    monkeypatch.setattr(crash_safe, "measure_on_cache", lambda *a, **k: measured.append(a[3]) or real(*a, **k))
    context: dict = {}
    monkeypatch.setattr(backend, "get_current_vllm_config", lambda: _config(context))
    return types.SimpleNamespace(context=context, measured=measured)


def builder(window) -> backend.AiterMLAMetadataBuilder:
    """The real builder class with the state its __init__ derives from the config, its route taken."""
    b = object.__new__(backend.AiterMLAMetadataBuilder)
    b._decode_heads, b._kernels, b._work, b._plan_triton, b._slot_table = 16, window, None, None, None
    b._plan_buffers = DecodePlanBuffers.allocate(8, 16, 16, "cpu")
    b.model_config = types.SimpleNamespace(dtype=BF16)
    b._route_args = (backend.get_current_vllm_config(), "auto", torch.device("cpu"))
    b._take_route()
    return b


def _decode(impl: Impl, cache: torch.Tensor):
    """A step of three requests whose keys lie in the cache's first blocks: (output, dense result)."""
    case = make(DecodeCase([1, 1, 1], [9, 64, 33], 16, 16, torch.float32), seed=4)
    case.kv_cache = case.kv_cache.to(BF16).float()
    cache[:case.kv_cache.shape[0]] = case.kv_cache.to(BF16)
    plan = plan_decode(case.block_table, case.seq_lens_t, case.query_start_loc, case.block_size)
    out = impl._decode(case.absorbed_q().to(BF16), cache, plan, 1, BF16, None)
    return case.project_out(out), dense_mla(case)


def test_the_first_eager_decode_call_measures_the_real_cache_once(own, caplog):
    """No warm-up registry active (a release without one, or vLLM's JIT warm-up off): the layer's first
    decode call outside capture measures its cache; AITER's call is wrong there and vLLM's Triton decode
    serves it from that call on; the next calls measure nothing."""
    impl, steps = Impl(0.1), builder(backend.load_kernels())
    assert impl._triton_qlens == frozenset() and impl._real_cache_pending  # the private cache: AITER served
    assert steps._triton_qlens == frozenset() and steps._slot_table is None
    cache = real_cache()
    highest = torch.randn(4000, 576).to(BF16)  # what the highest rows hold (another request's keys)
    cache.view(-1, 576)[-4000:] = highest
    with caplog.at_level(logging.INFO, logger="vllm.aiter_mla"):
        out, expected = _decode(impl, cache)
    assert impl._triton_qlens == {1} and not impl._real_cache_pending and len(own.measured) == 1
    assert (out - expected).abs().max() < 0.05
    assert torch.equal(cache.view(-1, 576)[-4000:].view(torch.int16), highest.view(torch.int16))
    line = next(r.getMessage() for r in caplog.records if "measured again" in r.getMessage())
    assert "on the layer's KV cache (8.0 MiB" in line and "query length 1: Triton" in line, line
    assert "AITER wrong" in line and "\n" not in line
    _decode(impl, cache)
    assert len(own.measured) == 1
    # the builder made before takes the new route at its next step: the remedy's slot table filled
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    meta = steps._build_decode(torch.arange(8, dtype=torch.int32).view(2, 4), torch.tensor([40, 9], dtype=torch.int32),
                               40, qsl, qsl, 2, 1, None)
    assert steps._triton_qlens == {1} and meta.slot_table.data_ptr() == steps._slot_table.data_ptr()
    assert meta.slot_table[0, :40].tolist() == list(range(40))


def test_the_remedy_found_on_the_real_cache_fills_the_table_claimed_before_it_was_sized(own):
    """vLLM's profiling run (reserve_workspace) claims the remedy's slot table before the KV cache is sized;
    the real cache's measurement later gives the remedy a call, and the builder fills that table rather
    than one allocated after the cache."""
    impl = Impl(0.1)
    impl.reserve_workspace()
    (reserved,) = remedy._RESERVED_TABLES.values()
    steps = builder(backend.load_kernels())
    _decode(impl, real_cache())
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    meta = steps._build_decode(torch.arange(8, dtype=torch.int32).view(2, 4), torch.tensor([40, 9], dtype=torch.int32),
                               40, qsl, qsl, 2, 1, None)
    assert steps._triton_qlens == {1} and steps._slot_table.data_ptr() == reserved.data_ptr()
    assert meta.slot_table.data_ptr() == reserved.data_ptr() and not remedy._RESERVED_TABLES


def test_a_remedy_wrong_on_the_real_cache_too_refuses_in_one_line(own, monkeypatch):
    wrong = windowed(remedy_standins.triton_standin(), WINDOW)
    use_kernels(monkeypatch, load_triton_decode=lambda splits: dataclasses.replace(wrong, kv_splits=splits))
    impl = Impl(0.1)
    assert impl._triton_qlens == frozenset()
    with pytest.raises(ValueError, match=r"query length 1: AITER wrong .*Triton decode wrong") as err:
        _decode(impl, real_cache())
    assert "\n" not in str(err.value) and "--tensor-parallel-size" in str(err.value)


def test_nothing_is_measured_inside_cuda_graph_capture(own, monkeypatch, caplog):
    """A decode call captured before any eager one: measuring would synchronise and allocate inside the
    graph, so nothing is, and the start-up log names the setting that measures on the real cache."""
    monkeypatch.setattr(backend, "_capturing", lambda t: True)
    impl = Impl(0.1)
    with caplog.at_level(logging.WARNING, logger="vllm.aiter_mla"):
        _decode(impl, real_cache())
    assert not own.measured and not impl._real_cache_pending and impl._triton_qlens == frozenset()
    assert any("enable_jit_warmup" in r.getMessage() for r in caplog.records)


def test_a_cache_vllm_maps_only_after_capture_is_not_written(own, caplog, monkeypatch):
    """vLLM 0.34's extensible KV cache (its default on GPUs) maps the blocks past a prefix after capture:
    writing its highest rows before then would fault, so nothing is measured, in one line naming the
    setting."""
    impl = Impl(0.1)
    impl._vllm_config.cache_config = types.SimpleNamespace(enable_extensible_kv_cache=True)
    with caplog.at_level(logging.WARNING, logger="vllm.aiter_mla"):
        _decode(impl, real_cache())
    assert not own.measured and not impl._real_cache_pending and impl._triton_qlens == frozenset()
    assert any("--no-enable-extensible-kv-cache" in r.getMessage() for r in caplog.records)


def test_vllms_warmup_registry_measures_each_layer_on_its_bound_cache(own):
    """The running release's JitWarmupRegistry (its presence read from vLLM, not from a version): impls
    made while it is active (the model's construction) register; its warm-up, after vLLM bound each
    layer's cache, measures them there, once for caches of one geometry, and every layer and builder
    serves the window's call with vLLM's Triton decode before any decode call."""
    jit_warmup = pytest.importorskip("vllm.model_executor.warmup.jit_warmup")
    assert measure_state._warmup_hook() is not None, "this vLLM has no JitWarmupRegistry with register/activate/warmup"
    registry = jit_warmup.JitWarmupRegistry(_config(own.context))
    with registry.activate():
        impls = [Impl(0.1) for _ in range(3)]
    outside = Impl(0.1)  # made with no registry active: left to its first decode call
    assert len(registry) == 3 and all(i._triton_qlens == frozenset() for i in impls)
    caches = [real_cache() for _ in impls]
    own.context.update({f"layers.{n}.attn": types.SimpleNamespace(impl=impl, kv_cache=cache)
                        for n, (impl, cache) in enumerate(zip(impls, caches))})
    own.context["layers.0.attn"].kv_cache = [caches[0]]  # vLLM 0.32's layers hold a list (one per engine)
    registry.warmup()
    assert len(own.measured) == 1 and own.measured[0] is caches[0]  # one geometry: one measurement
    assert all(i._triton_qlens == {1} and not i._real_cache_pending for i in impls)
    assert outside._real_cache_pending  # its route is taken again at its first decode call
    out, expected = _decode(impls[2], caches[2])
    assert (out - expected).abs().max() < 0.05 and len(own.measured) == 1


def test_a_warmup_before_the_cache_is_bound_leaves_it_to_the_first_eager_call(own):
    jit_warmup = pytest.importorskip("vllm.model_executor.warmup.jit_warmup")
    registry = jit_warmup.JitWarmupRegistry(_config(own.context))
    with registry.activate():
        impl = Impl(0.1)
    registry.warmup()  # no layer holds a cache yet
    assert impl._real_cache_pending and not own.measured
    _decode(impl, real_cache())
    assert impl._triton_qlens == {1} and len(own.measured) == 1
