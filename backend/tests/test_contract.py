"""contract.py answers as AITER v0.1.20.post1 dispatches, on every combination of gfx942/gfx950,
persistent/non-persistent, heads 8-128, query lengths 1-8, bf16/fp8; its only refusals of a
dispatched kernel are the listed defects. Which table is used."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from vllm_aiter_mla import contract

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci" / "docker"))
import aiter_kernel_table as akt  # noqa: E402

REAL = Path(__file__).parent / "data" / "aiter-v0.1.20.post1"
TABLE = contract.load_table("v0.1.20.post1")
P, NP = contract.PERSISTENT, contract.NON_PERSISTENT
DTYPES = [("bf16", "bf16"), ("fp8", "fp8"), ("bf16", "fp8")]


def test_every_combination_answers_as_aiter_dispatches():
    lists = akt.read_kernel_lists(REAL)
    checked = refused_for_defects = 0
    for arch, mode, heads, (q, kv), qlen in itertools.product(contract.ARCHS, contract.DECODE_MODES, range(8, 129),
                                                             DTYPES, range(1, 9)):
        try:
            akt.dispatch(lists[arch], akt.Call(arch, mode, heads, q, kv, qlen))
            runs = True
        except akt.Refused:
            runs = False
        problem = contract.kernel_problem(arch, mode, heads, qlen, q, kv, TABLE)
        defect = contract.defect(TABLE, (arch, mode, heads, q, kv, qlen))
        if not runs:
            assert problem is not None and "has no" in problem, (arch, mode, heads, q, kv, qlen)
        elif defect is not None:
            assert problem == f"{defect.what} ({defect.issue})"
            refused_for_defects += 1
        else:
            assert problem is None, (arch, mode, heads, q, kv, qlen, problem)
        checked += 1
    assert checked == 2 * 2 * 121 * 3 * 8 and refused_for_defects > 0


@pytest.mark.parametrize("arch", contract.ARCHS)
@pytest.mark.parametrize("heads", [32, 64])
def test_non_persistent_bf16_32_and_64_heads_are_native(arch, heads):
    """asm_mla.cu's 32/64-head branches: no padding to 128 (64 heads at query length 1 has a
    kernel on gfx950 only)."""
    for qlen in (2, 4, 8):
        assert contract.kernel_problem(arch, NP, heads, qlen, "bf16", "bf16", TABLE) is None
    first = contract.kernel_problem(arch, NP, heads, 1, "bf16", "bf16", TABLE)
    assert (first is None) == (heads == 32 or arch == "gfx950")


@pytest.mark.parametrize("q,kv", [("fp8", "fp8"), ("bf16", "bf16")])
def test_gfx950_persistent_runs_query_lengths_5_to_8(q, kv):
    """AITER PRs #3380 and #4258 (inside v0.1.20.post1); #2760 is a feature request, not a defect."""
    for heads, qlen in itertools.product((16, 32, 64, 128), range(5, 9)):
        assert contract.kernel_problem("gfx950", P, heads, qlen, q, kv, TABLE) is None
    assert contract.kernel_problem("gfx942", P, 16, 5, q, kv, TABLE) is not None
    assert all("2760" not in d.issue for d in contract.defects())


def test_eight_head_kernels():
    assert contract.kernel_problem("gfx942", NP, 8, 1, "bf16", "bf16", TABLE) is None
    assert contract.kernel_problem("gfx950", NP, 8, 2, "bf16", "bf16", TABLE) is None
    assert contract.kernel_problem("gfx942", NP, 8, 1, "fp8", "fp8", TABLE) is None
    assert contract.kernel_problem("gfx942", P, 8, 2, "bf16", "bf16", TABLE) is None
    assert contract.kernel_problem("gfx950", P, 8, 4, "fp8", "fp8", TABLE) is None
    assert contract.kernel_problem("gfx942", P, 8, 1, "bf16", "bf16", TABLE) is not None


