"""ci/docker/aiter_kernel_table.py: the kernel table derived from AITER's kernel lists and
dispatch rules, on small CSV fixtures and on AITER v0.1.20.post1's own lists (kept under
tests/data); the committed table is exactly what it derives from them."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci" / "docker"))
import aiter_kernel_table as akt  # noqa: E402

TABLES = ROOT / "backend" / "src" / "vllm_aiter_mla" / "kernel_tables"
REAL = Path(__file__).parent / "data" / "aiter-v0.1.20.post1"
HEADER = "qType,kvType,Gqa,ps,qSeqLen,prefill,causal,lse,cprr,knl_name,co_name"


def write_source(root: Path, lists: dict[str, list[str]]) -> Path:
    for arch, rows in lists.items():
        path = akt.kernel_list_path(root, arch)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join([HEADER, *rows]) + "\n")
    return root


def row(q, kv, gqa, ps, qseqlen, name, causal=1, lse=0, cprr=0, prefill=0):
    return f"{q},{kv},{gqa},{ps},{qseqlen},{prefill},{causal},{lse},{cprr},_ZN5aiter{name}E,{name}.co"


def keys(rows, arch=None, mode=None, q=None):
    return {(r[2], r[5]) for r in rows if (arch, mode, q) == (arch and r[0], mode and r[1], q and r[3])}


def test_gfx942_persistent_bf16_folds_onto_the_16_head_kernel(tmp_path):
    src = write_source(tmp_path, {"gfx942": [row("bf16", "bf16", 16, 1, 4, "k16ps")]})
    rows = akt.derive_rows(akt.read_kernel_lists(src))
    # 16 heads natively, 32..128 in steps of 16 folded onto 16-head calls; query lengths 1-4 use the qSeqLen-4 kernel
    assert keys(rows, "gfx942", "persistent", "bf16") == {(h, q) for h in range(16, 129, 16) for q in range(1, 5)}
    fold = {r[2]: r[7] for r in rows}
    assert fold[16] == 1 and fold[48] == 3 and fold[128] == 8
    assert {tuple(r[6]) for r in rows} == {("k16ps",)}


def test_non_persistent_bf16_lookups_per_query_length(tmp_path):
    src = write_source(tmp_path, {"gfx950": [
        row("bf16", "bf16", 16, 0, 1, "q1"), row("bf16", "bf16", 16, 0, 8, "q8"),
        row("bf16", "bf16", 32, 0, 0, "h32any"), row("bf16", "bf16", 64, 0, 0, "h64"),
    ]})
    rows = {(r[2], r[5]): r[6][0] for r in akt.derive_rows(akt.read_kernel_lists(src)) if r[1] == "non-persistent"}
    # 16 heads: qlen 1 -> qSeqLen 1, 2-4 -> qSeqLen 4 (absent), 5-8 -> qSeqLen 8
    assert [rows.get((16, q)) for q in range(1, 9)] == ["q1", None, None, None, "q8", "q8", "q8", "q8"]
    # 32 heads: qSeqLen 0 (any length); 64 heads at qlen 1 want a qSeqLen-1 kernel (absent here)
    assert all(rows[(32, q)] == "h32any" for q in range(1, 9))
    assert (64, 1) not in rows and all(rows[(64, q)] == "h64" for q in range(2, 9))


def test_lookup_takes_causal_no_lse_no_cprr_decode_rows_only(tmp_path):
    src = write_source(tmp_path, {"gfx942": [
        row("fp8", "fp8", 16, 0, 1, "lse", lse=1), row("fp8", "fp8", 16, 0, 1, "cprr", cprr=1),
        row("fp8", "fp8", 16, 0, 1, "nocausal", causal=0), row("fp8", "fp8", 16, 0, 1, "prefill", prefill=1),
        row("fp8", "fp8", 16, 0, 1, "first"), row("fp8", "fp8", 16, 0, 1, "second"),
    ]})
    assert akt.lookup(akt.read_kernel_lists(src)["gfx942"], "fp8", "fp8", 16, 0, 1) == "first"


def test_gfx950_persistent_fp8_long_queries_run_on_the_32_head_kernel(tmp_path):
    src = write_source(tmp_path, {"gfx950": [row("fp8", "fp8", 32, 1, 4, "h32q4ps")]})
    rows = akt.derive_rows(akt.read_kernel_lists(src))
    # 16 heads at qlen 5-8 (AITER PRs #3380/#4258), 32 heads at qlen >= 4, 64 heads >= 2, 128 heads always
    found = keys(rows, "gfx950", "persistent", "fp8")
    assert {(16, q) for q in range(5, 9)} <= found and {(32, q) for q in range(4, 9)} <= found
    assert {(64, q) for q in range(2, 9)} <= found and {(128, q) for q in range(1, 9)} <= found
    assert (16, 4) not in found and (64, 1) not in found


@pytest.mark.parametrize("call,where", [
    (akt.Call("gfx942", "persistent", 20, "bf16", "bf16", 1), "num_head_qo % 8"),
    (akt.Call("gfx942", "persistent", 24, "bf16", "bf16", 1), "get_mla_metadata_v1"),
    (akt.Call("gfx942", "persistent", 8, "bf16", "bf16", 1), "get_mla_metadata_v1"),
    (akt.Call("gfx950", "persistent", 8, "bf16", "bf16", 1), "get_heuristic_kernel_mla: no kernel"),
    (akt.Call("gfx942", "non-persistent", 32, "fp8", "fp8", 2), "AITER_CHECK in mla_decode_stage1_asm_fwd"),
    (akt.Call("gfx942", "non-persistent", 16, "fp8", "fp8", 5), "KeyError 80 in get_meta_param"),
    (akt.Call("gfx942", "non-persistent", 128, "fp8", "fp8", 5), "KeyError 640 in get_meta_param"),
    (akt.Call("gfx950", "non-persistent", 64, "fp8", "fp8", 1), "only persistent"),
    (akt.Call("gfx942", "non-persistent", 24, "bf16", "bf16", 1), "get_heuristic_kernel_mla: no kernel"),
])
def test_refusals_say_where_aiter_stops(call, where):
    kernels = akt.read_kernel_lists(REAL)[call.arch]
    with pytest.raises(akt.Refused, match=where):
        akt.dispatch(kernels, call)


def test_persistent_head_fold_asserts_outside_its_range():
    assert akt.persistent_heads("gfx942", 48, "bf16", "bf16", 1) == 16
    with pytest.raises(akt.Refused, match="assert in mla_decode_fwd"):
        akt.persistent_heads("gfx942", 8, "bf16", "bf16", 1)


def test_gfx950_bf16_16_heads_qlen_1_needs_both_kernels():
    """mla_decode_fwd leaves persistent mode for this profile at batch >= 32."""
    kernels = akt.read_kernel_lists(REAL)["gfx950"]
    names, fold = akt.dispatch(kernels, akt.Call("gfx950", "persistent", 16, "bf16", "bf16", 1))
    assert names == ("mla_a16w16_qh64_qseqlen1_gqaratio64_v3_ps", "mla_dec_stage1_bf16_a16w16_subQ16_mqa16")
    assert fold == 1
    without_np = [k for k in kernels if k.name != "mla_dec_stage1_bf16_a16w16_subQ16_mqa16"]
    with pytest.raises(akt.Refused):
        akt.dispatch(without_np, akt.Call("gfx950", "persistent", 16, "bf16", "bf16", 1))


def test_committed_table_is_what_the_script_derives_from_aiter_v0_1_20_post1():
    table = json.loads((TABLES / "v0.1.20.post1.json").read_text())
    assert table["aiter"] == {"tag": "v0.1.20.post1", "commit": "de07f3885ee5f2030ba72b6cc5940d674fd457cf"}
    for arch, sha in table["kernel_lists"].items():
        assert hashlib.sha256(akt.kernel_list_path(REAL, arch).read_bytes()).hexdigest() == sha
    derived = akt.derive_table(REAL, "v0.1.20.post1", "de07f3885ee5f2030ba72b6cc5940d674fd457cf")
    assert akt.dump_table(derived) == (TABLES / "v0.1.20.post1.json").read_text()


def test_check_passes_on_the_right_table_and_names_a_wrong_row(tmp_path):
    rules = {"aiter/mla.py": {"mla_decode_fwd": ""}}
    src = write_source(tmp_path / "src", {"gfx942": [row("bf16", "bf16", 16, 1, 4, "k16ps")]})
    (src / "aiter").mkdir()
    (src / "aiter" / "mla.py").write_text("def mla_decode_fwd(q):\n    return q\n\n\ndef other():\n    pass\n")
    rules = {"aiter/mla.py": akt.fingerprints(src, rules)["aiter/mla.py"]}
    good = tmp_path / "v1.0.json"
    good.write_text(akt.dump_table(akt.derive_table(src, "v1.0")))
    assert akt.check(src, good, rules) == []
    data = json.loads(good.read_text())
    data["rows"][0][6] = ["another_kernel"]
    del data["rows"][5]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    (problem,) = akt.check(src, bad, rules)
    assert "2 row(s)" in problem and "\n" not in problem
    assert "gfx942 persistent 16 heads q bf16 kv bf16 qlen 1: AITER runs ['k16ps']" in problem
    assert "table says ['another_kernel']" in problem and "table has no row" in problem
    # a change inside a dispatch function the rules were read from stops the check
    (src / "aiter" / "mla.py").write_text("def mla_decode_fwd(q):\n    return q + 1\n")
    (problem,) = akt.check(src, good, rules)
    assert "aiter/mla.py: mla_decode_fwd" in problem and "RULES_READ_FROM" in problem
    (problem,) = akt.check(src, tmp_path / "v9.json", rules)
    assert "no MLA kernel table for AITER v9" in problem and "derive" in problem


def test_function_text_cuts_python_and_cpp_functions():
    py = "x = 1\n\ndef f(\n    a,\n):\n    return a\n\n\n# next\ndef g():\n    pass\n"
    assert akt.function_text(py, "f") == "def f(\n    a,\n):\n    return a\n"
    cpp = "int h(int a);\nvoid k(int a,\n       int b)\n{\n    if (a) {\n    }\n}\nvoid z() {}\n"
    assert akt.function_text(cpp, "k") == "void k(int a,\n       int b)\n{\n    if (a) {\n    }\n}\n"
    assert akt.function_text(cpp, "missing") is None
