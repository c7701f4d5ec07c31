#!/usr/bin/env python3
"""AITER's MLA decode kernel table, derived from an AITER source tree: which kernel AITER
dispatches for each (GPU arch, decode mode, heads, query length, q dtype, KV dtype).

    aiter_kernel_table.py derive SOURCE --tag TAG [--commit SHA] > TABLE.json
        the table of the AITER checkout SOURCE (its kernel lists and the dispatch rules below)
    aiter_kernel_table.py check SOURCE --table TABLE.json
        SOURCE's kernel lists give exactly TABLE's rows (exit status 1 with one line naming the
        rows that differ); also stops when SOURCE's dispatch code is not the code the rules
        below were read from

Inputs read from SOURCE: the kernel lists ``hsa/<arch>/mla/mla_asm.csv`` (one row per
assembly kernel: qType, kvType, Gqa, ps, qSeqLen, prefill, causal, lse[, cprr], knl_name,
co_name). The dispatch rules are encoded below as plain functions, read from AITER
v0.1.20.post1 (commit de07f3885ee5f2030ba72b6cc5940d674fd457cf), in the order a call meets
them:

1. persistent mode, ``get_mla_metadata_info_v1`` (aiter/ops/attention.py): asserts
   heads % 8 == 0.
2. persistent mode, ``get_mla_metadata_v1`` (csrc/kernels/mla/metadata/v1_2_device.cuh):
   an AITER_CHECK on the head count / query length / dtypes.
3. ``mla_decode_fwd`` (aiter/mla.py): gfx950 bf16/bf16 16 heads at query length 1 leaves
   persistent mode at batch >= 32 (``_use_persistent_mla_decode``), so both kernels are
   needed; persistent mode keeps its native head counts, folds 32..128 heads (steps of 16)
   onto 16-head calls and asserts on the rest; non-persistent fp8 looks heads x query length
   up in ``get_meta_param``'s block table (KeyError outside it).
4. ``mla_decode_stage1_asm_fwd`` (csrc/py_itfs_cu/asm_mla.cu): maps (heads, query length,
   dtypes, mode, arch) to a kernel-list key (Gqa, ps, qSeqLen) and looks it up with
   prefill=0, causal=1 (the backend's calls are causal; query length 1 always uses the
   causal kernels), lse=0, cprr=0; no row: AITER_CHECK (aborts the process unless AITER is
   built to throw).

The rules assume AITER's defaults: AITER_ENABLE_EXPERIMENTAL and AITER_MLA_USE_OPUS unset.
``RULES_READ_FROM`` holds a fingerprint (sha256) of each function the rules were read from;
``check`` stops when a source's functions differ (re-read them, update the rules, re-derive).

Regenerate the table of a pin (on a host with the AITER checkout):

    python3 ci/docker/aiter_kernel_table.py derive AITER_CHECKOUT --tag v0.1.20.post1 \\
        --commit de07f3885ee5f2030ba72b6cc5940d674fd457cf \\
        > backend/src/vllm_aiter_mla/kernel_tables/v0.1.20.post1.json

Standard library only: it runs in the base image's aiter-check stage and in CPU tests.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ARCHS = ("gfx942", "gfx950")
PERSISTENT = "persistent"
NON_PERSISTENT = "non-persistent"
MODES = (PERSISTENT, NON_PERSISTENT)
BF16, FP8 = "bf16", "fp8"
DTYPES = ((BF16, BF16), (FP8, FP8), (BF16, FP8))  # (q, KV)
HEADS = tuple(range(1, 129))
QLENS = tuple(range(1, 9))
SCHEMA = 1

# Function fingerprints of the dispatch code the rules encode (AITER v0.1.20.post1).
RULES_READ_FROM: dict[str, dict[str, str]] = {
    "csrc/py_itfs_cu/asm_mla.cu": {
        "get_heuristic_kernel_mla": "5b7f3a2156d09a0d799ee99f4a60ab5eb4a94232714c1fb8a89a7ac8b4e14859",
        "mla_decode_stage1_asm_fwd": "53599d32d730e2e01f5e4b9f1358e735307efc9e1b5c21919237bbdaf0aeaf4e",
    },
    "aiter/mla.py": {
        "get_meta_param": "26cd984975a5cade49306dd3e54cd5a345635a35b844d7a589a5dfd6ece689d7",
        "_use_persistent_mla_decode": "08af6555c2878491fc815004e70421d68dca0deb1e50a5ee1f3c4c300e83e6df",
        "mla_decode_fwd": "c503b0c8e8d30fced45396597cff7ace5e8c582f070fd4741b99e4c5794a02ce",
    },
    "aiter/ops/attention.py": {
        "get_mla_metadata_info_v1": "9b2e7631a5ddef349fd5688f9763257326957cf93a5a33e7cb6ddc7839284722",
    },
    "csrc/kernels/mla/metadata/v1_2_device.cuh": {
        "get_mla_metadata_v1_2_device": "3cfc81bbc3ad5cea554331214e189b636fc9964957a388c9700bff95d6009cf0",
    },
}


class Refused(Exception):
    """AITER stops this call (assert, AITER_CHECK, KeyError): the message says where."""


@dataclass(frozen=True)
class CsvKernel:
    """One row of hsa/<arch>/mla/mla_asm.csv."""

    q: str
    kv: str
    gqa: int
    ps: int
    qseqlen: int
    prefill: int
    causal: int
    lse: int
    cprr: int
    name: str  # co_name without .co


@dataclass(frozen=True)
class Call:
    arch: str
    mode: str
    heads: int
    q: str
    kv: str
    qlen: int


# ---- kernel lists -------------------------------------------------------------------------

def read_kernel_list(path: Path) -> list[CsvKernel]:
    with path.open(newline="") as f:
        return [_csv_kernel(row) for row in csv.DictReader(f)]


def _csv_kernel(row: dict[str, str]) -> CsvKernel:
    def num(key: str) -> int:
        return int(row.get(key) or 0)

    return CsvKernel(row["qType"], row["kvType"], num("Gqa"), num("ps"), num("qSeqLen"), num("prefill"),
                     num("causal"), num("lse"), num("cprr"), row["co_name"].removesuffix(".co"))


def kernel_list_path(source: Path, arch: str) -> Path:
    return source / "hsa" / arch / "mla" / "mla_asm.csv"


def read_kernel_lists(source: Path) -> dict[str, list[CsvKernel]]:
    """Every arch's kernel list found in SOURCE (an arch without one has no kernels)."""
    return {arch: read_kernel_list(p) for arch in ARCHS if (p := kernel_list_path(source, arch)).is_file()}


