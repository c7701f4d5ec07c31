"""ROCm/aiter#6732: AITER's gfx942 fp8 persistent decode at verify lengths 2-4 leaves V unscaled
(the output is short by exactly kv_scale). The own path measures it at start-up through its own
decode call and multiplies the output back where it is found; an output wrong in any other way
sends the layer to vLLM's built-in; a correct kernel is left alone.

The stand-ins wrap the reference kernel (which enforces AITER's contract): one divides its output
by kv_scale exactly where #6732 does, one returns zeros."""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from mla_cases import KV_LORA_RANK, DecodeCase, dense_mla, make
from routing_cases import FP8, TABLE, facts
from vllm_aiter_mla import backend, contract, fp8_probe
from vllm_aiter_mla.decode import mla_decode
from vllm_aiter_mla.kernels import MLAKernels, load_kernels
from vllm_aiter_mla.persistent import allocate_work, plan_work
from vllm_aiter_mla.planning import plan_decode
from vllm_aiter_mla.routing import Route, choose_route, with_measurements

REFERENCE = load_kernels("reference")
FP8_DTYPE = torch.float8_e4m3fn
DEFECT_QLENS = (2, 3, 4)


def _stand_in(name: str, change) -> MLAKernels:
    """The reference kernel with ``change(o, kv_scale)`` applied to the output of persistent fp8
    calls at query lengths 2-4."""
    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                       **kwargs):
        result = REFERENCE.mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                                          max_seqlen_q, **kwargs)
        if kwargs.get("kv_scale") is not None and kwargs.get("work_meta_data") is not None \
                and max_seqlen_q in DEFECT_QLENS:
            change(o, kwargs["kv_scale"])
        return result

    return dataclasses.replace(REFERENCE, name=name, mla_decode_fwd=mla_decode_fwd)


def drops_v_scale() -> MLAKernels:
    return _stand_in("drops-v-scale", lambda o, kv_scale: o.div_(kv_scale))  # V unscaled: output / kv_scale


def wrong_otherwise() -> MLAKernels:
    return _stand_in("zeros", lambda o, kv_scale: o.zero_())


def _measure(kernels, heads=16, qlens=range(1, 5)):
    return fp8_probe.measure_all(kernels, heads=heads, qlens=qlens, persistent=True, fp8_dtype=FP8_DTYPE,
                                 device="cpu")


# ---- the measurement ----


def test_a_correct_kernel_measures_correct_at_every_length():
    assert set(_measure(REFERENCE).values()) == {fp8_probe.Outcome.CORRECT}
    assert set(_measure(REFERENCE, heads=128, qlens=range(5, 9)).values()) == {fp8_probe.Outcome.CORRECT}


def test_the_defect_is_found_exactly_where_it_is():
    outcomes = _measure(drops_v_scale())
    assert outcomes == {1: fp8_probe.Outcome.CORRECT, 2: fp8_probe.Outcome.DROPS_V_SCALE,
                        3: fp8_probe.Outcome.DROPS_V_SCALE, 4: fp8_probe.Outcome.DROPS_V_SCALE}
    assert fp8_probe.v_scale_fix_qlens(outcomes) == {2, 3, 4}


def test_an_output_wrong_in_another_way_is_not_taken_for_the_defect():
    outcomes = _measure(wrong_otherwise())
    assert fp8_probe.wrong_qlens(outcomes) == (2, 3, 4) and not fp8_probe.v_scale_fix_qlens(outcomes)


@pytest.mark.parametrize("factor,outcome", [(1.0, "CORRECT"), (0.5, "DROPS_V_SCALE"), (0.75, "WRONG"),
                                            (2.0, "WRONG"), (float("nan"), "WRONG"), (0.0, "WRONG")])
def test_classify(factor, outcome):
    expected = torch.randn(3, 16, 512, generator=torch.Generator().manual_seed(1))
    assert fp8_probe.classify(expected * factor, expected, kv_scale=2.0) is fp8_probe.Outcome[outcome]


# ---- the own path's output, through the adapter as vLLM calls it ----


