"""Every decode call the own path makes, measured at start-up on the GPU it runs on.

The own path makes the decode calls vLLM's built-in of the running release makes for the same
layer (its head count, query lengths, q and KV dtypes, persistent work buffers: ``DecodeCall``).
Whether AITER computes each of them right is not looked up in a model of AITER's dispatch: it is
measured, through the same ``mla_decode`` the own path serves with (same kernels, work buffers and
padding), on deterministic inputs made to reach where AITER's decode is reported wrong, against a
dense fp32 computation of the same (already quantised) inputs.

The probe (``kv_lengths``, ``prepare``): six requests, one of 2,305 keys (split several times by any
kernel; one key past a multiple of every power-of-two split up to 256, so causal rows' first future
key falls inside a split), others of 700 and 300 keys and short ones (one whose first query row sees
exactly one key); two requests share their first slots with the long one (a slot read by three
requests, as vLLM's prefix caching makes them). The keys a causal row must not see are baits (a
score about 10 above the others' typical 0), so a leaking mask cannot hide. fp8 calls run under two
(q_scale, kv_scale) pairs (``PROBE_SCALES``) whose products are neither 1 nor a power of two. Two
batches (the second: the requests in reverse order; fp8: under the second scale pair) run twice
each, alternately, into one set of work buffers re-planned before every run (``RUNS``): each
batch's second run is into buffers that held another batch's plan. Every output buffer is filled
with NaN before the call. The keys go to scattered slots of a private cache, or to the highest
slots of a cache the caller gives (``cache``: e.g. a layer's real KV cache, rows far from its base).

Each run is judged per request against that request's own peak (``deviation``) and by the
least-squares fit of the whole output to the dense result (``Fit``: a scale or an offset is a
systematic error, not rounding):

* ``correct``: every run within the band and the bound;
* ``drops the V scale``: fp8 only; every run within both once multiplied by its own batch's
  ``kv_scale`` (AITER leaves V unscaled, ROCm/aiter#6732): served, with the output multiplied back;
* ``wrong``, ``not finite`` or ``raised``: not served by AITER. Such a call is served by vLLM's own
  Triton MLA decode (``remedy``) once that kernel, measured by the same probe (``run_probe`` takes
  either), is ``correct``; else the server refuses to start (``refusal``). Never the built-in: it
  makes the same AITER call.

The band is ``BAND_FACTOR`` times the larger of the pure-PyTorch reference kernel's own deviation on
the same inputs and the output dtype's unit roundoff (bf16: 3.1 %); the bound is the larger of
``BAND_FACTOR`` times the reference's own systematic error and the unit roundoff (bf16: 0.39 %).
Both are derived, not chosen per kernel, and apply after any correction.

A server measures each set of calls first in a child process (``crash_safe``, ``measure_child``): there
a call can also end the process, pass the time limit, or not be reached (``ended the process``,
``passed the time limit``, ``not measured``), none of them served.

Plain PyTorch; the kernels (AITER, the reference or a stand-in) are passed in.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .decode import mla_decode
from .kernels import MLAKernels
from .persistent import allocate_work, plan_work
from .planning import DecodePlan
from .remedy import TritonDecode, slot_table, triton_mla_decode

KV_LORA_RANK = 512
HEAD_DIM = 576  # kv_lora_rank + rope: the latent row AITER's MLA decode takes
# fp8: two (q_scale, kv_scale) pairs; products 0.629 and 0.793, neither 1 nor a power of two, so scores
# that ignore them shift, and an output short by a factor is short by each pair's own kv_scale or wrong.
PROBE_SCALES = ((0.37, 1.7), (1.3, 0.61))
PROBE_SM_SCALE = 2.0 / HEAD_DIM**0.5  # scores of random rows: standard deviation 2
PROBE_SEED = 6732
LONG_KEYS = 2305  # past 2,048; 1 past a multiple of 256 (and of every smaller power of two)
# (request, the earlier request whose first slots it shares, how many): a shared prefix.
SHARED_PREFIXES = ((4, 3, 512), (5, 3, 64))
# Queries share a component along one direction that ordinary keys lack; the keys a causal row must not
# see (its future) carry it: score QUERY_BIAS * BAIT * PROBE_SM_SCALE = 10 where visible.
QUERY_BIAS = 12.0
BAIT = 10.0
# The batches each call runs, in order, into one set of work buffers re-planned before every run.
RUNS = (0, 1, 0, 1)
# How far outside the reference kernel's own deviation an output may lie and still be right: the
# reference rounds once (to the output dtype); a kernel rounds its scores and probabilities too.
BAND_FACTOR = 8.0


class Outcome(enum.Enum):
    CORRECT = "correct"
    DROPS_V_SCALE = "drops the V scale"  # right once multiplied by kv_scale (ROCm/aiter#6732)
    WRONG = "wrong"
    NOT_FINITE = "not finite"
    RAISED = "raised"
    # Only in a child process (``crash_safe``): the call ended the process (a signal such as SIGABRT or a GPU
    # fault, or a non-zero exit), passed the time limit, or was not reached after another call of the same
    # kernel ended the child.
    ENDED = "ended the process"
    TIMED_OUT = "passed the time limit"
    NOT_MEASURED = "not measured"

    @property
    def served(self) -> bool:
        """Whether the own path serves a call with this outcome (corrected where it drops the V scale)."""
        return self in (Outcome.CORRECT, Outcome.DROPS_V_SCALE)


@dataclass(frozen=True)
class DecodeCall:
    """One AITER MLA decode call the own path makes for a layer."""

    heads: int  # the head count AITER is called with (after padding)
    qlen: int  # query rows per request (1 + speculative tokens at most)
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    out_dtype: torch.dtype = torch.bfloat16
    persistent: bool = True  # get_mla_metadata_v1 work buffers passed

    @property
    def fp8(self) -> bool:
        return self.kv_dtype.itemsize == 1


@dataclass(frozen=True)
class Measured:
    outcome: Outcome
    deviation: float  # worst request's largest |out - dense| over its own largest |dense| (after correction)
    band: float
    detail: str = ""  # what was raised
    scale: float = math.nan  # least-squares output scale (after correction), the run furthest from 1
    offset: float = math.nan  # least-squares offset over the dense result's rms, the largest
    bound: float = math.nan  # the largest |scale - 1| and |offset| a right output may have
    seconds_per_call: float = math.nan  # the probe's runs timed (synchronised), over their count

    def describe(self) -> str:
        if self.outcome is Outcome.RAISED:
            return f"raised {self.detail}"
        if self.outcome in (Outcome.ENDED, Outcome.TIMED_OUT, Outcome.NOT_MEASURED):
            return f"{self.outcome.value} ({self.detail})" if self.detail else self.outcome.value
        if self.outcome is Outcome.NOT_FINITE:
            return "not finite"
        fit = "" if math.isnan(self.scale) else (f"; output scale {self.scale:.4f}, offset {self.offset:+.2%}, "
                                                   f"bound {self.bound:.2%}")
        return f"{self.outcome.value} ({self.deviation:.2%} off, band {self.band:.2%}{fit})"


MEASURED_FIELDS = ("deviation", "band", "scale", "offset", "bound", "seconds_per_call")


def measured_data(m: Measured) -> dict[str, object]:
    """``m`` as JSON data (a number that is not finite as null): what a measurement child reports and a
    record holds."""
    numbers = {name: (value if math.isfinite(value := getattr(m, name)) else None) for name in MEASURED_FIELDS}
    return {"outcome": m.outcome.value, "detail": m.detail, **numbers}


def measured_from(data: object) -> Measured:
    """The ``Measured`` that ``measured_data`` wrote; ValueError (one line) for anything else."""
    outcomes = {o.value: o for o in Outcome}
    if not isinstance(data, dict) or set(data) != {"outcome", "detail", *MEASURED_FIELDS}:
        raise ValueError(f"a measurement must be an object of outcome, detail and {', '.join(MEASURED_FIELDS)}")
    if data["outcome"] not in outcomes or not isinstance(data["detail"], str):
        raise ValueError(f"unknown outcome {str(data['outcome'])[:40]!r} or a detail that is no text")
    numbers = {}
    for name in MEASURED_FIELDS:
        value = data[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name} is neither a number nor null")
        numbers[name] = math.nan if value is None else float(value)
    return Measured(outcomes[data["outcome"]], detail=data["detail"], **numbers)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def kv_lengths(qlen: int) -> tuple[int, ...]:
    """Keys of the probe's requests: one whose first query row sees exactly one key, short ones, and
    ones long enough to be split several times (``LONG_KEYS``); requests 4 and 5 share a prefix with 3."""
    return (qlen, qlen + 17, 300, LONG_KEYS, 700, 97)


def key_ids(qlen: int) -> tuple[list[torch.Tensor], int]:
    """Per request, which of the probe's distinct keys it reads, in order (a shared prefix reads the
    same ones), and how many distinct keys there are."""
    shared = {r: (src, n) for r, src, n in SHARED_PREFIXES}
    ids: list[torch.Tensor] = []
    count = 0
    for r, n in enumerate(kv_lengths(qlen)):
        src, k = shared.get(r, (r, 0))
        own = torch.arange(count, count + n - k)
        ids.append(torch.cat([ids[src][:k], own]) if k else own)
        count += n - k
    return ids, count


@dataclass(frozen=True)
class ProbeBatch:
    """One batch of the probe: what the kernel is given and the dense result."""

    q: torch.Tensor  # [requests * qlen, heads, 576] in the call's q dtype
    keys: torch.Tensor  # [distinct keys, 576] in the call's KV dtype: the cache rows at the probe's slots
    plan: DecodePlan
    expected: torch.Tensor  # [requests * qlen, heads, 512] float32: the dense result
    order: tuple[int, ...]  # the probe request at each position of the batch
    q_scale: torch.Tensor | None
    kv_scale: torch.Tensor | None


@dataclass(frozen=True)
class Probe:
    """A call's probe: its batches, the cache the kernel reads them from, and the band and bound that
    the reference kernel's own deviation on them sets."""

    call: DecodeCall
    batches: tuple[ProbeBatch, ...]
    cache: torch.Tensor  # [rows, ..., 576] in the call's KV dtype
    slots: torch.Tensor  # [distinct keys] int64: the cache rows of the probe's keys
    band: float
    bound: float


