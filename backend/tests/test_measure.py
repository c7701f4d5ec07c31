"""Every decode call the own path makes is measured at start-up, through its own decode call, against
a dense fp32 computation: right -> own; short by exactly kv_scale (ROCm/aiter#6732) -> own,
corrected; wrong, not finite or raising -> the layer goes to vLLM's built-in, in one start-up line,
never an exception out of vLLM's layer construction. The band and the bound come from the reference
kernel's own deviation and apply after any correction; a measurement is made once per process and
remembered, failed or not; tensor-parallel ranks agree on one route.

The probe reaches where AITER's decode is reported wrong; the stand-ins (measure_standins.py) wrap the
reference kernel, which enforces AITER's host-side contract, each with one such defect: every one of
them is measured not served, and the right ones (rounding P to fp8, #6732, corrected) are served."""
from __future__ import annotations

import dataclasses
import logging
import math
import types

import child_standins
import measure_standins as standins
from adapter_kernels import use_kernels
import remedy_standins
import pytest
import torch

from mla_cases import KV_LORA_RANK, DecodeCase, dense_mla, make
from vllm_aiter_mla import backend, crash_safe, measure, measure_state, vllm_builtin
from vllm_aiter_mla.decode import mla_decode
from vllm_aiter_mla.kernels import MLAKernels
from vllm_aiter_mla.persistent import allocate_work, plan_work
from vllm_aiter_mla.planning import plan_decode

REFERENCE = standins.REFERENCE
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
Outcome = measure.Outcome
WINDOW = 4 << 20  # the address-window stand-in's window on the CPU (a real one is 4 GiB)

_PROBES: dict[tuple, measure.Probe] = {}
_PREPARE = measure.prepare


def _prepare_once(call, device, reference=None, cache=None, slots=None):
    """measure.prepare, made once per call for the whole module where it reads a private cache (the
    probe is deterministic: the same every time)."""
    if cache is not None or slots is not None or reference not in (None, REFERENCE):
        return _PREPARE(call, device, reference, cache, slots)
    key = (call, str(device))
    if key not in _PROBES:
        _PROBES[key] = _PREPARE(call, device)
    return _PROBES[key]


@pytest.fixture(autouse=True, scope="module")
def probes_made_once():
    """Probes made once; one thread for PyTorch (where test lanes share two cores, more threads spin
    more than they compute)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(measure, "prepare", _prepare_once)
        yield
    torch.set_num_threads(threads)


def call(heads: int, dtype: torch.dtype, qlen: int) -> measure.DecodeCall:
    return measure.DecodeCall(heads, qlen, dtype, dtype, BF16)


def measured(kernels: MLAKernels, heads: int, dtype: torch.dtype, qlen: int) -> measure.Measured:
    return measure.measure(kernels, call(heads, dtype, qlen), "cpu")


def raising(qlens=(2,)) -> MLAKernels:
    def fail(d):
        raise RuntimeError("AITER: no kernel for this call")

    return standins.at_query_lengths(standins.stand_in("raises", fail), qlens)


def nan_at(qlens) -> MLAKernels:
    return standins.at_query_lengths(standins.nan_past(0), qlens)


# ---- the probe: where AITER's decode is reported wrong ----


def test_the_probe_reaches_where_aiter_is_reported_wrong():
    for qlen in (1, 2, 3, 4):
        lens = measure.kv_lengths(qlen)
        ids, count = measure.key_ids(qlen)
        assert len(lens) > 3 and lens[0] == qlen  # more requests than 3; a first row that sees one key
        assert max(lens) > 2048 and max(lens) % 256 == 1  # split several times, the last split holds one key
        flat = torch.cat(ids)
        assert len(flat) == sum(lens) and count < len(flat)
        assert flat.bincount().max() == 3  # a slot read by three requests (a shared prefix)
    for q_scale, kv_scale in measure.PROBE_SCALES:  # neither 1 nor a power of two
        assert math.log2(q_scale * kv_scale) % 1 != 0
    assert len({q * k for q, k in measure.PROBE_SCALES}) == 2 and len(set(measure.RUNS)) == 2
    assert measure.RUNS.count(0) >= 2 and measure.RUNS.count(1) >= 2  # every batch twice


def test_a_causal_rows_future_keys_would_dominate_it():
    """The keys a causal row must not see score about 10 above the others: a leaking mask cannot hide
    (seen, they would take most of the row's weight)."""
    c = call(16, BF16, 4)
    probe = measure.prepare(c, "cpu")
    batch = probe.batches[0]
    ids, _ = measure.key_ids(4)
    n = measure.LONG_KEYS
    keys = batch.keys.float()[ids[3]]
    scores = torch.einsum("thd,kd->thk", batch.q[12:16].float(), keys) * measure.PROBE_SM_SCALE
    future, seen = scores[0, :, n - 3:], scores[0, :, :n - 3]  # row 0's future keys, and the keys it sees
    assert future.mean() > seen.mean() + 8
    assert scores[0].softmax(-1)[:, n - 3:].sum(-1).mean() > 0.8


def test_every_call_runs_twice_into_buffers_that_held_another_batchs_plan_its_output_filled_with_nan():
    seen = []

    def record(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, last, qlen, **kw):
        seen.append((kw["work_meta_data"].data_ptr(), kv_indptr.tolist(), bool(o.isnan().all()),
                     kw["kv_scale"].item()))
        return REFERENCE.mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, last, qlen, **kw)

    kernels = dataclasses.replace(REFERENCE, mla_decode_fwd=record)
    assert measured(kernels, 16, FP8, 2).outcome is Outcome.CORRECT
    assert len(seen) == len(measure.RUNS) == 4
    assert len({s[0] for s in seen}) == 1  # one set of work buffers, re-planned before every run
    assert seen[0][1] == seen[2][1] != seen[1][1] == seen[3][1]  # batches A, B, A, B
    assert all(s[2] for s in seen)  # every output buffer all NaN when the kernel gets it
    assert [s[3] for s in seen] == [pytest.approx(k) for _, k in measure.PROBE_SCALES * 2]