def lookup(kernels: list[CsvKernel], q: str, kv: str, gqa: int, ps: int, qseqlen: int) -> str:
    """get_heuristic_kernel_mla: the first decode row with this key (prefill 0, causal 1,
    lse 0, cprr 0)."""
    for k in kernels:
        if (k.q, k.kv, k.gqa, k.ps, k.prefill, k.causal, k.qseqlen, k.lse, k.cprr) == (
                q, kv, gqa, ps, 0, 1, qseqlen, 0, 0):
            return k.name
    raise Refused(f"AITER_CHECK in get_heuristic_kernel_mla: no kernel q {q} kv {kv} Gqa {gqa} ps {ps} "
                  f"qSeqLen {qseqlen}")


# ---- dispatch rules (read from AITER v0.1.20.post1) ---------------------------------------

def metadata_info_check(heads: int) -> None:
    """get_mla_metadata_info_v1 (aiter/ops/attention.py)."""
    if heads % 8:
        raise Refused("assert num_head_qo % 8 == 0 in get_mla_metadata_info_v1")


def metadata_check(arch: str, heads: int, q: str, kv: str, qlen: int) -> None:
    """get_mla_metadata_v1_2_device (metadata/v1_2_device.cuh), experimental off."""
    fp8 = q == FP8 and kv == FP8
    bf16 = q == BF16 and kv == BF16
    native = (heads == 16 or (heads == 64 and fp8 and qlen == 1) or (arch == "gfx950" and bf16)
              or (arch == "gfx942" and heads == 128 and fp8)
              or (arch == "gfx950" and fp8 and heads in (32, 64, 128)))
    if not native and heads % 16 == 0:
        heads = 16
    allowed = (native or heads in (16, 128) or (heads == 32 and fp8) or (heads == 64 and fp8 and qlen == 1)
               or (arch == "gfx950" and heads == 8 and qlen == 4 and fp8)
               or (arch == "gfx942" and heads == 8 and qlen == 2 and bf16)
               or (arch == "gfx950" and bf16)
               or (arch == "gfx950" and fp8 and ((heads == 32 and qlen == 4) or heads in (64, 128))))
    if not allowed:
        raise Refused("AITER_CHECK in get_mla_metadata_v1 (unsupported head count)")