def probe_rows(calls: Iterable[DecodeCall]) -> int:
    """The most cache rows the probes of ``calls`` write (each call's distinct keys): in a given cache,
    its highest rows of that count are the only ones a measurement overwrites."""
    return max((key_ids(call.qlen)[1] for call in calls), default=0)


def highest_slots(rows: int, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``count`` slot ids among the highest of a cache of ``rows`` slots, scattered (a layer's real
    cache: the rows furthest from its base)."""
    if count > rows:
        raise ValueError(f"the probe needs {count} slots, the cache has {rows}")
    return torch.randperm(count, generator=generator, device=generator.device if generator else "cpu") + rows - count


def dense(q: torch.Tensor, keys: torch.Tensor, ids: list[torch.Tensor], qlen: int, sm_scale: float) -> torch.Tensor:
    """MLA decode in float32, one request at a time: q [requests * qlen, heads, 576] and keys [n, 576]
    dequantised; request r reads keys ``ids[r]``, its row t sees its first n - qlen + t + 1 keys."""
    out = q.new_empty((q.shape[0], q.shape[1], KV_LORA_RANK))
    for r, idx in enumerate(ids):
        rows = slice(r * qlen, (r + 1) * qlen)
        k = keys[idx]
        scores = torch.einsum("thd,kd->thk", q[rows], k) * sm_scale
        visible = torch.arange(len(idx), device=q.device)[None, :] <= (
            torch.arange(qlen, device=q.device)[:, None] + len(idx) - qlen)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        out[rows] = torch.einsum("thk,kd->thd", scores.softmax(-1), k[:, :KV_LORA_RANK])
    return out


def _batch(call: DecodeCall, q: torch.Tensor, keys: torch.Tensor, expected: torch.Tensor, ids: list[torch.Tensor],
           slots: torch.Tensor, order: tuple[int, ...], scales: tuple[float, float] | None) -> ProbeBatch:
    """The probe's requests in ``order`` (q and expected given in the probe's own order)."""
    device, qlen = q.device, call.qlen
    pos = torch.tensor(order, device=device)

    def reorder(t: torch.Tensor) -> torch.Tensor:
        return t.view(len(ids), qlen, *t.shape[1:])[pos].reshape(t.shape)

    lens = [len(ids[r]) for r in order]
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    plan = DecodePlan(
        qo_indptr=torch.arange(len(order) + 1, dtype=torch.int32, device=device) * qlen,
        kv_indptr=indptr,
        kv_indices=torch.cat([slots[ids[r]] for r in order]).to(torch.int32),
        kv_last_page_lens=torch.ones(len(order), dtype=torch.int32, device=device),
    )

    def scale_tensor(value: float) -> torch.Tensor:
        return torch.full((1,), value, dtype=torch.float32, device=device)

    q_scale, kv_scale = (scale_tensor(scales[0]), scale_tensor(scales[1])) if scales else (None, None)
    return ProbeBatch(reorder(q), keys, plan, reorder(expected), order, q_scale, kv_scale)


def probe_batches(call: DecodeCall, device: torch.device | str, slots: torch.Tensor) -> tuple[ProbeBatch, ...]:
    """The probe's two batches of ``call``, their keys meant for cache rows ``slots``: the requests in
    order and reversed (fp8: the second under the second scale pair). Deterministic (a fixed seed) on a
    given device."""
    device = torch.device(device)
    gen = torch.Generator(device).manual_seed(PROBE_SEED + 131 * call.qlen + call.heads)
    ids, count = key_ids(call.qlen)
    ids = [i.to(device) for i in ids]
    rows = len(ids) * call.qlen
    bias = torch.nn.functional.normalize(torch.randn(HEAD_DIM, generator=gen, device=device), dim=0)
    q = torch.randn(rows, call.heads, HEAD_DIM, generator=gen, device=device) + QUERY_BIAS * bias
    keys = torch.randn(count, HEAD_DIM, generator=gen, device=device)
    keys -= (keys @ bias)[:, None] * bias
    for idx in ids:  # each request's future keys of its first row (none at query length 1)
        keys[idx[len(idx) - call.qlen + 1:]] += BAIT * bias
    orders = (tuple(range(len(ids))), tuple(reversed(range(len(ids)))))
    batches = []
    for order, scales in zip(orders, PROBE_SCALES if call.fp8 else (None, None)):
        if scales is None and batches:  # bf16: the same data in another order
            first = batches[0]
            batches.append(_batch(call, first.q, first.keys, first.expected, ids, slots, order, None))
            continue
        q_scale, kv_scale = scales or (1.0, 1.0)
        q_scale_t = torch.tensor(q_scale, dtype=torch.float32, device=device)
        kv_scale_t = torch.tensor(kv_scale, dtype=torch.float32, device=device)
        qq = (q / q_scale_t).to(call.q_dtype)
        kk = (keys / kv_scale_t).to(call.kv_dtype)
        expected = dense(qq.float() * q_scale_t, kk.float() * kv_scale_t, ids, call.qlen, PROBE_SM_SCALE)
        batches.append(_batch(call, qq, kk, expected, ids, slots, order, scales))
    return tuple(batches)


def run_probe(kernels: MLAKernels | TritonDecode, probe: Probe,
              runs: Iterable[int] = RUNS) -> list[tuple[ProbeBatch, torch.Tensor]]:
    """The probe's batches, in the order ``runs`` names them, through the own path's decode function
    (AITER's kernels, or vLLM's Triton decode: ``remedy.triton_mla_decode``): one set of work buffers
    (persistent AITER calls) re-planned before every run, each output buffer filled with NaN first,
    each batch's keys placed in the cache before its run."""
    call = probe.call
    batches = [probe.batches[i] for i in runs]
    triton = isinstance(kernels, TritonDecode)
    work = None
    if call.persistent and not triton:
        work = allocate_work(kernels, max(len(b.order) for b in batches), call.qlen, call.heads, call.q_dtype,
                             call.kv_dtype, probe.cache.device)
    found = []
    for batch in batches:
        probe.cache.view(-1, HEAD_DIM)[probe.slots] = batch.keys
        if work is not None:
            plan_work(kernels, work, batch.plan, call.qlen)
        out = torch.full((batch.q.shape[0], call.heads, KV_LORA_RANK), float("nan"), dtype=call.out_dtype,
                         device=probe.cache.device)
        args = dict(kernels=kernels, kv_lora_rank=KV_LORA_RANK, scale=PROBE_SM_SCALE, max_seqlen_q=call.qlen,
                    decode_heads=call.heads, out_dtype=call.out_dtype, q_scale=batch.q_scale,
                    kv_scale=batch.kv_scale, out=out)
        if triton:
            # the table as the server passes it (made on the device): its width, the longest request, is known here
            table = slot_table(batch.plan, len(batch.order), max(kv_lengths(call.qlen)),
                               kernels.rows_per_request(call.qlen))
            found.append((batch, triton_mla_decode(batch.q, probe.cache, batch.plan, table=table, **args)))
        else:
            found.append((batch, mla_decode(batch.q, probe.cache, batch.plan, work=work, **args)))
    return found


