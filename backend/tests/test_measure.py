"""Every decode call the own path makes is measured at start-up, through its own decode call, against
a dense fp32 computation: right -> served; short by exactly kv_scale (ROCm/aiter#6732) -> served,
corrected; wrong, not finite or raising -> not served. The band and the bound come from the reference
kernel's own deviation and apply after any correction; tensor-parallel ranks agree on one route.

The probe reaches where AITER's decode is reported wrong; the stand-ins (measure_standins.py) wrap the
reference kernel, which enforces AITER's host-side contract, each with one such defect: every one of
them is measured not served, and the right ones (rounding P to fp8, #6732, corrected) are served.

The measurement reads nothing of vLLM, so this file runs once; a layer's route from it, through the
adapters as vLLM constructs them, is test_measured_route.py, which runs again on every release track."""
from __future__ import annotations

import dataclasses
import math

import measure_standins as standins
import pytest
import torch

from mla_cases import KV_LORA_RANK
from vllm_aiter_mla import measure
from vllm_aiter_mla.decode import mla_decode
from vllm_aiter_mla.kernels import MLAKernels
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

def test_the_backend_reads_no_aiter_version():
    """No module of the backend asks for AITER's installed version (its decode calls are the
    built-in's and measured): a new AITER release needs no change to it."""
    import ast
    from pathlib import Path

    src = Path(measure.__file__).parent
    found = [f"{path.name}: {node.value!r}" for path in sorted(src.glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value.strip().lower() in ("amd-aiter", "amd_aiter")]  # its distribution names
    assert found == [], found
