"""AITER's MLA decode contract, as data: which (arch, mode, heads, query length, q dtype,
KV dtype) AITER dispatches a kernel for, per AITER pin, and which of those are known wrong.

* ``kernel_tables/<tag>.json``: one table per AITER pin, derived by
  ``ci/docker/aiter_kernel_table.py`` from that AITER's kernel lists
  (``hsa/<arch>/mla/mla_asm.csv``) and its dispatch rules (``aiter/mla.py``,
  ``csrc/py_itfs_cu/asm_mla.cu``, the persistent-mode metadata), never edited by hand. A row
  is a call AITER runs (the kernel names, and the head fold of persistent mode); any other
  call stops inside AITER (mostly an AITER_CHECK, which aborts the process unless AITER is
  built to throw; an assert or KeyError in its Python layer). The base image's aiter-check
  stage re-derives the table from the AITER it built and stops on a difference.
* ``kernel_tables/defects.json``: AITER issues that make a dispatched kernel wrong, each citing
  its issue. Most are refused as well (``remedy: refuse``); a defect whose effect can be measured
  and undone (``remedy: measure``, e.g. an output short by exactly ``kv_scale``) is allowed: the
  own path measures it on the GPU at start-up for every shape it serves and corrects the output
  where it is found (``fp8_probe.py``), so an AITER with the fix turns the correction off.

Which table: ``AITER_MLA_KERNEL_TABLE=<tag>`` if set; else the installed AITER's version
(distribution ``amd-aiter`` or ``aiter``; a version without a table stops at start-up); with
no AITER installed (CPU development, tests) the newest table.

Plain Python + torch dtypes, no AITER or vLLM import.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

import torch

from .distributions import NO_VERSION, no_version_problem, version_of

ARCHS = ("gfx942", "gfx950")

PERSISTENT = "persistent"  # get_mla_metadata_v1 work buffers passed to mla_decode_fwd
NON_PERSISTENT = "non-persistent"  # split-KV stage1 + reduce, no work buffers
DECODE_MODES = (PERSISTENT, NON_PERSISTENT)

BF16 = "bf16"
FP8 = "fp8"

MAX_HEADS = 128
MAX_QLEN = 8  # the tables cover query lengths 1..8 (up to 7 speculative tokens)

TABLE_ENV = "AITER_MLA_KERNEL_TABLE"
AITER_DISTRIBUTIONS = ("amd-aiter", "aiter")

REFUSE = "refuse"  # a defect's remedy: the call is refused
MEASURE = "measure"  # the call runs; the defect is measured at start-up and its effect undone
REMEDIES = (REFUSE, MEASURE)

Key = tuple[str, str, int, str, str, int]  # arch, mode, heads, q, kv, qlen


@dataclass(frozen=True)
class KernelTable:
    """What one AITER pin dispatches: key -> (kernel names, head fold)."""

    tag: str
    rows: Mapping[Key, tuple[tuple[str, ...], int]]


@dataclass(frozen=True)
class Defect:
    """A call AITER dispatches but gets wrong. A None field matches every value. ``remedy``:
    ``refuse`` (the call is refused) or ``measure`` (measured at start-up and corrected)."""

    issue: str
    what: str
    archs: tuple[str, ...] | None
    modes: tuple[str, ...] | None
    heads: tuple[int, ...] | None
    q: tuple[str, ...] | None
    kv: tuple[str, ...] | None
    qlens: tuple[int, ...] | None
    non_power_of_two_qlen: bool
    fixed_in: str | None
    remedy: str = REFUSE

    def matches(self, tag: str, key: Key) -> bool:
        if self.fixed_in is not None and version_key(tag) >= version_key(self.fixed_in):
            return False
        arch, mode, heads, q, kv, qlen = key
        for allowed, value in ((self.archs, arch), (self.modes, mode), (self.heads, heads), (self.q, q),
                               (self.kv, kv), (self.qlens, qlen)):
            if allowed is not None and value not in allowed:
                return False
        return not (self.non_power_of_two_qlen and _is_power_of_two(qlen))


def version_key(tag: str) -> tuple[int, ...]:
    """v0.1.20.post1 -> (0, 1, 20, 1): orders AITER tags."""
    return tuple(int(n) for n in re.findall(r"\d+", tag))


def _data(name: str) -> dict:
    return json.loads(resources.files(__package__).joinpath("kernel_tables", name).read_text())


def available_tables() -> tuple[str, ...]:
    """Tags with a kernel table, oldest first."""
    folder = resources.files(__package__).joinpath("kernel_tables")
    tags = [p.name.removesuffix(".json") for p in folder.iterdir()
            if p.name.startswith("v") and p.name.endswith(".json")]
    return tuple(sorted(tags, key=version_key))


@functools.cache
def load_table(tag: str) -> KernelTable:
    if tag not in available_tables():
        raise ValueError(f"no AITER MLA kernel table for {tag} (tables: {', '.join(available_tables())}); "
                         f"set {TABLE_ENV} to one of them or derive one with ci/docker/aiter_kernel_table.py")
    data = _data(f"{tag}.json")
    rows = {(r[0], r[1], r[2], r[3], r[4], r[5]): (tuple(r[6]), r[7]) for r in data["rows"]}
    return KernelTable(tag, rows)


@functools.cache
def defects() -> tuple[Defect, ...]:
    def opt(value):
        return None if value is None else tuple(value)

    found = tuple(Defect(d["issue"], d["what"], opt(d["archs"]), opt(d["modes"]), opt(d["heads"]), opt(d["q"]),
                         opt(d["kv"]), opt(d["qlens"]), bool(d["non_power_of_two_qlen"]), d["fixed_in"], d["remedy"])
                  for d in _data("defects.json")["defects"])
    unknown = [d.issue for d in found if d.remedy not in REMEDIES]
    if unknown:
        raise ValueError(f"kernel_tables/defects.json: remedy of {', '.join(unknown)} is not one of {REMEDIES}")
    return found


@functools.cache
def installed_aiter_version() -> str | None:
    """The installed AITER's version (from its distribution metadata; AITER is not imported);
    "" when that metadata has none, None when AITER is not installed."""
    return version_of(*AITER_DISTRIBUTIONS)


def active_table(environ: Mapping[str, str] = os.environ) -> KernelTable:
    """The table of the AITER in use (see the module docstring); ValueError in one line when
    there is none."""
    tag = environ.get(TABLE_ENV, "").strip()
    if tag:
        return load_table(tag)
    version = installed_aiter_version()
    if version is None:
        return load_table(available_tables()[-1])
    if version == NO_VERSION:
        raise ValueError(f"ROCM_AITER_MLA cannot choose a kernel table: "
                         f"{no_version_problem('AITER', AITER_DISTRIBUTIONS)}; {TABLE_ENV}=<tag> overrides")
    tag = "v" + version.split("+")[0]
    if tag not in available_tables():
        raise ValueError(
            f"ROCM_AITER_MLA has no kernel table for the installed AITER {version} (tables: "
            f"{', '.join(available_tables())}): build the image with an AITER pin that has one "
            f"(AITER_PIN), or add backend/src/vllm_aiter_mla/kernel_tables/{tag}.json "
            f"(ci/docker/aiter_kernel_table.py derive); {TABLE_ENV}=<tag> overrides at your own risk.")
    return load_table(tag)


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


def defect(table: KernelTable, key: Key) -> Defect | None:
    """The first listed defect that refuses this call, or None."""
    return next((d for d in defects() if d.remedy == REFUSE and d.matches(table.tag, key)), None)


def measured_defects(table: KernelTable, key: Key) -> tuple[Defect, ...]:
    """The listed defects of this call that are measured at start-up and corrected, not refused."""
    return tuple(d for d in defects() if d.remedy == MEASURE and d.matches(table.tag, key))


def kernel_problem(arch: str, mode: str, heads: int, qlen: int, q_dtype: str, kv_dtype: str,
                   table: KernelTable | None = None) -> str | None:
    """None when AITER has a correct kernel for this call, else why not (one phrase)."""
    table = table or active_table()
    if arch not in ARCHS:
        return f"no AITER MLA decode kernels for {arch} (supported: {', '.join(ARCHS)})"
    if mode not in DECODE_MODES:
        return f"unknown decode mode {mode!r}"
    if not 1 <= qlen <= MAX_QLEN:
        return f"the AITER kernel tables cover query lengths 1-{MAX_QLEN}, not {qlen}"
    key = (arch, mode, heads, q_dtype, kv_dtype, qlen)
    if key not in table.rows:
        return (f"AITER {table.tag} has no {mode} MLA decode kernel on {arch} for {heads} heads, query length "
                f"{qlen}, q {q_dtype}, KV {kv_dtype}; its dispatch would stop the process")
    found = defect(table, key)
    if found is not None:
        return f"{found.what} ({found.issue})"
    return None


def first_problem(archs: tuple[str, ...], mode: str, heads: int, qlens: range | tuple[int, ...], q_dtype: str,
                  kv_dtype: str, table: KernelTable | None = None) -> str | None:
    """The first problem over every arch and query length, or None."""
    table = table or active_table()
    for arch in archs:
        for qlen in qlens:
            problem = kernel_problem(arch, mode, heads, qlen, q_dtype, kv_dtype, table)
            if problem is not None:
                return problem
    return None


def kernel_head_count(num_heads: int, archs: tuple[str, ...], mode: str, qlens: range | tuple[int, ...],
                      q_dtype: str, kv_dtype: str, table: KernelTable | None = None) -> int | None:
    """Smallest head count >= num_heads with a correct kernel for every arch and query
    length (queries are padded with zero heads up to it), or None."""
    table = table or active_table()
    for heads in range(max(num_heads, 1), MAX_HEADS + 1):
        if first_problem(archs, mode, heads, qlens, q_dtype, kv_dtype, table) is None:
            return heads
    return None


def _ranges(values: list[int]) -> str:
    parts, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ",".join(parts)


def describe(archs: tuple[str, ...], mode: str, heads: int, qlens: range | tuple[int, ...], q_dtype: str,
             kv_dtype: str, table: KernelTable | None = None) -> str:
    """The kernel family each arch runs, e.g. ``AITER v0.1.20.post1 gfx942:
    mla_a16w16_qh16_m16x4_n16x1_coex0_mask1_ps (qlen 1-4, 16-head calls x2)``."""
    table = table or active_table()
    parts = []
    for arch in archs:
        by_kernel: dict[tuple[tuple[str, ...], int], list[int]] = {}
        for qlen in qlens:
            row = table.rows.get((arch, mode, heads, q_dtype, kv_dtype, qlen))
            if row is not None:
                by_kernel.setdefault(row, []).append(qlen)
        for (names, fold), lens in by_kernel.items():
            folded = f", {heads // fold}-head calls x{fold}" if fold > 1 else ""
            # A second kernel: the non-persistent one AITER switches to at batch >= 32.
            kernels = names[0] + (f", at batch >= 32 {names[1]}" if len(names) > 1 else "")
            parts.append(f"{arch}: {kernels} (qlen {_ranges(lens)}{folded})")
    return f"AITER {table.tag} " + "; ".join(parts)