@dataclass(frozen=True)
class Fit:
    """How far one output (or several) lies from the dense result."""

    deviation: float  # the worst request's largest |out - dense| over its own largest |dense|
    scale: float  # a of the least-squares fit out = a * dense + b over the whole output
    offset: float  # b of that fit over the dense result's rms

    @property
    def systematic(self) -> float:
        return max(abs(self.scale - 1.0), abs(self.offset))

    def within(self, band_: float, bound_: float) -> bool:
        return self.deviation <= band_ and self.systematic <= bound_

    @staticmethod
    def worst(fits: Iterable[Fit]) -> Fit:
        fits = list(fits)
        return Fit(max(f.deviation for f in fits), max((f.scale for f in fits), key=lambda s: abs(s - 1.0)),
                   max((f.offset for f in fits), key=abs))


def fit(out: torch.Tensor, expected: torch.Tensor, requests: int, factor: float | torch.Tensor = 1.0) -> Fit:
    """``out`` (times ``factor``) against ``expected``, both [requests * qlen, heads, 512]."""
    return Fit(*fit_numbers(out, expected, requests, factor).tolist())


def fit_numbers(out: torch.Tensor, expected: torch.Tensor, requests: int,
                factor: float | torch.Tensor = 1.0) -> torch.Tensor:
    """``fit``'s deviation, scale and offset as a float64 tensor on ``out``'s device (nothing read back to
    the host: a caller reads the numbers of all its outputs in one transfer)."""
    y = out.double() * factor
    x = expected.double()
    worst = (y - x).abs().view(requests, -1).amax(1) / x.abs().view(requests, -1).amax(1)
    x, y = x.flatten(), y.flatten()
    xc = x - x.mean()
    scale = (xc * (y - y.mean())).sum() / xc.square().sum()
    offset = (y.mean() - scale * x.mean()) / x.square().mean().sqrt()
    return torch.stack([worst.max(), scale, offset])


