"""Every decode call the own path makes is measured at start-up, through its own decode call, against
a dense fp32 computation: right -> own; short by exactly kv_scale (ROCm/aiter#6732) -> own,
corrected; wrong, not finite or raising -> the layer goes to vLLM's built-in, in one start-up line,
never an exception out of vLLM's layer construction. The band comes from the reference kernel's own
deviation and applies after any correction; a measurement is made once per process and remembered,
failed or not; tensor-parallel ranks agree on one route.

The stand-ins wrap the reference kernel (which enforces AITER's host-side contract) and change its
output where a broken AITER would."""
from __future__ import annotations

import dataclasses
import logging
import types

import pytest
import torch

from mla_cases import KV_LORA_RANK, DecodeCase, dense_mla, make
from vllm_aiter_mla import backend, measure
from vllm_aiter_mla.decode import mla_decode
from vllm_aiter_mla.kernels import MLAKernels, load_kernels
from vllm_aiter_mla.persistent import allocate_work, plan_work
from vllm_aiter_mla.planning import plan_decode

REFERENCE = load_kernels("reference")
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
DEFECT_QLENS = (2, 3, 4)


def stand_in(name: str, change, qlens=DEFECT_QLENS, fp8_only: bool = True) -> MLAKernels:
    """The reference kernel with ``change(o, kwargs)`` applied to its output at ``qlens`` (persistent
    calls; fp8 calls only unless ``fp8_only`` is False)."""
    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                       **kwargs):
        result = REFERENCE.mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                                          max_seqlen_q, **kwargs)
        if (kwargs.get("kv_scale") is not None or not fp8_only) and kwargs.get("work_meta_data") is not None \
                and max_seqlen_q in qlens:
            change(o, kwargs)
        return result

    return dataclasses.replace(REFERENCE, name=name, mla_decode_fwd=mla_decode_fwd)


def drops_v_scale() -> MLAKernels:
    return stand_in("drops-v-scale", lambda o, kw: o.div_(kw["kv_scale"]))


def scaled(factor: float, qlens=(3,), fp8_only=False) -> MLAKernels:
    return stand_in(f"x{factor}", lambda o, kw: o.mul_(factor), qlens, fp8_only)


def raising(qlens=(2,)) -> MLAKernels:
    def fail(o, kw):
        raise RuntimeError("AITER: no kernel for this call")
    return stand_in("raises", fail, qlens, fp8_only=False)