def test_the_probe_goes_to_the_highest_slots_of_a_cache_it_is_given():
    c = call(16, FP8, 1)
    cache = torch.zeros(512, 16, 576, dtype=FP8)  # vLLM's [blocks, block size, 576]
    probe = measure.prepare(c, "cpu", cache=cache)
    _, count = measure.key_ids(1)
    assert probe.cache is cache and sorted(probe.slots.tolist()) == list(range(512 * 16 - count, 512 * 16))
    assert measure.measure(REFERENCE, c, "cpu", probe=probe).outcome is Outcome.CORRECT
    with pytest.raises(ValueError, match="the probe needs"):
        measure.prepare(c, "cpu", cache=torch.zeros(100, 1, 576, dtype=FP8))
    assert "making the probe: ValueError" in measure.measure(REFERENCE, c, "cpu", cache=cache.to(BF16)).describe()


# ---- right kernels: served ----


@pytest.mark.parametrize("dtype", [BF16, FP8])
@pytest.mark.parametrize("heads,max_qlen", [(16, 4), (128, 1)])
def test_right_kernels_are_served_at_every_length(heads, max_qlen, dtype):
    """The reference and a #6732 stand-in (fp8: corrected) at every length; a kernel rounding P to fp8
    before P.V at the longest (its largest deviation: 1.5-2.1 % of the band's 3.1 %)."""
    calls = measure.layer_calls(heads, max_qlen, dtype, dtype, BF16)
    for kernels, fp8_outcome, chosen in ((REFERENCE, Outcome.CORRECT, calls),
                                         (standins.drops_v_scale(), Outcome.DROPS_V_SCALE, calls),
                                         (standins.fp8_probabilities(), Outcome.CORRECT, calls[-1:])):
        found, _ = measure.measure_all(kernels, chosen, "cpu")
        want = fp8_outcome if dtype == FP8 else Outcome.CORRECT
        assert {q: m.outcome for q, m in found.items()} == {c.qlen: want for c in chosen}, kernels.name
        assert all(abs(m.scale - 1) < 6e-4 and m.deviation < 0.7 * m.band for m in found.values()), (
            kernels.name, measure.summary(found))


# ---- wrong kernels: measured, never served ----