def worst_fit(found: Iterable[tuple[ProbeBatch, torch.Tensor]]) -> Fit:
    """``Fit.worst`` of each output's fit against its batch's dense result, read in one transfer."""
    numbers = torch.stack([fit_numbers(out, b.expected, len(b.order)) for b, out in found]).tolist()
    return Fit.worst(Fit(*row) for row in numbers)


def deviation(out: torch.Tensor, expected: torch.Tensor, requests: int = 1) -> float:
    """The largest absolute difference over the largest absolute expected value, per request (rows
    split evenly), the worst request's; inf where a request's expected output is all zero."""
    return fit(out, expected, requests).deviation


def band(reference_deviation: float, out_dtype: torch.dtype) -> float:
    """The largest deviation a right output may have: BAND_FACTOR times the larger of the reference
    kernel's own deviation and the output dtype's unit roundoff (bf16: 0.39 %, so 3.1 %)."""
    return BAND_FACTOR * max(reference_deviation, _unit_roundoff(out_dtype))


def bound(reference_systematic: float, out_dtype: torch.dtype) -> float:
    """The largest systematic error (|scale - 1| or |offset|) a right output may have: the larger of
    BAND_FACTOR times the reference kernel's own and the output dtype's unit roundoff (bf16: 0.39 %). A
    right kernel's rounding averages out over the output; a kernel off by a factor or an offset is not
    right."""
    return max(BAND_FACTOR * reference_systematic, _unit_roundoff(out_dtype))