def leaves_persistent_mode(arch: str, heads: int, q: str, kv: str, qlen: int) -> bool:
    """_use_persistent_mla_decode (aiter/mla.py): this profile runs non-persistent at batch >= 32."""
    return arch == "gfx950" and q == BF16 and kv == BF16 and heads == 16 and qlen == 1


def persistent_heads(arch: str, heads: int, q: str, kv: str, qlen: int) -> int:
    """mla_decode_fwd's persistent branch: the head count of the kernel call (native or folded
    onto 16), or Refused."""
    fp8 = q == FP8 and kv == FP8
    bf16 = q == BF16 and kv == BF16
    native = (heads == 16 or (arch == "gfx942" and heads == 128 and fp8)
              or (arch == "gfx950" and fp8 and heads in (32, 64, 128))
              or (arch == "gfx950" and heads == 8 and fp8 and qlen == 4)
              or (arch == "gfx942" and heads == 8 and bf16 and qlen == 2)
              or (arch == "gfx942" and heads == 64 and fp8 and qlen == 1)
              or (arch == "gfx950" and bf16))
    if native:
        return heads
    if heads in range(32, 129, 16):
        return 16
    raise Refused(f"assert in mla_decode_fwd: nhead={heads} and max_seqlen_q={qlen} not supported")


_FP8_BLOCK_N = (8, 16, 24, 32, 48, 64, 128, 256, 384, 512)  # get_meta_param's get_block_n_fp8 keys


def non_persistent_python_check(heads: int, q: str, qlen: int) -> None:
    """get_meta_param (aiter/mla.py): fp8 queries look heads x query length up."""
    if q == FP8 and heads * qlen not in _FP8_BLOCK_N:
        raise Refused(f"KeyError {heads * qlen} in get_meta_param (fp8 block table)")


def stage1_key(arch: str, persistent: bool, gqa: int, q: str, kv: str, qlen: int) -> tuple[int, int, int]:
    """mla_decode_stage1_asm_fwd (asm_mla.cu): the kernel-list key (Gqa, ps, qSeqLen)."""
    ps, cq, cg = int(persistent), qlen, gqa
    bf16, fp8 = q == BF16 and kv == BF16, q == FP8 and kv == FP8
    if gqa == 128:
        cq = 0
        ps = 0 if bf16 and arch == "gfx942" else ps
    elif gqa == 16:
        cq, cg = _gqa16(arch, persistent, q, kv, qlen)
    elif gqa == 32:
        cq = _gqa32(arch, persistent, bf16, fp8, qlen)
    elif gqa == 64:
        cq = _gqa64(persistent, bf16, fp8, qlen)
    return _gfx950_persistent_remap(arch, persistent, gqa, bf16, fp8, qlen, (cg, ps, cq))