def one_element_off(o, kw):
    peak = o.float().abs().max()
    o.view(-1)[o.numel() // 2] += (0.09 * peak).to(o.dtype)


def same_row_for_every_query(o, kw):
    """ROCm/aiter#2720's pattern: every query row of a request gets the last row's output."""
    qlen = int(o.shape[0] // 3)
    rows = o.view(3, qlen, *o.shape[1:])
    rows.copy_(rows[:, -1:].expand_as(rows).clone())


def _measure(kernels, dtype=FP8, heads=16, max_qlen=4):
    found, _ = measure.measure_all(kernels, measure.layer_calls(heads, max_qlen, dtype, dtype, BF16), "cpu")
    return {q: m.outcome.name for q, m in found.items()}


# ---- the measurement ----


@pytest.mark.parametrize("dtype", [BF16, FP8])
def test_a_right_kernel_measures_correct_at_every_length(dtype):
    assert set(_measure(REFERENCE, dtype).values()) == {"CORRECT"}
    assert set(_measure(REFERENCE, dtype, heads=128, max_qlen=8).values()) == {"CORRECT"}


def test_the_6732_pattern_is_found_exactly_where_it_is_and_only_in_fp8():
    assert _measure(drops_v_scale()) == {1: "CORRECT", 2: "DROPS_V_SCALE", 3: "DROPS_V_SCALE", 4: "DROPS_V_SCALE"}
    assert set(_measure(drops_v_scale(), BF16).values()) == {"CORRECT"}  # no kv_scale in bf16 calls


@pytest.mark.parametrize("kernels,qlen,outcome", [
    (scaled(1.095), 3, "WRONG"),  # 9.5 % off: the old 10 % tolerance took it for right
    (scaled(0.41, fp8_only=True), 3, "WRONG"),  # 0.82x once corrected: not the V scale
    (scaled(0.59, fp8_only=True), 3, "WRONG"),
    (stand_in("one element", one_element_off, (3,), False), 3, "WRONG"),
    (stand_in("2720", same_row_for_every_query, (3,), False), 3, "WRONG"),
    (stand_in("nan", lambda o, kw: o.fill_(float("nan")), (3,), False), 3, "NOT_FINITE"),
    (stand_in("zeros", lambda o, kw: o.zero_(), (3,), False), 3, "WRONG"),
    (raising((3,)), 3, "RAISED"),
], ids=["9.5%", "0.41x", "0.59x", "one-element-9%", "aiter-2720", "nan", "zeros", "raises"])
def test_a_wrong_call_is_found_at_its_query_length_only(kernels, qlen, outcome):
    found = _measure(kernels)
    assert found[qlen] == outcome
    assert {q: o for q, o in found.items() if q != qlen} == {q: "CORRECT" for q in found if q != qlen}


def test_the_band_comes_from_the_reference_kernels_own_deviation():
    call = measure.DecodeCall(16, 2, FP8, FP8)
    inputs = measure.probe_inputs(call, "cpu")
    own = measure.deviation(measure.run_call(REFERENCE, call, inputs), inputs.expected)
    assert 0 < own < 0.0035  # the reference is within 0.35 % of the dense result
    found = measure.measure(REFERENCE, call, "cpu")
    assert found.band == measure.band(own, BF16) == pytest.approx(measure.BAND_FACTOR * 2**-8)
    assert measure.band(0.01, BF16) == pytest.approx(0.08)  # a worse reference widens it


def test_classification_applies_the_band_after_correction():
    expected = torch.randn(6, 16, 512, generator=torch.Generator().manual_seed(1))
    band = 0.03
    assert measure.classify(expected, expected, band, 2.0).outcome is measure.Outcome.CORRECT
    assert measure.classify(expected / 2, expected, band, 2.0).outcome is measure.Outcome.DROPS_V_SCALE
    assert measure.classify(expected / 2 * 1.05, expected, band, 2.0).outcome is measure.Outcome.WRONG
    assert measure.classify(expected / 2, expected, band, None).outcome is measure.Outcome.WRONG  # bf16: no scale
    assert measure.classify(expected * float("inf"), expected, band, 2.0).outcome is measure.Outcome.NOT_FINITE


def test_an_output_is_measured_by_its_largest_error():
    expected = torch.ones(2, 16, 512)
    out = expected.clone()
    out[1, 3, 7] = 1.05
    assert measure.deviation(out, expected) == pytest.approx(0.05)
    assert measure.deviation(out, torch.zeros_like(out)) == float("inf")


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
def fresh(monkeypatch):
    """Measurements of this test only (the process keeps them otherwise)."""
    monkeypatch.setattr(backend, "_MEASURED", {})
    monkeypatch.setattr(backend, "_platform_fp8_dtype", lambda: FP8)


def _own_path(monkeypatch, kernels: MLAKernels, qlen: int):
    """The own path's decode of an fp8 cache with kv_scale 0.01 at query length ``qlen`` -> (its
    output projected like the dense computation, the dense computation, the impl)."""
    monkeypatch.setattr(backend, "get_current_vllm_config", lambda: _config(qlen))
    monkeypatch.setattr(backend, "load_kernels", lambda: kernels)
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
    out, expected, impl = _own_path(monkeypatch, drops_v_scale(), qlen)
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


def test_a_wrong_kernel_stops_an_unrouted_impl_in_one_line(monkeypatch, fresh):
    """CPU development mode has no built-in to hand a layer to: its impl stops, naming what was measured."""
    with pytest.raises(ValueError, match=r"measured at start-up: query length 3: wrong \(") as err:
        _own_path(monkeypatch, scaled(1.2, (3,)), 3)
    assert "\n" not in str(err.value)


# ---- routing through the adapter: vLLM's layer construction never sees an exception ----


def _route_config(max_qlen: int, kv_cache_dtype: str = "fp8"):
    config = _config(max_qlen)
    config.parallel_config = types.SimpleNamespace(decode_context_parallel_size=1)
    config.attention_config = types.SimpleNamespace(use_non_causal=False)
    config.cache_config = types.SimpleNamespace(cache_dtype=kv_cache_dtype)
    return config


@pytest.mark.parametrize("kernels,own,reason", [
    (REFERENCE, True, None),
    (drops_v_scale(), True, None),
    (scaled(1.2, (3,)), False, "query length 3: wrong"),
    (raising((2,)), False, "query length 2: raised RuntimeError: AITER: no kernel"),
    (stand_in("nan", lambda o, kw: o.fill_(float("nan")), (4,), False), False, "query length 4: not finite"),
], ids=["right", "6732", "wrong", "raises", "nan"])
def test_layer_route_measures_every_call(monkeypatch, fresh, caplog, kernels, own, reason):
    monkeypatch.setattr(backend, "load_kernels", lambda: kernels)
    with caplog.at_level(logging.INFO, logger="vllm.aiter_mla"):
        route = backend.layer_route(_route_config(4), 16, 576, "fp8")
    assert route.own is own, route.describe()
    if reason:
        assert reason in route.reasons[0], route.reasons
    lines = [r.getMessage() for r in caplog.records if "measured on cpu in" in r.getMessage()]
    assert len(lines) == 1 and "16 heads, q float8_e4m3fn / KV float8_e4m3fn, persistent" in lines[0], lines


def test_the_kernels_not_loading_is_a_measurement_too(monkeypatch, fresh):
    def unavailable():
        raise RuntimeError("import aiter failed")

    monkeypatch.setattr(backend, "load_kernels", unavailable)
    route = backend.layer_route(_route_config(2, "auto"), 16, 576, "auto")
    assert not route.own and "loading the kernels: RuntimeError: import aiter failed" in route.reasons[0]


def test_a_measurement_is_made_once_per_process_failed_or_not(monkeypatch, fresh):
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[7])
        raise RuntimeError("no kernel")

    monkeypatch.setattr(backend, "load_kernels", lambda: dataclasses.replace(REFERENCE, mla_decode_fwd=counting))
    for _ in range(3):  # three layers of one model
        assert not backend.layer_route(_route_config(2), 16, 576, "fp8").own
    assert calls == [1, 2]  # each query length once, for every layer


def test_the_routed_impl_hands_a_failing_layer_to_the_built_in(monkeypatch, fresh):
    """The class vLLM instantiates: the built-in's impl where the own path's calls fail, no exception."""
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    monkeypatch.setattr(builtin.AiterMLAImpl, "__init__", lambda self, *a, **k: None)  # (it imports AITER)
    monkeypatch.setattr(backend, "get_current_vllm_config", lambda: _route_config(3))
    monkeypatch.setattr(backend, "load_kernels", lambda: raising((1, 2, 3)))
    impl = backend.AiterMLABackend.get_impl_cls()(
        num_heads=16, head_size=576, scale=0.1, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
        kv_cache_dtype="fp8", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None)
    assert isinstance(impl, builtin.AiterMLAImpl) and not isinstance(impl, backend.AiterMLAImpl)


# ---- tensor parallelism: every rank takes the same route ----

AGREE = """
import sys, torch.distributed as dist
from vllm_aiter_mla import measure
rank, served, port = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
print("agreed" if measure.agree(served, dist.group.WORLD) else "built-in")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("served", [(True, True), (True, False), (False, False)])
def test_ranks_that_disagree_all_take_the_built_in(served):
    """Two ranks over a real gloo group on loopback: the own path only where both measured it right."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", AGREE, str(rank), "1" if ok else "0", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, ok in enumerate(served)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    want = "agreed" if all(served) else "built-in"
    assert [out.strip() for out, _ in outs] == [want, want], outs


def test_one_process_alone_keeps_its_own_answer():
    assert measure.agree(True) and not measure.agree(False)


def test_the_start_up_bench_measures_every_deepseek_shape():
    """backend/bench/measure_calls.py (the timing quoted in backend/README.md) runs without vLLM and
    finds the reference right for every configuration it times."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "measure_calls.py"
    env = {**os.environ, "PYTHONPATH": str(bench.parents[1] / "src")}
    run = subprocess.run([sys.executable, str(bench), "--kernels", "reference"], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("reference ")]
    assert len(lines) == 16 and all("wrong" not in line and ": correct" in line for line in lines), run.stdout
    assert "start-up time added, slowest configuration (reference):" in run.stdout


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
    monkeypatch.setattr(backend, "load_kernels", lambda: REFERENCE)
    for kv, qlen in (("auto", 1), ("fp8", 4)):
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
