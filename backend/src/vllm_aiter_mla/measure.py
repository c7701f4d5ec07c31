"""Every decode call the own path makes, measured once at start-up on the GPU it runs on.

The own path makes the decode calls vLLM's built-in of the running release makes for the same
layer (its head count, query lengths, q and KV dtypes, persistent work buffers: ``DecodeCall``).
Whether AITER computes each of them right is not looked up in a model of AITER's dispatch: it is
measured. Each call runs once, through the same ``mla_decode`` the own path serves with (same
kernels, work buffers and padding), on small deterministic inputs, and its output is compared with
a dense fp32 computation of the same (already quantised) inputs:

* ``correct``: within the band of the dense result;
* ``drops the V scale``: fp8 only; within the band once multiplied by ``kv_scale`` (AITER leaves V
  unscaled, ROCm/aiter#6732): served, with the output multiplied back;
* ``wrong``, ``not finite`` or ``raised``: the layer goes to vLLM's built-in.

The band is derived, not chosen per kernel: ``BAND_FACTOR`` times the larger of the pure-PyTorch
reference kernel's own deviation from the dense result on the same inputs and the output dtype's
unit roundoff (bf16: a band of 3.1 %), applied after any correction. The probe inputs are made so that a kernel ignoring
the causal mask, a request's offset, its key count or the scale lands far outside it (a request
whose first query row sees exactly one key, a short one and a long one).

Plain PyTorch; the kernels (AITER, the reference or a stand-in) are passed in.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .decode import mla_decode
from .kernels import MLAKernels
from .persistent import allocate_work, plan_work
from .planning import DecodePlan

KV_LORA_RANK = 512
HEAD_DIM = 576  # kv_lora_rank + rope: the latent row AITER's MLA decode takes
PROBE_KV_SCALE = 2.0  # fp8: distinct from 1, so an unscaled V shows as an output halved
PROBE_Q_SCALE = 0.5
PROBE_SM_SCALE = 2.0 / HEAD_DIM**0.5  # peaked enough that masks and offsets matter
PROBE_SEED = 6732
# How far outside the reference kernel's own deviation an output may lie and still be right: the
# reference rounds once (to the output dtype); a kernel rounds its scores and probabilities too.
BAND_FACTOR = 8.0


class Outcome(enum.Enum):
    CORRECT = "correct"
    DROPS_V_SCALE = "drops the V scale"  # right once multiplied by kv_scale (ROCm/aiter#6732)
    WRONG = "wrong"
    NOT_FINITE = "not finite"
    RAISED = "raised"

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
    deviation: float  # largest |out - dense| over the largest |dense| (after correction); nan: none
    band: float
    detail: str = ""  # what was raised

    def describe(self) -> str:
        if self.outcome is Outcome.RAISED:
            return f"raised {self.detail}"
        if self.outcome is Outcome.NOT_FINITE:
            return "not finite"
        return f"{self.outcome.value} ({self.deviation:.2%} off, band {self.band:.2%})"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def kv_lengths(qlen: int) -> tuple[int, ...]:
    """Keys of the probe's requests: one whose first query row sees exactly one key, a short one
    and one long enough to be split across compute units."""
    return (qlen, qlen + 17, 300)


@dataclass(frozen=True)
class ProbeInputs:
    q: torch.Tensor  # [requests * qlen, heads, 576] in the call's q dtype
    kv: torch.Tensor  # [slots, 1, 576] in the call's KV dtype (a page of one slot per row)
    plan: DecodePlan
    expected: torch.Tensor  # [requests * qlen, heads, 512] float32: the dense result
    q_scale: torch.Tensor | None
    kv_scale: torch.Tensor | None
    scale: float


def probe_inputs(call: DecodeCall, device: torch.device | str) -> ProbeInputs:
    """Deterministic inputs of ``call`` (made on the CPU from a fixed seed) and their dense result:
    the requests' keys lie at scattered slots of the cache; causal within each request's rows."""
    gen = torch.Generator().manual_seed(PROBE_SEED + 131 * call.qlen + call.heads)
    lens = kv_lengths(call.qlen)
    slots = sum(lens)
    q_scale = PROBE_Q_SCALE if call.fp8 else 1.0
    kv_scale = PROBE_KV_SCALE if call.fp8 else 1.0
    q = (torch.randn(len(lens) * call.qlen, call.heads, HEAD_DIM, generator=gen) / q_scale).to(call.q_dtype)
    kv = (torch.randn(slots, HEAD_DIM, generator=gen) / kv_scale).to(call.kv_dtype)
    order = torch.randperm(slots, generator=gen)
    qf, kf = q.float() * q_scale, kv.float() * kv_scale
    expected = torch.empty(len(lens) * call.qlen, call.heads, KV_LORA_RANK)
    start = 0
    for r, n in enumerate(lens):
        keys = kf[order[start:start + n]]
        rows = slice(r * call.qlen, (r + 1) * call.qlen)
        scores = torch.einsum("qhd,kd->qhk", qf[rows], keys) * PROBE_SM_SCALE
        visible = torch.arange(n)[None, :] <= torch.arange(call.qlen)[:, None] + n - call.qlen
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        expected[rows] = torch.einsum("qhk,kd->qhd", scores.softmax(-1), keys[:, :KV_LORA_RANK])
        start += n
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    plan = DecodePlan(
        qo_indptr=(torch.arange(len(lens) + 1, dtype=torch.int32) * call.qlen).to(device),
        kv_indptr=indptr.to(device),
        kv_indices=order.to(torch.int32).to(device),
        kv_last_page_lens=torch.ones(len(lens), dtype=torch.int32, device=device),
    )

    def scale_tensor(value: float) -> torch.Tensor | None:
        return torch.full((1,), value, dtype=torch.float32, device=device) if call.fp8 else None

    return ProbeInputs(q.to(device), kv.view(slots, 1, HEAD_DIM).to(device), plan, expected.to(device),
                       scale_tensor(q_scale), scale_tensor(kv_scale), PROBE_SM_SCALE)


def run_call(kernels: MLAKernels, call: DecodeCall, inputs: ProbeInputs) -> torch.Tensor:
    """``call`` on ``inputs`` through the own path's decode function (and its work buffers)."""
    work = None
    if call.persistent:
        work = allocate_work(kernels, len(inputs.plan.kv_last_page_lens), call.qlen, call.heads, call.q_dtype,
                             call.kv_dtype, inputs.q.device)
        plan_work(kernels, work, inputs.plan, call.qlen)
    return mla_decode(inputs.q, inputs.kv, inputs.plan, kernels=kernels, kv_lora_rank=KV_LORA_RANK,
                      scale=inputs.scale, max_seqlen_q=call.qlen, decode_heads=call.heads,
                      out_dtype=call.out_dtype, q_scale=inputs.q_scale, kv_scale=inputs.kv_scale, work=work)