def _gqa16(arch: str, persistent: bool, q: str, kv: str, qlen: int) -> tuple[int, int]:
    if q == BF16 and kv == BF16:
        if persistent:
            return (4 if qlen <= 4 else qlen), 16
        return (1 if qlen == 1 else 4 if qlen <= 4 else 8), 16
    if q == BF16:  # fp8 (or byte) KV
        return (4 if persistent and qlen <= 4 else qlen), 16
    if qlen <= 2:
        return qlen, 16
    if qlen <= 4:
        return 4, 16
    if persistent and arch == "gfx950":
        return 4, 32
    raise Refused("AITER_CHECK in mla_decode_stage1_asm_fwd: gqa_ratio=16 fp8 only up to qo_len 4 "
                  "(beyond: persistent on gfx950)")


def _gqa32(arch: str, persistent: bool, bf16: bool, fp8: bool, qlen: int) -> int:
    if bf16:
        return qlen if persistent else 0
    if not fp8:
        return qlen
    if qlen == 1:
        return 1
    if persistent and (qlen == 2 or (qlen >= 3 and arch == "gfx950")):
        return 2 if qlen == 2 else 4
    raise Refused("AITER_CHECK in mla_decode_stage1_asm_fwd: fp8 gqa_ratio=32 needs persistent mode "
                  "(query length >= 3: gfx950)")


def _gqa64(persistent: bool, bf16: bool, fp8: bool, qlen: int) -> int:
    if bf16 and not persistent:
        return 1 if qlen == 1 else 0
    if fp8:
        if not persistent:
            raise Refused("AITER_CHECK in mla_decode_stage1_asm_fwd: fp8 gqa_ratio=64 only persistent")
        return 1 if qlen == 1 else 4
    return qlen


def _gfx950_persistent_remap(arch: str, persistent: bool, gqa: int, bf16: bool, fp8: bool, qlen: int,
                             key: tuple[int, int, int]) -> tuple[int, int, int]:
    if arch != "gfx950" or not persistent:
        return key
    ps = key[1]
    if bf16 and (gqa * qlen >= 128 or gqa > 64) and gqa != 48:
        return 32, ps, 4
    if bf16 and (gqa * qlen >= 64 or gqa >= 16):
        return 64, ps, 1
    if fp8 and ((gqa == 32 and qlen >= 4) or (gqa == 64 and qlen >= 2) or gqa == 128):
        return 32, ps, 4
    if fp8 and ((gqa == 16 and qlen in (3, 4)) or (gqa == 32 and qlen in (2, 3)) or (gqa == 64 and qlen == 1)):
        return 16, ps, 4
    return key


def _stage1(kernels: list[CsvKernel], call: Call, persistent: bool, gqa: int) -> str:
    if call.q not in (BF16, FP8) or call.kv not in (BF16, FP8):
        raise Refused(f"AITER_CHECK in mla_decode_stage1_asm_fwd: unsupported dtype {call.q}/{call.kv}")
    g, ps, qs = stage1_key(call.arch, persistent, gqa, call.q, call.kv, call.qlen)
    return lookup(kernels, call.q, call.kv, g, ps, qs)


def _non_persistent(kernels: list[CsvKernel], call: Call) -> str:
    non_persistent_python_check(call.heads, call.q, call.qlen)
    return _stage1(kernels, call, False, call.heads)


def dispatch(kernels: list[CsvKernel], call: Call) -> tuple[tuple[str, ...], int]:
    """The kernels AITER runs for this call and the head fold (1: none), or Refused."""
    if call.mode == NON_PERSISTENT:
        return (_non_persistent(kernels, call),), 1
    metadata_info_check(call.heads)
    metadata_check(call.arch, call.heads, call.q, call.kv, call.qlen)
    gqa = persistent_heads(call.arch, call.heads, call.q, call.kv, call.qlen)
    names = (_stage1(kernels, call, True, gqa),)
    if leaves_persistent_mode(call.arch, call.heads, call.q, call.kv, call.qlen):
        names += (_non_persistent(kernels, call),)
    return names, call.heads // gqa


