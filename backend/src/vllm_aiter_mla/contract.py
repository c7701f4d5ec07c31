"""AITER's MLA decode contract, as data: which (arch, mode, heads, query length, q dtype,
KV dtype) has a kernel, and which of those AITER computes wrongly.

Read from AITER's source (ROCm/aiter; the pinned tag is in the repository's versions
file): the host-side dispatch in ``aiter/mla.py`` (``mla_decode_fwd``: the persistent /
non-persistent split and the head fold of the persistent path) and
``csrc/py_itfs_cu/asm_mla.cu`` (the kernel lookup that fails with a KeyError-like
"cannot get heuristic kernel" for a missing entry), the kernel lists
``hsa/gfx942/mla/mla_asm.csv`` and ``hsa/gfx950/mla/mla_asm.csv``, and AITER's issue
tracker for the defects. vLLM 0.32's built-in backend
(``vllm/v1/attention/backends/mla/rocm_aiter_mla.py``) routes around the same gaps.

The table is deliberately the conservative intersection of what those sources show:
the reference kernel refuses everything outside it, so a call the backend makes on
CPU fails loudly wherever AITER would fail or compute garbage on a GPU. Widening it
(a newer AITER with more kernels) is a data change here, verified on an AMD GPU.

Plain Python + torch dtypes, no AITER or vLLM import.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ARCHS = ("gfx942", "gfx950")

PERSISTENT = "persistent"  # get_mla_metadata_v1 work buffers passed to mla_decode_fwd
NON_PERSISTENT = "non-persistent"  # split-KV stage1 + reduce, no work buffers
DECODE_MODES = (PERSISTENT, NON_PERSISTENT)

BF16 = "bf16"
FP8 = "fp8"

# Head counts the persistent path accepts: 16 natively; 32..128 in steps of 16 are folded
# onto the 16-head kernels by mla_decode_fwd (aiter/mla.py, "nhead in range(32, 128 + 1, 16)
# and persistent_mode").
_PERSISTENT_HEADS = tuple(range(16, 129, 16))


@dataclass(frozen=True)
class KernelRow:
    """One family of assembly kernels: every listed (heads, query length) exists."""

    mode: str
    archs: tuple[str, ...]
    heads: tuple[int, ...]
    q_dtype: str
    kv_dtype: str
    qlens: tuple[int, ...]
    source: str


KERNELS: tuple[KernelRow, ...] = (
    # Non-persistent (hsa/<arch>/mla/mla_asm.csv, non-"_ps" entries).
    KernelRow(NON_PERSISTENT, ARCHS, (16,), BF16, BF16, tuple(range(1, 9)),
              "mla_a16w16_qh16 m16x4/m32x4 (qlen 1, <=4, <=8)"),
    KernelRow(NON_PERSISTENT, ARCHS, (16,), FP8, FP8, (1, 2, 3, 4),
              "mla_a8w8_qh16_qseqlen1/2/4 (qlen 3 runs on the qseqlen4 kernel)"),
    KernelRow(NON_PERSISTENT, ARCHS, (128,), BF16, BF16, tuple(range(1, 17)),
              "mla_dec_stage1_bf16_a16w16_subQ128_mqa128 (rows = heads x qlen, any qlen)"),
    KernelRow(NON_PERSISTENT, ARCHS, (128,), FP8, FP8, (1, 2, 3, 4),
              "mla_a8w8_qh128_m32x4"),
    # Persistent (get_mla_metadata_v1 + "_ps" kernels; heads 32..128 folded onto 16).
    KernelRow(PERSISTENT, ARCHS, _PERSISTENT_HEADS, BF16, BF16, (1, 2, 3, 4),
              "mla_a16w16_qh16_m16x4 _ps (16 heads x 4 rows)"),
    KernelRow(PERSISTENT, ARCHS, _PERSISTENT_HEADS, FP8, FP8, (1, 2, 3, 4),
              "mla_a8w8_qh16_qseqlen1/2/4 _ps"),
    KernelRow(PERSISTENT, ARCHS, _PERSISTENT_HEADS, BF16, FP8, (1, 2, 3, 4),
              "mla_a16w8_qh16_m16x4 _ps"),
)


@dataclass(frozen=True)
class Defect:
    """A call AITER accepts but gets wrong (or aborts on)."""

    issue: str
    what: str
    mode: str | None  # None: both modes
    q_dtype: str | None
    kv_dtype: str | None
    heads: tuple[int, ...] | None
    min_qlen: int
    non_power_of_two_only: bool = False


DEFECTS: tuple[Defect, ...] = (
    Defect("ROCm/aiter#2720", "non-persistent decode gives every query position of a request the same "
           "output when max_seqlen_q is not a power of two", NON_PERSISTENT, None, None, None, 3,
           non_power_of_two_only=True),
    Defect("ROCm/aiter#2760", "no MLA decode kernels for an fp8 KV cache at query length above 4",
           None, None, FP8, None, 5),
    Defect("ROCm/aiter#4751", "persistent decode with bf16 queries and an fp8 KV cache aborts for 16 heads "
           "per GPU at query length above 4", PERSISTENT, BF16, FP8, (16,), 5),
)


# e4m3fnuz on gfx942, e4m3fn on gfx950 (per-tensor q_scale / kv_scale).
_FP8_E4M3 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))


def dtype_class(dtype: torch.dtype) -> str:
    """bf16 / fp8 for what AITER takes; the dtype's own name otherwise (rejected)."""
    if dtype == torch.bfloat16:
        return BF16
    if dtype in _FP8_E4M3:
        return FP8
    return str(dtype).removeprefix("torch.")


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _defect(mode: str, heads: int, qlen: int, q_dtype: str, kv_dtype: str) -> Defect | None:
    for d in DEFECTS:
        if d.mode not in (None, mode) or d.q_dtype not in (None, q_dtype) or d.kv_dtype not in (None, kv_dtype):
            continue
        if d.heads is not None and heads not in d.heads:
            continue
        if qlen < d.min_qlen or (d.non_power_of_two_only and _is_power_of_two(qlen)):
            continue
        return d
    return None


