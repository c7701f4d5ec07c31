"""Stand-in AITER MLA decode kernels for the start-up measurement's tests.

Each wraps the reference kernel (which enforces AITER's host-side contract on every call: shapes,
dtypes, index tensors, work buffers planned for the batch at hand) and adds one defect, of the kinds
reported against AITER's MLA decode or that a split-KV kernel of its design can have; three are right
(the reference, one rounding P to fp8 before P.V, and one leaving V unscaled as ROCm/aiter#6732 does,
which the own path corrects).

Defects that live in how a kernel splits a request's keys recompute the affected outputs with
``split_attention``: a request's keys cut into splits, each split's partial output and log-sum-exp,
then a reduce over the partials, in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from vllm_aiter_mla.kernels import MLAKernels, load_kernels

REFERENCE = load_kernels("reference")
LATENT = 576
V_DIM = 512
FP8 = torch.float8_e4m3fn


@dataclasses.dataclass
class Decode:
    """One ``mla_decode_fwd`` call's arguments, read per request."""

    q: torch.Tensor
    kv: torch.Tensor  # [pages, 1, 1, 576]
    o: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last: torch.Tensor
    qlen: int
    kwargs: dict

    def reference(self, **changes):
        """The reference kernel on these arguments, some of them changed (by name)."""
        args = {"q": self.q, "kv_buffer": self.kv, "o": self.o, "qo_indptr": self.qo_indptr,
                "kv_indptr": self.kv_indptr, "kv_indices": self.kv_indices, "kv_last_page_lens": self.last,
                "max_seqlen_q": self.qlen, **self.kwargs, **changes}
        return REFERENCE.mla_decode_fwd(**args)

    @property
    def requests(self) -> int:
        return self.kv_indptr.shape[0] - 1

    @property
    def fp8(self) -> bool:
        return self.kwargs.get("kv_scale") is not None

    @property
    def q_scale(self) -> float:
        return float(self.kwargs["q_scale"].item()) if self.fp8 else 1.0

    @property
    def kv_scale(self) -> float:
        return float(self.kwargs["kv_scale"].item()) if self.fp8 else 1.0

    @property
    def sm_scale(self) -> float:
        return self.kwargs["sm_scale"]

    def rows(self, r: int) -> slice:
        return slice(r * self.qlen, (r + 1) * self.qlen)

    def lengths(self) -> list[int]:
        return (self.kv_indptr[1:] - self.kv_indptr[:-1]).tolist()

    def slots(self, r: int) -> torch.Tensor:
        return self.kv_indices[int(self.kv_indptr[r]):int(self.kv_indptr[r + 1])].long()

    def queries(self, r: int) -> torch.Tensor:
        return self.q[self.rows(r)].float() * self.q_scale

    def keys(self, r: int) -> torch.Tensor:
        return self.kv.view(-1, LATENT)[self.slots(r)].float() * self.kv_scale


def split_attention(q: torch.Tensor, keys: torch.Tensor, sm_scale: float, *, split: int = 64,
                    keys_visited: int | None = None, mask_last_split_only: bool = False,
                    max_partials: int | None = None, log2_reduce: bool = False,
                    p_dtype: torch.dtype | None = None) -> torch.Tensor:
    """One request's MLA decode as a split-KV kernel computes it: q [qlen, heads, 576], keys [n, 576]
    (dequantised); row t sees keys j <= n - qlen + t. ``keys_visited``: keys from there on are never
    visited (a capped split count); ``mask_last_split_only``: the causal mask applied in the request's
    last split only; ``max_partials``: the reduce combines the first that many partials; ``log2_reduce``:
    partials weighted by 2**(lse - max) of natural-log lse's; ``p_dtype``: each split's probabilities
    (relative to the split's largest, so in (0, 1]) rounded to it before P.V. Returns [qlen, heads, 512]."""
    qlen, n = q.shape[0], keys.shape[0]
    scores = torch.einsum("thd,kd->thk", q, keys) * sm_scale
    j = torch.arange(n, device=q.device)
    hidden = j[None, :] > torch.arange(qlen, device=q.device)[:, None] + n - qlen  # [qlen, n]
    if mask_last_split_only:
        hidden &= j[None, :] >= (n - 1) // split * split
    if keys_visited is not None:
        hidden |= j[None, :] >= keys_visited
    scores = scores.masked_fill(hidden[:, None, :], float("-inf"))
    count = -(-n // split)
    pad = count * split - n
    scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf")).unflatten(-1, (count, split))
    values = torch.nn.functional.pad(keys[:, :V_DIM], (0, 0, 0, pad)).view(count, split, V_DIM)
    peak = scores.amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    p = torch.exp(scores - peak)
    total = p.sum(-1)  # [qlen, heads, splits]
    if p_dtype is not None:
        p = p.to(p_dtype).float()
    partial = torch.einsum("thsk,skd->thsd", p, values) / total.clamp_min(1e-30)[..., None]
    lse = peak.squeeze(-1) + torch.log(total)  # -inf for a split with nothing visible
    if max_partials is not None:
        lse[..., max_partials:] = float("-inf")
    shift = lse - lse.amax(-1, keepdim=True)
    weight = torch.exp2(shift) if log2_reduce else torch.exp(shift)
    return (weight[..., None] * partial).sum(-2) / weight.sum(-1)[..., None]


def stand_in(name: str, defect: Callable[[Decode], object], fp8_only: bool = False, **kernels) -> MLAKernels:
    """The reference kernel with ``defect`` (which runs the call; fp8 calls only if ``fp8_only``)."""
    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q, **kw):
        d = Decode(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q, kw)
        return defect(d) if d.fp8 or not fp8_only else d.reference()

    return dataclasses.replace(REFERENCE, name=name, mla_decode_fwd=mla_decode_fwd, **kernels)