def _unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def classify(found: list[tuple[ProbeBatch, torch.Tensor]], band_: float, bound_: float) -> Measured:
    """What the outputs of a call's runs are, given each batch's dense result: right, right once each
    multiplied by its own batch's kv_scale (the #6732 pattern; fp8 only, under every scale pair
    alike), not finite or wrong. The band and the bound apply after correction. Every number is read
    back to the host in one transfer."""
    scaled = all(b.kv_scale is not None for b, _ in found)
    parts = [torch.stack([torch.isfinite(out).all().double() for _, out in found]),
             *(fit_numbers(out, b.expected, len(b.order)) for b, out in found)]
    if scaled:
        parts += [b.kv_scale.double().reshape(1) for b, _ in found]
        parts += [fit_numbers(out, b.expected, len(b.order), b.kv_scale.double()) for b, out in found]
    numbers = torch.cat(parts).tolist()
    n = len(found)
    if not all(numbers[:n]):
        return Measured(Outcome.NOT_FINITE, math.nan, band_, bound=bound_)
    plain = Fit.worst(Fit(*numbers[n + 3 * i:n + 3 * i + 3]) for i in range(n))
    if plain.within(band_, bound_):
        return Measured(Outcome.CORRECT, plain.deviation, band_, "", plain.scale, plain.offset, bound_)
    kv_scales = numbers[4 * n:5 * n]
    if scaled and all(k != 1.0 for k in kv_scales):
        fixed = Fit.worst(Fit(*numbers[5 * n + 3 * i:5 * n + 3 * i + 3]) for i in range(n))
        if fixed.within(band_, bound_):
            return Measured(Outcome.DROPS_V_SCALE, fixed.deviation, band_, "", fixed.scale, fixed.offset, bound_)
    return Measured(Outcome.WRONG, plain.deviation, band_, "", plain.scale, plain.offset, bound_)