DEFECTS = [  # (stand-in, heads, dtype, query length, outcome): 16 and 128 heads, bf16 and fp8, lengths 1-4
    (standins.keys_dropped_past(512), 16, BF16, 1, Outcome.WRONG),
    (standins.keys_dropped_past(2048), 16, FP8, 2, Outcome.WRONG),
    (standins.reduce_of_at_most(32), 16, BF16, 3, Outcome.WRONG),
    (standins.log2_ln_mixup(), 16, FP8, 4, Outcome.WRONG),
    (standins.nan_past(1024), 128, BF16, 1, Outcome.NOT_FINITE),
    (standins.rows_of_another_request(), 16, FP8, 1, Outcome.WRONG),
    (standins.rows_never_written(), 16, BF16, 2, Outcome.NOT_FINITE),
    (standins.causal_mask_in_last_split_only(), 16, FP8, 3, Outcome.WRONG),
    (standins.causal_mask_in_last_split_only(), 16, BF16, 4, Outcome.WRONG),
    (standins.repeated_slot_read_as_zeros(), 16, BF16, 4, Outcome.WRONG),
    (standins.scaled(0.97), 128, FP8, 1, Outcome.WRONG),
    (standins.scaled(0.97), 16, BF16, 2, Outcome.WRONG),
    (standins.biased(0.08), 16, FP8, 3, Outcome.WRONG),
    (standins.scores_without_scales(), 16, FP8, 1, Outcome.WRONG),
    (standins.halved(), 16, FP8, 2, Outcome.WRONG),
    (standins.halved(), 128, FP8, 1, Outcome.WRONG),
    (standins.v_scale_dropped_under(1.0), 16, FP8, 4, Outcome.WRONG),
    (standins.right_on_first_call_only(), 16, BF16, 1, Outcome.WRONG),
    (standins.stale_after_replan(), 16, FP8, 4, Outcome.WRONG),
    (standins.stale_after_replan(), 128, BF16, 1, Outcome.WRONG),
]


@pytest.mark.parametrize("kernels,heads,dtype,qlen,outcome", DEFECTS,
                         ids=[f"{k.name}-{h}h-{measure.dtype_name(d)}-q{q}" for k, h, d, q, _ in DEFECTS])
def test_each_defect_is_measured_not_served(kernels, heads, dtype, qlen, outcome):
    found = measured(kernels, heads, dtype, qlen)
    assert found.outcome is outcome and not found.outcome.served, found.describe()
    print(f"{kernels.name}, {heads} heads, {measure.dtype_name(dtype)}, query length {qlen}: {found.describe()}")


@pytest.mark.parametrize("qlen,outcome", [(1, Outcome.CORRECT), (2, Outcome.CORRECT), (3, Outcome.WRONG)])
def test_a_mask_in_the_last_split_only_is_wrong_where_a_rows_future_spans_two_splits(qlen, outcome):
    """At query length 1 no key is in a row's future and at 2 it is the last key, in the last split: the
    stand-in computes the right answer there; from 3 on row 0's future reaches into the split before."""
    assert measured(standins.causal_mask_in_last_split_only(), 16, BF16, qlen).outcome is outcome


def test_a_uniform_error_of_3_percent_is_a_systematic_one_not_rounding():
    """x0.97 stays about within the per-request band (3.1 %); the least-squares scale finds it. A
    bias of +0.08 is inside the band in fp8 calls; the least-squares offset finds it."""
    low = measured(standins.scaled(0.97), 16, FP8, 3)
    assert low.deviation < 1.2 * low.band and low.scale == pytest.approx(0.97, abs=1e-3)
    high = measured(standins.biased(0.08), 16, FP8, 3)
    assert high.deviation < high.band and high.offset > 20 * high.bound and high.outcome is Outcome.WRONG


@pytest.mark.parametrize("kernels,outcome", [
    (standins.scaled(0.995), Outcome.WRONG),  # 0.5 % systematic: caught (bound 0.39 %)
    (standins.scaled(0.998), Outcome.CORRECT),  # 0.2 %, below bf16's unit roundoff: served
    (standins.scaled(1.006), Outcome.WRONG),
    (standins.biased(0.004), Outcome.WRONG),  # offset 0.5 % of the dense result's rms
    (standins.biased(0.001), Outcome.CORRECT),
], ids=["x0.995", "x0.998", "x1.006", "+0.004", "+0.001"])
def test_the_systematic_bound_near_its_boundary(kernels, outcome):
    found = measured(kernels, 16, BF16, 1)
    assert found.outcome is outcome, found.describe()
    assert found.bound == pytest.approx(2**-8)


def test_a_halved_output_is_not_taken_for_the_v_scale():
    """Corrected by kv_scale 1.7 it is 0.85x, by 0.61 0.31x: neither scale pair makes it right."""
    found = measured(standins.halved(), 16, FP8, 3)
    assert found.outcome is Outcome.WRONG and found.scale == pytest.approx(0.5, abs=1e-3)