def kernel_problem(arch: str, mode: str, heads: int, qlen: int, q_dtype: str, kv_dtype: str) -> str | None:
    """None when AITER has a correct kernel for this call, else why not (one phrase)."""
    if arch not in ARCHS:
        return f"no AITER MLA decode kernels for {arch} (supported: {', '.join(ARCHS)})"
    if mode not in DECODE_MODES:
        return f"unknown decode mode {mode!r}"
    defect = _defect(mode, heads, qlen, q_dtype, kv_dtype)
    if defect is not None:
        return f"{defect.what} ({defect.issue})"
    for row in KERNELS:
        if (row.mode == mode and arch in row.archs and heads in row.heads and q_dtype == row.q_dtype
                and kv_dtype == row.kv_dtype and qlen in row.qlens):
            return None
    return (f"no {mode} AITER MLA decode kernel on {arch} for {heads} heads, query length {qlen}, "
            f"q {q_dtype}, KV {kv_dtype}")


def first_problem(
    archs: tuple[str, ...], mode: str, heads: int, qlens: range | tuple[int, ...], q_dtype: str, kv_dtype: str
) -> str | None:
    """The first problem over every arch and query length, or None."""
    for arch in archs:
        for qlen in qlens:
            problem = kernel_problem(arch, mode, heads, qlen, q_dtype, kv_dtype)
            if problem is not None:
                return problem
    return None


def kernel_head_count(
    num_heads: int, archs: tuple[str, ...], mode: str, qlens: range | tuple[int, ...], q_dtype: str, kv_dtype: str
) -> int | None:
    """Smallest head count >= num_heads with a correct kernel for every arch and query
    length (queries are padded with zero heads up to it), or None."""
    for heads in range(max(num_heads, 1), 129):
        if first_problem(archs, mode, heads, qlens, q_dtype, kv_dtype) is None:
            return heads
    return None