def after(change: Callable[[Decode], None]) -> Callable[[Decode], object]:
    """The reference's answer, then ``change`` to it."""
    def defect(d: Decode):
        result = d.reference()
        change(d)
        return result

    return defect


def recompute(keys_hook: Callable[[Decode, int, torch.Tensor], torch.Tensor] | None = None,
              **split) -> Callable[[Decode], object]:
    """The reference's call (its contract), then every request's rows recomputed by ``split_attention``
    with ``split``'s defect (``keys_hook``: what the kernel reads for request r's keys)."""
    def defect(d: Decode):
        result = d.reference()
        for r in range(d.requests):
            keys = d.keys(r)
            if keys_hook is not None:
                keys = keys_hook(d, r, keys)
            d.o[d.rows(r)] = split_attention(d.queries(r), keys, d.sm_scale, **split).to(d.o.dtype)
        return result

    return defect


# ---- defects: each must be measured not served ----


def keys_dropped_past(limit: int) -> MLAKernels:
    """A capped split count: keys from ``limit`` on never visited."""
    return stand_in(f"keys past {limit} dropped", recompute(keys_visited=limit))


def reduce_of_at_most(partials: int = 32, split: int = 48) -> MLAKernels:
    """Splits of ``split`` keys, a reduce that combines the first ``partials`` of them."""
    return stand_in(f"reduce of {partials} partials", recompute(split=split, max_partials=partials))


def log2_ln_mixup(split: int = 256) -> MLAKernels:
    """Partials of a request split in several combined with exp2 of natural-log lse's."""
    return stand_in("log2/ln mix-up when split", recompute(split=split, log2_reduce=True))


def nan_past(limit: int = 1024) -> MLAKernels:
    def change(d: Decode):
        for r, n in enumerate(d.lengths()):
            if n > limit:
                d.o[d.rows(r)] = float("nan")

    return stand_in(f"NaN past {limit} keys", after(change))


def rows_of_another_request(first: int = 3) -> MLAKernels:
    """Requests from index ``first`` on given the rows of the request ``first`` places before."""
    def change(d: Decode):
        for r in range(first, d.requests):
            d.o[d.rows(r)] = d.o[d.rows(r - first)].clone()

    return stand_in(f"requests from the {first + 1}th on given another's rows", after(change))


def rows_never_written() -> MLAKernels:
    """The last request's rows keep what the output buffer held before the call."""
    def defect(d: Decode):
        held = d.o[d.rows(d.requests - 1)].clone()
        result = d.reference()
        d.o[d.rows(d.requests - 1)] = held
        return result

    return stand_in("a request's rows never written", defect)


def causal_mask_in_last_split_only(split: int = 64) -> MLAKernels:
    return stand_in("causal mask in the last split only", recompute(split=split, mask_last_split_only=True))


def repeated_slot_read_as_zeros() -> MLAKernels:
    """A slot that an earlier request of the batch (or an earlier key) already read comes back zero."""
    def zero_repeats(d: Decode, r: int, keys: torch.Tensor) -> torch.Tensor:
        flat = d.kv_indices[:int(d.kv_indptr[-1])].long()
        order = torch.sort(flat, stable=True).indices
        repeat_sorted = torch.cat([torch.zeros(1, dtype=torch.bool), flat[order][1:] == flat[order][:-1]])
        repeat = torch.empty_like(repeat_sorted)
        repeat[order] = repeat_sorted
        mine = repeat[int(d.kv_indptr[r]):int(d.kv_indptr[r + 1])]
        return keys.masked_fill(mine[:, None], 0.0)

    return stand_in("a repeated slot read as zeros", recompute(zero_repeats))


def scaled(factor: float) -> MLAKernels:
    return stand_in(f"x{factor}", after(lambda d: d.o.mul_(factor)))