def prepare(call: DecodeCall, device: torch.device | str, reference: MLAKernels | None = None,
            cache: torch.Tensor | None = None, slots: torch.Tensor | None = None) -> Probe:
    """``call``'s probe, its band and bound set by ``reference`` (default: this package's pure-PyTorch
    kernels) on it. ``cache``: the tensor ([rows, ..., 576] in the call's KV dtype, on ``device``)
    whose rows ``slots`` (default: its highest) the probe's keys are written to, overwriting them (a
    layer's real cache before it serves); default: a private one, the keys at scattered slots."""
    if reference is None:
        from .kernels import load_kernels  # noqa: PLC0415

        reference = load_kernels("reference")
    device = torch.device(device)
    _, count = key_ids(call.qlen)
    gen = torch.Generator(device).manual_seed(PROBE_SEED)
    given = slots is not None  # checked; those made here are distinct rows of the cache by construction
    if cache is None:
        cache = torch.zeros((count, 1, HEAD_DIM), dtype=call.kv_dtype, device=device)
        slots = torch.randperm(count, generator=gen, device=device)
    elif cache.dtype != call.kv_dtype or cache.shape[-1] != HEAD_DIM or not cache.is_contiguous():
        raise ValueError(f"the probe's cache must be a contiguous [rows, ..., {HEAD_DIM}] {dtype_name(call.kv_dtype)} "
                         f"tensor, got {list(cache.shape)} {dtype_name(cache.dtype)}")
    rows = cache.numel() // HEAD_DIM
    if slots is None:
        slots = highest_slots(rows, count, gen)  # distinct and inside the cache (or ValueError)
    slots = slots.to(device=device, dtype=torch.int64)
    if given and (slots.shape != (count,) or int(slots.min()) < 0 or int(slots.max()) >= rows
                  or len(slots.unique()) != count):
        raise ValueError(f"the probe needs {count} distinct slots of the cache's {rows}")
    unjudged = Probe(call, probe_batches(call, device, slots), cache, slots, math.nan, math.nan)
    own = worst_fit(run_probe(reference, unjudged, range(len(unjudged.batches))))
    if not math.isfinite(own.deviation):
        raise ValueError(f"the reference kernel's own output is {own.deviation} off the dense result")
    return Probe(call, unjudged.batches, cache, slots, band(own.deviation, call.out_dtype),
                 bound(own.systematic, call.out_dtype))


def measure(kernels: MLAKernels | TritonDecode, call: DecodeCall, device: torch.device | str,
            reference: MLAKernels | None = None, *, probe: Probe | None = None,
            cache: torch.Tensor | None = None) -> Measured:
    """Run ``call``'s probe through ``kernels`` (``RUNS``) and classify it. Anything the call raises is
    an outcome (``raised``), never an exception out of here. ``reference``: the pure-PyTorch kernels
    whose deviation sets the band (default: this package's); ``probe``: one already made for ``call``
    (else made here, in ``cache`` if given: see ``prepare``)."""
    if probe is None:
        try:
            probe = prepare(call, device, reference, cache)
        except Exception as exc:  # noqa: BLE001  (the probe itself cannot be made: nothing can be served)
            return Measured(Outcome.RAISED, math.nan, math.nan, f"making the probe: {one_line(exc)}")
    try:
        _synchronize(probe.cache)
        started = time.perf_counter()
        found = run_probe(kernels, probe)
        _synchronize(probe.cache)
        per_call = (time.perf_counter() - started) / max(len(found), 1)
    except Exception as exc:  # noqa: BLE001  (a refusing kernel: the call is not served)
        return Measured(Outcome.RAISED, math.nan, probe.band, one_line(exc), bound=probe.bound)
    m = classify(found, probe.band, probe.bound)
    if isinstance(kernels, TritonDecode) and m.outcome is Outcome.DROPS_V_SCALE:  # the remedy is never corrected
        m = dataclasses.replace(m, outcome=Outcome.WRONG, detail="short by exactly kv_scale")
    return dataclasses.replace(m, seconds_per_call=per_call)


