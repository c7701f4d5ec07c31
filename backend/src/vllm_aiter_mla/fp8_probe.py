"""AITER's fp8 MLA decode measured at start-up: does it scale V? (ROCm/aiter#6732)

AITER's gfx942 fp8 persistent decode kernels for multi-token verification (query lengths 2-4)
apply ``kv_scale`` to the scores but not to V, so the output is short by exactly ``kv_scale``.
Whether the AITER at hand has the defect is measured, not assumed per arch or tag: one tiny
decode per (heads, query length) this layer serves, through the same ``mla_decode`` call the own
path makes (same kernels, decode mode and persistent work buffers), with ``kv_scale = 2``,
compared with a dense fp32 computation of the same fp8 inputs. A fixed AITER then turns the
correction off by itself.

Plain PyTorch; the kernels (AITER or a stand-in) are passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import torch

from .decode import mla_decode
from .kernels import MLAKernels
from .persistent import allocate_work, plan_work
from .planning import DecodePlan

KV_LORA_RANK = 512
HEAD_DIM = 576  # kv_lora_rank + rope
PROBE_KEYS = 64  # keys of the one request the probe decodes
PROBE_KV_SCALE = 2.0  # distinct from 1, so an unscaled V shows as an output halved
# Largest deviation, relative to the largest reference value, that still counts as a match
# (fp8 products in the kernel, bf16 output); an output short by kv_scale is off by half of it.
TOLERANCE = 0.1


class Outcome(enum.Enum):
    CORRECT = "correct"  # the kernel's output matches the dense computation
    DROPS_V_SCALE = "drops the V scale"  # it matches the dense computation divided by kv_scale (#6732)
    WRONG = "wrong"  # neither


def classify(out: torch.Tensor, expected: torch.Tensor, kv_scale: float, tolerance: float = TOLERANCE) -> Outcome:
    """What ``out`` is, given the correct ``expected`` output of a call made with ``kv_scale``."""
    out, expected = out.float(), expected.float()
    peak = expected.abs().max().item()
    if not (torch.isfinite(out).all() and peak > 0):
        return Outcome.WRONG

    def off(target: torch.Tensor) -> float:
        return (out - target).abs().max().item() / peak

    if off(expected) <= tolerance:
        return Outcome.CORRECT
    if off(expected / kv_scale) <= tolerance:
        return Outcome.DROPS_V_SCALE
    return Outcome.WRONG


def probe_inputs(heads: int, qlen: int, fp8_dtype: torch.dtype, device: torch.device | str, scale: float):
    """(q [qlen, heads, 576] fp8, kv [keys, 576] fp8, expected [qlen, heads, 512] fp32): one
    request of ``PROBE_KEYS`` keys, q_scale 1, kv_scale ``PROBE_KV_SCALE``, causal within the
    request's query rows. Deterministic (made on the CPU from a fixed seed)."""
    gen = torch.Generator().manual_seed(6732)
    q = (torch.randn(qlen, heads, HEAD_DIM, generator=gen) * 0.5).to(fp8_dtype)
    kv = (torch.randn(PROBE_KEYS, HEAD_DIM, generator=gen) * 0.5).to(fp8_dtype)
    k = kv.float() * PROBE_KV_SCALE
    scores = torch.einsum("qhd,kd->qhk", q.float(), k) * scale
    # query row i sees keys 0 .. keys - qlen + i
    visible = torch.arange(PROBE_KEYS)[None, :] <= torch.arange(qlen)[:, None] + PROBE_KEYS - qlen
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    expected = torch.einsum("qhk,kd->qhd", scores.softmax(-1), k[:, :KV_LORA_RANK])
    return q.to(device), kv.to(device), expected.to(device)


def measure(kernels: MLAKernels, *, heads: int, qlen: int, persistent: bool, fp8_dtype: torch.dtype,
            device: torch.device | str) -> Outcome:
    """Run the own path's decode call once on probe inputs and classify its output."""
    scale = HEAD_DIM**-0.5
    q, kv, expected = probe_inputs(heads, qlen, fp8_dtype, device, scale)
    plan = DecodePlan(
        qo_indptr=torch.tensor([0, qlen], dtype=torch.int32, device=device),
        kv_indptr=torch.tensor([0, PROBE_KEYS], dtype=torch.int32, device=device),
        kv_indices=torch.arange(PROBE_KEYS, dtype=torch.int32, device=device),
        kv_last_page_lens=torch.ones(1, dtype=torch.int32, device=device),
    )
    work = None
    if persistent:
        work = allocate_work(kernels, 1, qlen, heads, fp8_dtype, fp8_dtype, device)
        plan_work(kernels, work, plan, qlen)
    out = mla_decode(q, kv, plan, kernels=kernels, kv_lora_rank=KV_LORA_RANK, scale=scale, max_seqlen_q=qlen,
                     decode_heads=heads, out_dtype=torch.bfloat16,
                     q_scale=torch.ones(1, dtype=torch.float32, device=device),
                     kv_scale=torch.full((1,), PROBE_KV_SCALE, dtype=torch.float32, device=device), work=work)
    return classify(out, expected, PROBE_KV_SCALE)


def verify_lengths(max_qlen: int) -> range:
    """The query lengths of multi-token verification a layer serves (2 .. 1 + speculative tokens)."""
    return range(2, max_qlen + 1)


def measure_all(kernels: MLAKernels, *, heads: int, qlens: Iterable[int], persistent: bool,
                fp8_dtype: torch.dtype, device: torch.device | str) -> dict[int, Outcome]:
    """``measure`` for each query length."""
    return {qlen: measure(kernels, heads=heads, qlen=qlen, persistent=persistent, fp8_dtype=fp8_dtype,
                          device=device) for qlen in qlens}


def v_scale_fix_qlens(outcomes: dict[int, Outcome]) -> frozenset[int]:
    """The query lengths whose output the own path multiplies by kv_scale."""
    return frozenset(q for q, o in outcomes.items() if o is Outcome.DROPS_V_SCALE)


def wrong_qlens(outcomes: dict[int, Outcome]) -> tuple[int, ...]:
    return tuple(sorted(q for q, o in outcomes.items() if o is Outcome.WRONG))