def biased(offset: float) -> MLAKernels:
    return stand_in(f"{offset:+}", after(lambda d: d.o.add_(offset)))


def scores_without_scales() -> MLAKernels:
    """fp8: scores from the raw fp8 values (q_scale x kv_scale left out); V scaled."""
    return stand_in("fp8 scores without q_scale x kv_scale",
                    lambda d: d.reference(sm_scale=d.sm_scale / (d.q_scale * d.kv_scale)), fp8_only=True)


def halved() -> MLAKernels:
    """fp8: the output halved (not the V scale: corrected by kv_scale it is still wrong)."""
    return stand_in("fp8 output halved", after(lambda d: d.o.mul_(0.5)), fp8_only=True)


def v_scale_dropped_under(kv_scale_above: float) -> MLAKernels:
    """fp8: V left unscaled only where kv_scale exceeds ``kv_scale_above`` (the scale pairs disagree)."""
    def change(d: Decode):
        if d.kv_scale > kv_scale_above:
            d.o.div_(d.kv_scale)

    return stand_in("V unscaled under one scale pair", after(change), fp8_only=True)


def right_on_first_call_only() -> MLAKernels:
    """Later calls write the first call's answer where the output has its shape (a stale result),
    and nothing elsewhere."""
    first: list[torch.Tensor] = []

    def defect(d: Decode):
        if not first:
            result = d.reference()
            first.append(d.o.clone())
            return result
        held = d.o.clone()
        result = d.reference()
        d.o.copy_(first[0] if first[0].shape == d.o.shape else held)
        return result

    return stand_in("right on its first call only", defect)


def stale_after_replan() -> MLAKernels:
    """Work buffers that held another batch's plan keep its work items: each request reads at most as
    many keys as the request at its place in the first plan the buffers held."""
    plans: dict[int, list[torch.Tensor]] = {}

    def get_mla_metadata_v1(qo_indptr, kv_indptr, last, heads, heads_k, causal, work_meta_data, *args, **kw):
        plans.setdefault(work_meta_data.data_ptr(), []).append(kv_indptr.clone())
        return REFERENCE.get_mla_metadata_v1(qo_indptr, kv_indptr, last, heads, heads_k, causal, work_meta_data,
                                             *args, **kw)

    def defect(d: Decode):
        result = d.reference()
        held = plans.get(d.kwargs["work_meta_data"].data_ptr(), [])
        if not any(not torch.equal(p, d.kv_indptr) for p in held):
            return result
        first = (held[0][1:] - held[0][:-1]).tolist()
        for r, n in enumerate(d.lengths()):
            stale = first[r] if r < len(first) else 0
            if stale < n:
                d.o[d.rows(r)] = split_attention(d.queries(r), d.keys(r), d.sm_scale,
                                                 keys_visited=max(stale, 1)).to(d.o.dtype)
        return result

    return stand_in("wrong once its buffers held another plan", defect, get_mla_metadata_v1=get_mla_metadata_v1)


def address_window(window_bytes: int) -> MLAKernels:
    """A 32-bit offset from the cache's base (ROCm/aiter#5765): rows that start ``window_bytes`` or
    more past it read as zero."""
    def defect(d: Decode):
        flat = d.kv_indices[:int(d.kv_indptr[-1])].long()
        row_bytes = LATENT * d.kv.element_size()
        rows = d.kv.view(-1, LATENT)[flat].clone()
        rows.view(torch.uint8)[flat * row_bytes >= window_bytes] = 0  # (fp8 has no masked_fill)
        return d.reference(kv_buffer=rows.view(-1, 1, 1, LATENT),
                           kv_indices=torch.arange(len(flat), dtype=torch.int32, device=flat.device))

    return stand_in(f"{window_bytes}-byte address window", defect)


# ---- right: each must be served ----


def fp8_probabilities(split: int = 64) -> MLAKernels:
    """Each split's probabilities rounded to fp8 (e4m3) before P.V, in every call."""
    return stand_in("P rounded to fp8", recompute(split=split, p_dtype=FP8))


def drops_v_scale() -> MLAKernels:
    """ROCm/aiter#6732: fp8 output left short by kv_scale (the own path multiplies it back)."""
    return stand_in("drops the V scale", after(lambda d: d.o.div_(d.kwargs["kv_scale"])), fp8_only=True)


def at_query_lengths(kernels: MLAKernels, qlens: tuple[int, ...]) -> MLAKernels:
    """``kernels`` at query lengths ``qlens``, the reference at the others."""
    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q, **kw):
        chosen = kernels if max_seqlen_q in qlens else REFERENCE
        return chosen.mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                                     max_seqlen_q, **kw)

    return dataclasses.replace(kernels, name=f"{kernels.name} at {qlens}", mla_decode_fwd=mla_decode_fwd)