def _synchronize(cache: torch.Tensor) -> None:
    if cache.is_cuda:
        torch.cuda.synchronize(cache.device)

def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def layer_calls(heads: int, max_qlen: int, q_dtype: torch.dtype, kv_dtype: torch.dtype,
                out_dtype: torch.dtype) -> tuple[DecodeCall, ...]:
    """The calls a layer makes: one per query length 1 .. max_qlen, persistent."""
    return tuple(DecodeCall(heads, qlen, q_dtype, kv_dtype, out_dtype) for qlen in range(1, max_qlen + 1))


def measure_all(kernels: MLAKernels, calls: Iterable[DecodeCall], device: torch.device | str,
                clock: Callable[[], float] = time.monotonic,
                cache: torch.Tensor | None = None) -> tuple[dict[int, Measured], float]:
    """``measure`` for each call (in ``cache`` if given), keyed by query length, and the seconds it took."""
    started = clock()
    found = {call.qlen: measure(kernels, call, device, cache=cache) for call in calls}
    return found, clock() - started


def measure_both(kernels: MLAKernels, remedy: TritonDecode | None, calls: Iterable[DecodeCall],
                 device: torch.device | str, clock: Callable[[], float] = time.monotonic,
                 cache: torch.Tensor | None = None, *, aiter_at: Iterable[int] | None = None,
                 remedy_at: Iterable[int] | None = None,
                 remedy_where_needed: bool = False) -> tuple[dict[int, Measured], dict[int, Measured], float]:
    """AITER's kernels and the remedy (vLLM's Triton decode; None: it could not be loaded) measured on
    each call's one probe, keyed by query length, and the seconds it all took. ``aiter_at`` and
    ``remedy_at``: the query lengths each kernel is measured at (None: every call's); the others are
    left out of the answer. ``remedy_where_needed``: the remedy only where AITER is not measured here
    or is measured not served (where it would serve this process)."""
    started = clock()
    aiter: dict[int, Measured] = {}
    triton: dict[int, Measured] = {}
    calls = list(calls)
    aiter_at = {c.qlen for c in calls} if aiter_at is None else set(aiter_at)
    remedy_at = {c.qlen for c in calls} if remedy_at is None else set(remedy_at)
    for call in calls:
        if call.qlen not in aiter_at | remedy_at:
            continue
        try:
            probe = prepare(call, device, cache=cache)
        except Exception as exc:  # noqa: BLE001  (the probe itself cannot be made: nothing can be served)
            failed = Measured(Outcome.RAISED, math.nan, math.nan, f"making the probe: {one_line(exc)}")
            aiter.update({call.qlen: failed} if call.qlen in aiter_at else {})
            triton.update({call.qlen: failed} if call.qlen in remedy_at else {})
            continue
        if call.qlen in aiter_at:
            aiter[call.qlen] = measure(kernels, call, device, probe=probe)
        served_here = call.qlen in aiter and aiter[call.qlen].outcome.served
        if call.qlen in remedy_at and not (remedy_where_needed and served_here):
            triton[call.qlen] = (measure(remedy, call, device, probe=probe) if remedy is not None
                                 else Measured(Outcome.RAISED, math.nan, probe.band, "not loaded", bound=probe.bound))
    return aiter, triton, clock() - started


def serving(aiter: dict[int, Measured], triton: dict[int, Measured],
            flags: tuple[frozenset[int], frozenset[int]] | None = None) -> dict[int, str | None]:
    """The kernel that serves each query length: ``aiter`` where AITER's call was measured served,
    ``triton`` where it was not and vLLM's Triton decode was measured correct, None where neither
    (the server refuses to start). ``flags``: the tensor-parallel group's (``agree_flags``): the query
    lengths some rank needs the remedy for, and those some rank measured the remedy wrong for; every
    rank then serves each query length with the same kernel."""
    need, bad = flags if flags is not None else local_flags(aiter, triton)
    return {q: "aiter" if q not in need else (None if q in bad else "triton") for q in sorted(aiter)}