@pytest.mark.parametrize("dtype", [BF16, FP8])
def test_a_32_bit_window_is_caught_in_the_highest_slots_of_a_large_cache(dtype):
    """ROCm/aiter#5765 (a 4 GiB window on the GPU; 4 MiB here): the probe's private cache lies inside the
    window and misses it; in the highest slots of a cache twice the window's size it is wrong."""
    c = call(16, dtype, 2)
    rows = 2 * WINDOW // (576 * torch.empty(0, dtype=dtype).element_size())
    cache = torch.zeros(rows // 16, 16, 576, dtype=dtype)
    window = standins.address_window(WINDOW)
    assert measure.measure(window, c, "cpu").outcome is Outcome.CORRECT
    found = measure.measure(window, c, "cpu", cache=cache)
    assert found.outcome is Outcome.WRONG and found.deviation > 0.5, found.describe()
    assert measure.measure(REFERENCE, c, "cpu", cache=cache).outcome is Outcome.CORRECT


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU with 5 GiB free")
def test_a_4_gib_window_is_caught_in_the_highest_slots_of_a_cache_past_it():
    """ROCm/aiter#5765's size: a 4 GiB window, a 4.3 GiB bf16 cache (on an H100: wrong, 100 % off;
    the reference right in the same slots)."""
    c = call(16, BF16, 2)
    cache = torch.zeros((4 << 30) // 1152 + 300_000, 1, 576, dtype=BF16, device="cuda")
    assert measure.measure(standins.address_window(4 << 30), c, "cuda", cache=cache).outcome is Outcome.WRONG
    assert measure.measure(REFERENCE, c, "cuda", cache=cache).outcome is Outcome.CORRECT


def test_a_raising_kernel_is_an_outcome():
    found = measured(raising((3,)), 16, BF16, 3)
    assert found.outcome is Outcome.RAISED and "RuntimeError: AITER: no kernel" in found.describe()


# ---- band, bound and classification ----


def test_the_band_and_bound_come_from_the_reference_kernels_own_deviation():
    c = call(16, FP8, 2)
    probe = measure.prepare(c, "cpu")
    found = measure.run_probe(REFERENCE, probe, (0, 1))
    own = measure.Fit.worst(measure.fit(out, b.expected, len(b.order)) for b, out in found)
    assert 0 < own.deviation < 0.0035 and own.systematic < 5e-4  # the reference: within 0.35 %
    assert probe.band == measure.band(own.deviation, BF16) == pytest.approx(measure.BAND_FACTOR * 2**-8)
    assert probe.bound == measure.bound(own.systematic, BF16) == pytest.approx(2**-8)
    assert measure.band(0.01, BF16) == pytest.approx(0.08) and measure.bound(0.001, BF16) == pytest.approx(0.008)


def test_classification_applies_the_band_after_each_batchs_own_correction():
    probe = measure.prepare(call(16, FP8, 1), "cpu")
    a, b = probe.batches
    scale = {id(a): 1.7, id(b): 0.61}

    def classify(change) -> Outcome:
        found = [(x, change(x, x.expected.clone())) for x in (a, b, a, b)]
        return measure.classify(found, probe.band, probe.bound).outcome

    assert classify(lambda x, e: e) is Outcome.CORRECT
    assert classify(lambda x, e: e / scale[id(x)]) is Outcome.DROPS_V_SCALE
    assert classify(lambda x, e: e / scale[id(x)] * 1.05) is Outcome.WRONG
    assert classify(lambda x, e: e / 1.7) is Outcome.WRONG  # one scale for both pairs: not the V scale
    assert classify(lambda x, e: e * 0.99) is Outcome.WRONG
    assert classify(lambda x, e: e.index_fill(0, torch.tensor([3]), float("inf"))) is Outcome.NOT_FINITE


def test_a_request_is_judged_against_its_own_peak():
    expected = torch.ones(2, 16, 512)
    expected[0] *= 0.01  # a request whose output is small (a long one)
    out = expected.clone()
    out[0, 3, 7] += 0.005
    assert measure.deviation(out, expected) == pytest.approx(0.005)
    assert measure.deviation(out, expected, requests=2) == pytest.approx(0.5)
    assert measure.deviation(out, torch.zeros_like(out)) == float("inf")


def test_the_output_buffer_given_to_the_decode_call():
    """mla_decode writes into a buffer it is given, as into its own (zeroed where it would zero one)."""
    q = torch.randn(4, 16, 576).to(BF16)
    kv = torch.randn(8, 576).to(BF16)
    plan = plan_decode(torch.tensor([[0], [1]]), torch.tensor([4, 3], dtype=torch.int32),
                       torch.tensor([0, 2, 4], dtype=torch.int32), 4)
    kw = dict(kernels=REFERENCE, kv_lora_rank=KV_LORA_RANK, scale=0.1, max_seqlen_q=2, decode_heads=16,
              out_dtype=BF16)
    own = mla_decode(q, kv, plan, **kw)  # non-persistent, two rows a request: zero-filled first
    given = torch.full((4, 16, 512), float("nan"), dtype=BF16)
    assert torch.equal(mla_decode(q, kv, plan, out=given, **kw), own) and torch.equal(given, own)
    with pytest.raises(ValueError, match="out must be"):
        mla_decode(q, kv, plan, out=given.float(), **kw)


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


def test_the_routed_impl_never_hands_a_failing_layer_to_the_built_in(monkeypatch, fresh):
    """The class vLLM instantiates: where AITER's calls fail it is the own impl, serving them with vLLM's
    Triton decode (the built-in would make the same AITER calls); where the remedy fails too, it refuses."""
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    monkeypatch.setattr(builtin.AiterMLAImpl, "__init__", lambda self, *a, **k: None)  # (it imports AITER)
    monkeypatch.setattr(backend, "get_current_vllm_config", lambda: _route_config(3))
    use_kernels(monkeypatch, load_kernels=lambda: raising((1, 2, 3)))
    args = dict(num_heads=16, head_size=576, scale=0.1, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype="fp8", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None)
    impl = backend.AiterMLABackend.get_impl_cls()(**args)
    assert isinstance(impl, backend.AiterMLAImpl) and impl._triton_qlens == {1, 2, 3}
    monkeypatch.setattr(measure_state, "_MEASURED", {})
    use_kernels(monkeypatch, load_triton_decode=lambda splits: remedy_standins.triton_standin(0.5))
    with pytest.raises(ValueError, match="no decode kernel was measured right .* query length 1: AITER raised"):
        backend.AiterMLABackend.get_impl_cls()(**args)


# ---- tensor parallelism: every rank takes the same route ----

AGREE = """
import sys, torch.distributed as dist
from vllm_aiter_mla import measure
rank, port, served = int(sys.argv[1]), sys.argv[2], [flag == "1" for flag in sys.argv[3].split(",")]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
print(" ".join("agreed" if measure.agree(ok, dist.group.WORLD) else "built-in" for ok in served))
dist.destroy_process_group()
"""


def test_ranks_that_disagree_all_take_the_built_in():
    """Two ranks over a real gloo group on loopback, three layers measured (both right; one wrong; both
    wrong): the own path only where both measured it right."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    served = ("1,1,0", "1,0,0")
    procs = [subprocess.Popen([sys.executable, "-c", AGREE, str(rank), str(port), flags],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, flags in enumerate(served)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [out.split() for out, _ in outs] == [["agreed", "built-in", "built-in"]] * 2, outs


def test_one_process_alone_keeps_its_own_answer():
    assert measure.agree(True) and not measure.agree(False)


def test_the_start_up_bench_times_the_measurement(capsys):
    """backend/bench/measure_calls.py (the timing quoted in backend/README.md) runs without vLLM and
    finds the reference right for each configuration it times (--quick: 16 heads, query length 1)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "measure_calls.py"
    spec = importlib.util.spec_from_file_location("measure_calls_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--kernels", "reference", "--device", "cpu", "--quick", "--warm-runs", "1"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("reference ")]
    assert len(lines) == 2 and all("wrong" not in line and ": correct" in line for line in lines), out
    assert "whole measurement (reference, 2 configurations): first" in out, out


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


def test_the_backend_reads_no_aiter_version():
    """No module of the backend asks for AITER's installed version (its decode calls are the
    built-in's and measured): a new AITER release needs no change to it."""
    import ast
    from pathlib import Path

    src = Path(backend.__file__).parent
    found = [f"{path.name}: {node.value!r}" for path in sorted(src.glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value.strip().lower() in ("amd-aiter", "amd_aiter")]  # its distribution names
    assert found == [], found