def test_persistent_folds_on_gfx942_and_runs_natively_on_gfx950():
    assert TABLE.rows[("gfx942", P, 64, "bf16", "bf16", 1)][1] == 4
    assert TABLE.rows[("gfx950", P, 64, "bf16", "bf16", 1)][1] == 1
    assert TABLE.rows[("gfx950", P, 64, "fp8", "fp8", 2)][1] == 1


def test_listed_defects_refuse_what_aiter_dispatches():
    # AITER's own persistent test skips bf16 with 32 heads on gfx942; #5679: gfx942 non-persistent bf16 16 heads qlen 8
    assert ("gfx942", P, 32, "bf16", "bf16", 1) in TABLE.rows
    assert "test_mla_persistent.py" in contract.kernel_problem("gfx942", P, 32, 1, "bf16", "bf16", TABLE)
    assert ("gfx942", NP, 16, "bf16", "bf16", 8) in TABLE.rows
    assert "ROCm/aiter#5679" in contract.kernel_problem("gfx942", NP, 16, 8, "bf16", "bf16", TABLE)
    assert contract.kernel_problem("gfx950", NP, 16, 8, "bf16", "bf16", TABLE) is None
    assert "ROCm/aiter#2720" in contract.kernel_problem("gfx950", NP, 16, 3, "bf16", "bf16", TABLE)


def test_smallest_native_head_count_is_used():
    assert contract.kernel_head_count(32, ("gfx942",), NP, range(1, 3), "bf16", "bf16", TABLE) == 32
    assert contract.kernel_head_count(8, ("gfx950",), NP, range(1, 3), "bf16", "bf16", TABLE) == 8
    assert contract.kernel_head_count(24, ("gfx950",), P, range(1, 9), "bf16", "bf16", TABLE) == 24
    # the gfx942 32-head bf16 persistent skip pads to 48 (three folded 16-head calls)
    assert contract.kernel_head_count(32, ("gfx942",), P, range(1, 2), "bf16", "bf16", TABLE) == 48
    # fp8 at query length 5-8 on gfx942: only the 128-head kernel (qSeqLen 0) runs
    assert contract.kernel_head_count(16, ("gfx942",), P, range(1, 9), "fp8", "fp8", TABLE) == 128


def test_describe_names_the_kernel_family():
    text = contract.describe(("gfx942",), P, 48, range(1, 3), "bf16", "bf16", TABLE)
    assert text == ("AITER v0.1.20.post1 gfx942: mla_a16w16_qh16_m16x4_n16x1_coex0_mask1_ps "
                    "(qlen 1-2, 16-head calls x3)")
    text = contract.describe(("gfx950",), P, 16, range(1, 2), "bf16", "bf16", TABLE)
    assert "at batch >= 32 mla_dec_stage1_bf16_a16w16_subQ16_mqa16" in text


def test_table_choice(monkeypatch):
    monkeypatch.setattr(contract, "installed_aiter_version", lambda: None)
    assert contract.active_table({}).tag == contract.available_tables()[-1]
    assert contract.active_table({contract.TABLE_ENV: "v0.1.20.post1"}).tag == "v0.1.20.post1"
    with pytest.raises(ValueError, match="no AITER MLA kernel table for v0.0.1"):
        contract.active_table({contract.TABLE_ENV: "v0.0.1"})
    monkeypatch.setattr(contract, "installed_aiter_version", lambda: "0.1.20.post1")
    assert contract.active_table({}).tag == "v0.1.20.post1"
    monkeypatch.setattr(contract, "installed_aiter_version", lambda: "0.1.26")
    with pytest.raises(ValueError) as err:
        contract.active_table({})
    assert "no kernel table for the installed AITER 0.1.26" in str(err.value) and "\n" not in str(err.value)
    assert "kernel_tables/v0.1.26.json" in str(err.value)


def test_query_lengths_beyond_the_table_are_refused():
    assert "1-8" in contract.kernel_problem("gfx942", NP, 128, 9, "bf16", "bf16", TABLE)