# ---- the table ----------------------------------------------------------------------------

Row = tuple  # (arch, mode, heads, q, kv, qlen, [kernel, ...], fold)


def derive_rows(kernel_lists: dict[str, list[CsvKernel]]) -> list[Row]:
    """Every (arch, mode, heads 1-128, q/KV dtypes, query length 1-8) AITER has kernels for."""
    rows = []
    for arch in ARCHS:
        kernels = kernel_lists.get(arch, [])
        for mode in MODES:
            for q, kv in DTYPES:
                for heads in HEADS:
                    for qlen in QLENS:
                        try:
                            names, fold = dispatch(kernels, Call(arch, mode, heads, q, kv, qlen))
                        except Refused:
                            continue
                        rows.append((arch, mode, heads, q, kv, qlen, list(names), fold))
    return rows


def derive_table(source: Path, tag: str, commit: str | None = None) -> dict:
    lists = read_kernel_lists(source)
    return {
        "schema": SCHEMA,
        "aiter": {"tag": tag, "commit": commit},
        "derived_by": f"python3 ci/docker/aiter_kernel_table.py derive AITER_CHECKOUT --tag {tag}",
        "assumes": "AITER_ENABLE_EXPERIMENTAL and AITER_MLA_USE_OPUS unset; causal decode, no lse, no CP",
        "kernel_lists": {arch: _sha256(kernel_list_path(source, arch)) for arch in lists},
        "columns": ["arch", "mode", "heads", "q", "kv", "qlen", "kernels", "fold"],
        "rows": derive_rows(lists),
    }


def dump_table(table: dict) -> str:
    """JSON with one row per line (reviewable diffs)."""
    head = {k: v for k, v in table.items() if k != "rows"}
    text = json.dumps(head, indent=1)[:-2]
    rows = ",\n".join("  " + json.dumps(r) for r in table["rows"])
    return f'{text},\n "rows": [\n{rows}\n ]\n}}\n'


def row_key(row: Row) -> tuple:
    return tuple(row[:6])


def describe_row(key: tuple) -> str:
    arch, mode, heads, q, kv, qlen = key
    return f"{arch} {mode} {heads} heads q {q} kv {kv} qlen {qlen}"


def compare_rows(table_rows: list, derived: list) -> list[str]:
    """One phrase per row that differs: in the table only, in AITER only, or other kernels."""
    want = {row_key(r): (list(r[6]), r[7]) for r in derived}
    have = {row_key(r): (list(r[6]), r[7]) for r in table_rows}
    out = []
    for key in sorted(set(want) | set(have), key=str):
        if key not in want:
            out.append(f"{describe_row(key)}: table says {have[key][0]}, AITER has no kernel")
        elif key not in have:
            out.append(f"{describe_row(key)}: AITER runs {want[key][0]}, table has no row")
        elif want[key] != have[key]:
            out.append(f"{describe_row(key)}: AITER runs {want[key][0]} (fold {want[key][1]}), "
                       f"table says {have[key][0]} (fold {have[key][1]})")
    return out