def deviation(out: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference over the largest absolute expected value (inf where the
    expected output is all zero)."""
    peak = expected.abs().max().item()
    worst = (out.float() - expected.float()).abs().max().item()
    return worst / peak if peak > 0 else float("inf")


def band(reference_deviation: float, out_dtype: torch.dtype) -> float:
    """The largest deviation a right output may have: BAND_FACTOR times the larger of the reference
    kernel's own deviation and the output dtype's unit roundoff (bf16: 0.39 %, so 3.1 %)."""
    step = torch.finfo(out_dtype).eps / 2 if out_dtype.is_floating_point else 0.0
    return BAND_FACTOR * max(reference_deviation, step)


def classify(out: torch.Tensor, expected: torch.Tensor, band_: float, kv_scale: float | None) -> Measured:
    """What ``out`` is, given the dense result of the same inputs; with ``kv_scale`` (fp8), an
    output right once multiplied by it is the #6732 pattern. The band applies after correction."""
    if not bool(torch.isfinite(out).all()):
        return Measured(Outcome.NOT_FINITE, float("nan"), band_)
    off = deviation(out, expected)
    if off <= band_:
        return Measured(Outcome.CORRECT, off, band_)
    if kv_scale is not None and kv_scale != 1.0:
        corrected = deviation(out.float() * kv_scale, expected)
        if corrected <= band_:
            return Measured(Outcome.DROPS_V_SCALE, corrected, band_)
    return Measured(Outcome.WRONG, off, band_)


def measure(kernels: MLAKernels, call: DecodeCall, device: torch.device | str,
            reference: MLAKernels | None = None) -> Measured:
    """Run ``call`` once through ``kernels`` and classify it. Anything the call raises is an
    outcome (``raised``), never an exception out of here. ``reference``: the pure-PyTorch kernels
    whose deviation sets the band (default: this package's)."""
    if reference is None:
        from .kernels import load_kernels  # noqa: PLC0415

        reference = load_kernels("reference")
    try:
        inputs = probe_inputs(call, device)
        band_ = band(deviation(run_call(reference, call, inputs), inputs.expected), call.out_dtype)
    except Exception as exc:  # noqa: BLE001  (the probe itself cannot be made: nothing can be served)
        return Measured(Outcome.RAISED, float("nan"), float("nan"), f"making the probe: {one_line(exc)}")
    try:
        out = run_call(kernels, call, inputs)
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
    except Exception as exc:  # noqa: BLE001  (a refusing kernel: the layer goes to the built-in)
        return Measured(Outcome.RAISED, float("nan"), band_, one_line(exc))
    kv_scale = float(inputs.kv_scale.item()) if inputs.kv_scale is not None else None
    return classify(out, inputs.expected, band_, kv_scale)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def layer_calls(heads: int, max_qlen: int, q_dtype: torch.dtype, kv_dtype: torch.dtype,
                out_dtype: torch.dtype) -> tuple[DecodeCall, ...]:
    """The calls a layer makes: one per query length 1 .. max_qlen, persistent."""
    return tuple(DecodeCall(heads, qlen, q_dtype, kv_dtype, out_dtype) for qlen in range(1, max_qlen + 1))


def measure_all(kernels: MLAKernels, calls: Iterable[DecodeCall], device: torch.device | str,
                clock: Callable[[], float] = time.monotonic) -> tuple[dict[int, Measured], float]:
    """``measure`` for each call, keyed by query length, and the seconds it took."""
    started = clock()
    found = {call.qlen: measure(kernels, call, device) for call in calls}
    return found, clock() - started


def v_scale_fix_qlens(measured: dict[int, Measured]) -> frozenset[int]:
    """The query lengths whose output the own path multiplies by kv_scale."""
    return frozenset(q for q, m in measured.items() if m.outcome is Outcome.DROPS_V_SCALE)


def unserved(measured: dict[int, Measured]) -> dict[int, Measured]:
    """The query lengths measured wrong, not finite or raising."""
    return {q: m for q, m in sorted(measured.items()) if not m.outcome.served}


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