def local_flags(aiter: dict[int, Measured], triton: dict[int, Measured]) -> tuple[frozenset[int], frozenset[int]]:
    """This rank's flags: query lengths AITER does not serve; query lengths the remedy is not correct at."""
    need = frozenset(q for q, m in aiter.items() if not m.outcome.served)
    bad = frozenset(q for q in aiter if q not in triton or triton[q].outcome is not Outcome.CORRECT)
    return need, bad


def agree_flags(flags: tuple[frozenset[int], frozenset[int]], qlens: Iterable[int],
                group=None) -> tuple[frozenset[int], frozenset[int]]:
    """Each flag set united over every rank of ``group`` (a CPU ``torch.distributed`` process group;
    None: this process alone): one exchange, whatever this rank measured."""
    if group is None:
        return flags
    import torch.distributed as dist  # noqa: PLC0415

    qlens = sorted(qlens)
    vector = torch.tensor([int(q in f) for f in flags for q in qlens], dtype=torch.int32)
    dist.all_reduce(vector, op=dist.ReduceOp.MAX, group=group)
    values = vector.view(len(flags), len(qlens)).tolist()
    return tuple(frozenset(q for q, v in zip(qlens, row) if v) for row in values)  # type: ignore[return-value]


def describe_serving(chosen: dict[int, str | None], aiter: dict[int, Measured], triton: dict[int, Measured],
                     triton_function: Callable[[int], str] | None = None) -> str:
    """Per query length: the kernel that serves it, its deviation, and both kernels' time per call at
    probe size, e.g. ``query length 1: AITER (0.21% off; AITER 0.31 ms, Triton 0.52 ms a call)``."""
    parts = []
    for q, kernel in chosen.items():
        a, t = aiter[q], triton.get(q)
        name = "Triton" if triton_function is None else f"Triton {triton_function(q)}"
        times = f"AITER {_ms(a)}, {name} {_ms(t)} a call"
        if kernel == "aiter":
            fix = ", output x kv_scale" if a.outcome is Outcome.DROPS_V_SCALE else ""
            parts.append(f"query length {q}: AITER ({a.deviation:.2%} off{fix}; {times})")
        elif kernel == "triton":
            parts.append(f"query length {q}: {name} ({t.deviation:.2%} off; AITER {a.describe()}; {times})")
        else:
            parts.append(f"query length {q}: none (AITER {a.describe()}; {name} "
                         f"{t.describe() if t else 'not measured'})")
    return "; ".join(parts)


def _ms(m: Measured | None) -> str:
    return "-" if m is None or math.isnan(m.seconds_per_call) else f"{m.seconds_per_call * 1e3:.2f} ms"


def v_scale_fix_qlens(measured: dict[int, Measured]) -> frozenset[int]:
    """The query lengths whose output the own path multiplies by kv_scale."""
    return frozenset(q for q, m in measured.items() if m.outcome is Outcome.DROPS_V_SCALE)


def summary(measured: dict[int, Measured]) -> str:
    """One phrase: what was measured at each query length, grouped, e.g. ``query length 1: correct
    (0.12% off, band 3.12%); 2-4: drops the V scale (...)``."""
    groups: dict[Outcome, list[int]] = {}
    for qlen, m in sorted(measured.items()):
        groups.setdefault(m.outcome, []).append(qlen)
    parts = []
    for outcome, qlens in groups.items():
        worst = max((measured[q] for q in qlens), key=lambda m: (m.deviation == m.deviation, m.deviation))
        parts.append(f"query length {_ranges(qlens)}: {worst.describe()}")
    return "; ".join(parts)


def _ranges(values: list[int]) -> str:
    parts, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ",".join(parts)


def agree(served: bool, group=None) -> bool:
    """Whether every rank of ``group`` (a CPU ``torch.distributed`` process group, e.g. the
    tensor-parallel one; None: this process alone) measured its calls served: every rank then takes
    the same route for the layer, the own path only where all of them can."""
    if group is None:
        return served
    import torch.distributed as dist  # noqa: PLC0415

    flag = torch.tensor([1 if served else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