# ---- fingerprints of the dispatch code ----------------------------------------------------

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def function_text(text: str, name: str) -> str | None:
    """The source of a top-level function: Python from ``def name(`` to the next top-level
    statement; C/C++ from its definition line to the next line that is ``}``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"^(def |\S.*\b){re.escape(name)}\(", line)), None)
    if start is None:
        return None
    python = lines[start].startswith("def ")
    end = len(lines)
    for i in range(start + 1, len(lines)):
        if python and re.match(r"^(def |class |@|[A-Za-z_#])", lines[i]):
            end = i
            break
        if not python and lines[i] == "}":
            end = i + 1
            break
    return "\n".join(lines[start:end]).rstrip() + "\n"


def fingerprints(source: Path, rules: dict[str, dict[str, str]] | None = None) -> dict[str, dict[str, str | None]]:
    out: dict[str, dict[str, str | None]] = {}
    for rel, names in (rules or RULES_READ_FROM).items():
        path = source / rel
        text = path.read_text(errors="replace") if path.is_file() else ""
        out[rel] = {}
        for name in names:
            body = function_text(text, name)
            out[rel][name] = hashlib.sha256(body.encode()).hexdigest() if body is not None else None
    return out


def changed_dispatch_code(source: Path, rules: dict[str, dict[str, str]] | None = None) -> list[str]:
    """``path: function`` for each function whose source differs from what the rules encode
    (``rules``: other fingerprints, for tests on stand-in sources)."""
    rules = rules or RULES_READ_FROM
    found = fingerprints(source, rules)
    return [f"{rel}: {name}" for rel, names in rules.items() for name, sha in names.items()
            if found[rel][name] != sha]


# ---- command line -------------------------------------------------------------------------

def check(source: Path, table_path: Path, rules: dict[str, dict[str, str]] | None = None) -> list[str]:
    """Problems (one line each) of TABLE against the AITER source tree."""
    if not table_path.is_file():
        return [f"no MLA kernel table for AITER {table_path.stem} (the backend refuses an AITER without one): "
                f"python3 -m ci.pins resolve aiter --write derives it from the pinned commit (or, on a host with "
                f"its checkout, python3 ci/docker/aiter_kernel_table.py derive AITER_CHECKOUT --tag "
                f"{table_path.stem}); review and commit it, or build a pin that has one (AITER_PIN)"]
    changed = changed_dispatch_code(source, rules)
    if changed:
        return [f"AITER's MLA dispatch code differs from what ci/docker/aiter_kernel_table.py encodes "
                f"({', '.join(changed)}): re-read it, update the rules and RULES_READ_FROM, "
                f"re-derive {table_path.name}"]
    lists = read_kernel_lists(source)
    if not lists:
        return [f"{source} has no MLA kernel lists (hsa/<arch>/mla/mla_asm.csv): not an AITER source tree"]
    table = json.loads(table_path.read_text())
    diff = compare_rows(table.get("rows", []), derive_rows(lists))
    if not diff:
        return []
    shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
    return [f"kernel table {table_path.name} disagrees with this AITER's kernel lists in {len(diff)} row(s): "
            f"{shown} (re-derive it: python3 ci/docker/aiter_kernel_table.py derive)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("derive")
    p.add_argument("source", type=Path)
    p.add_argument("--tag", required=True)
    p.add_argument("--commit")
    p.add_argument("--allow-changed-dispatch", action="store_true",
                   help="derive even though the dispatch code differs from the encoded rules (review only)")
    p = sub.add_parser("check")
    p.add_argument("source", type=Path)
    p.add_argument("--table", type=Path, required=True)
    p.add_argument("--rules-read-from", type=Path,
                   help="JSON of function fingerprints replacing RULES_READ_FROM (tests on stand-in sources)")
    p = sub.add_parser("fingerprints")
    p.add_argument("source", type=Path)
    ns = parser.parse_args(argv)
    if ns.cmd == "fingerprints":
        print(json.dumps(fingerprints(ns.source), indent=1))
        return 0
    if ns.cmd == "derive":
        changed = changed_dispatch_code(ns.source)
        if changed and not ns.allow_changed_dispatch:
            print(f"aiter-kernel-table: ERROR: dispatch code differs from the encoded rules ({', '.join(changed)})",
                  file=sys.stderr)
            return 1
        sys.stdout.write(dump_table(derive_table(ns.source, ns.tag, ns.commit)))
        return 0
    rules = json.loads(ns.rules_read_from.read_text()) if ns.rules_read_from else None
    problems = check(ns.source, ns.table, rules)
    for line in problems:
        print(f"aiter-check: ERROR: {line}", file=sys.stderr)
    if not problems:
        print(f"aiter-check: OK kernel table {ns.table.name} matches this AITER's kernel lists")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