def _config(max_qlen: int):
    model = types.SimpleNamespace(dtype=torch.bfloat16, max_model_len=256,
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


def _own_path(monkeypatch, kernels: MLAKernels, qlen: int):
    """The own path's decode of an fp8 cache with kv_scale 0.01 at query length ``qlen`` -> (its
    output projected like the dense computation, the dense computation, the impl)."""
    monkeypatch.setattr(backend, "get_current_vllm_config", lambda: _config(qlen))
    monkeypatch.setattr(backend, "load_kernels", lambda: kernels)
    monkeypatch.setattr(backend, "_platform_fp8_dtype", lambda: FP8_DTYPE)
    case = make(DecodeCase([qlen] * 3, [9, 64, 33], 16, 16, torch.float32), seed=4)
    impl = Impl(case)
    q_scale, k_scale = torch.tensor([0.05]), torch.tensor([0.01])
    kv8 = (case.kv_cache / k_scale).to(FP8_DTYPE)
    plan = plan_decode(case.block_table, case.seq_lens_t, case.query_start_loc, case.block_size)
    work = allocate_work(kernels, 8, qlen, 16, FP8_DTYPE, FP8_DTYPE, "cpu")
    plan_work(kernels, work, plan, qlen)
    out = impl._decode(case.absorbed_q().to(torch.bfloat16), kv8, plan, qlen, torch.bfloat16,
                       types.SimpleNamespace(_q_scale=q_scale, _k_scale=k_scale), work)
    case.kv_cache = kv8.float() * k_scale
    return case.project_out(out), dense_mla(case), impl


@pytest.mark.parametrize("qlen", [2, 3, 4])
def test_the_own_path_output_is_never_short_by_kv_scale(monkeypatch, qlen):
    out, expected, impl = _own_path(monkeypatch, drops_v_scale(), qlen)
    assert impl._v_scale_fix_qlens == set(range(2, qlen + 1))  # measured at the verify lengths served
    assert (out - expected).abs().max() < 0.1
    # without the correction, the stand-in's output is 100x off (kv_scale 0.01): the check can fail
    assert (out * 0.01 - expected).abs().max() > 10 * (out - expected).abs().max()


@pytest.mark.parametrize("qlen", [1, 3])
def test_a_correct_kernel_is_left_alone(monkeypatch, qlen):
    out, expected, impl = _own_path(monkeypatch, REFERENCE, qlen)
    assert impl._v_scale_fix_qlens == frozenset()
    assert (out - expected).abs().max() < 0.1


def test_the_correction_is_the_kv_scale_the_kernel_was_given():
    q = torch.ones(2, 16, 576).to(FP8_DTYPE)
    kv = torch.ones(4, 576).to(FP8_DTYPE)
    plan = plan_decode(torch.tensor([[0]]), torch.tensor([4], dtype=torch.int32),
                       torch.tensor([0, 2], dtype=torch.int32), 4)
    kw = dict(kernels=REFERENCE, kv_lora_rank=KV_LORA_RANK, scale=0.1, max_seqlen_q=2, decode_heads=16,
              out_dtype=torch.bfloat16, q_scale=torch.tensor([1.0]), kv_scale=torch.tensor([3.0]))
    plain = mla_decode(q, kv, plan, **kw)
    fixed = mla_decode(q, kv, plan, v_scale_dropped=True, **kw)
    torch.testing.assert_close(fixed.float(), plain.float() * 3, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="kv_scale"):
        mla_decode(q.float().to(torch.bfloat16), kv.float().to(torch.bfloat16), plan,
                   **{**kw, "q_scale": None, "kv_scale": None}, v_scale_dropped=True)


def test_a_kernel_wrong_otherwise_stops_an_unrouted_impl(monkeypatch):
    with pytest.raises(ValueError, match="measured wrong at query length 2, 3 "):
        _own_path(monkeypatch, wrong_otherwise(), 3)


# ---- routing: wrong -> the built-in; the defect itself -> own, corrected ----


def test_routing_after_measurement():
    own = choose_route(facts(max_qlen=4, **FP8), TABLE)
    assert own.own
    found = {2: fp8_probe.Outcome.DROPS_V_SCALE, 3: fp8_probe.Outcome.CORRECT, 4: fp8_probe.Outcome.DROPS_V_SCALE}
    assert with_measurements(own, found) == own
    wrong = with_measurements(own, {**found, 3: fp8_probe.Outcome.WRONG})
    assert not wrong.own and "measured wrong at query length 3" in wrong.reasons[0]
    delegated = Route(False, ("decode context parallelism (-dcp 2)",))
    assert with_measurements(delegated, {2: fp8_probe.Outcome.WRONG}) == delegated


def _route(monkeypatch, kernels, **change):
    monkeypatch.setattr(backend, "layer_facts", lambda *a: facts(**change))
    monkeypatch.setattr(backend, "load_kernels", lambda: kernels)
    monkeypatch.setattr(backend, "_platform_fp8_dtype", lambda: FP8_DTYPE)
    monkeypatch.setattr(contract, "active_table", lambda environ=None: TABLE)
    return backend.layer_route(None, 16, 576, "fp8")


def test_layer_route_measures_fp8_verify(monkeypatch):
    assert _route(monkeypatch, drops_v_scale(), max_qlen=3, **FP8).own
    wrong = _route(monkeypatch, wrong_otherwise(), max_qlen=3, **FP8)
    assert not wrong.own and "measured wrong" in wrong.reasons[0]

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel")

    failed = _route(monkeypatch, dataclasses.replace(REFERENCE, mla_decode_fwd=broken), max_qlen=3, **FP8)
    assert not failed.own and "could not be measured" in failed.reasons[0] and "no kernel" in failed.reasons[0]
    # bf16, or fp8 at query length 1: nothing to measure (the broken kernel is never called)
    assert _route(monkeypatch, dataclasses.replace(REFERENCE, mla_decode_fwd=broken), max_qlen=3).own
    assert _route(monkeypatch, dataclasses.replace(REFERENCE, mla_decode_fwd=broken), **FP8).own


# ---- the contract documents it, and does not refuse it ----


def test_6732_is_a_documented_measured_defect():
    key = ("gfx942", contract.PERSISTENT, 16, contract.FP8, contract.FP8, 3)
    (found,) = contract.measured_defects(TABLE, key)
    assert found.issue == "ROCm/aiter#6732" and found.remedy == contract.MEASURE and found.qlens == DEFECT_QLENS
    # it runs (corrected), it is not refused
    assert contract.kernel_problem("gfx942", contract.PERSISTENT, 16, 3, contract.FP8, contract.FP8, TABLE) is None
    assert not contract.measured_defects(TABLE, ("gfx942", contract.PERSISTENT, 16, contract.FP8, contract.FP8, 1))
    assert {d.remedy for d in contract.defects()} == set(contract.REMEDIES)
