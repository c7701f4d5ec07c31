"""`python3 -m ci.pipeline summary` on a selftest.json holding anything: a table, or one line
naming the field that is wrong (exit 1), never a traceback."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci.pipeline.__main__ import main
from json_cases import JSON, paths, replaced

# What the self-test writes (runtime report.to_json), with a bench and an accuracy part.
REPORT = {
    "result": "passed", "exit_code": 0,
    "versions": {"vllm": "0.33.0", "torch": "2.13.0", "aiter": "", "backend": "0.1.0"},
    "gpus": [{"index": 0, "target": "gfx942", "name": "MI300X"}], "gpu_source": "amd-smi",
    "suites": [
        {"name": "selector", "status": "passed", "reason": None, "counts": {"passed": 2}, "checks": []},
        {"name": "bench", "status": "passed", "reason": None, "counts": {"passed": 1}, "checks": []},
        {"name": "accuracy", "status": "failed", "reason": "1 check(s) failed", "counts": {"failed": 1},
         "checks": []},
    ],
    "bench": {"runs": {
        "plugin": {"selected": {"attention_backends": ["ROCM_AITER_MLA"], "implementation": "vllm-aiter-mla"},
                   "metrics": {"total_token_throughput": 130.0}},
        "triton": {"selected": {"attention_backends": ["TRITON_MLA"]}, "metrics": {"total_token_throughput": 100.0}},
    }},
    "accuracy": {"ours": "plugin", "comparisons": {"triton": {
        "ok": True,
        "tasks": {"gsm8k": {"strict": {"ours_correct": 9, "reference_correct": 9, "n": 10, "lost": 0, "won": 0,
                                       "p_value": 1.0, "ok": True}}},
        "loglik": {"gsm8k_loglik": {"max_abs_diff": 0.01, "tolerance": [0.05, 0.05], "ok": True}}}}},
}


def summary(tmp_path: Path, report, capsys) -> tuple[int, str, str]:
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    (results / "selftest.json").write_text(json.dumps(report))
    rc = main(["summary", str(results)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_report_as_written_is_a_table(tmp_path, capsys):
    rc, out, err = summary(tmp_path, REPORT, capsys)
    assert rc == 0 and err == "" and "| bench | passed | 1 passed |" in out, err + out
    assert "GPUs: 1 (gfx942)" in out and "aiter (not installed)" in out


@pytest.mark.parametrize("change, named", [
    (lambda r: r.update(gpus=[1]), "'gpus' must be a list of objects"),
    (lambda r: r["suites"][0].pop("status"), "suites['selector'].status must be a string"),
    (lambda r: r.update(versions=["vllm", "0.33.0"]), "'versions' must be an object"),
    (lambda r: r["suites"][1].update(counts={"passed": "1"}), "suites['bench'].counts must be an object of whole"),
    (lambda r: r["suites"][2].update(reason=["x"]), "suites['accuracy'].reason must be a string or null"),
    (lambda r: r.update(result=None), "'result' must be a string"),
    (lambda r: r.update(exit_code="0"), "'exit_code' must be a whole number"),
], ids=["gpus of numbers", "suite without status", "versions a list", "counts of strings", "reason a list",
        "result null", "exit code a string"])
def test_a_report_of_the_wrong_shape_is_one_line_naming_the_field(change, named, tmp_path, capsys):
    report = copy.deepcopy(REPORT)
    change(report)
    rc, out, err = summary(tmp_path, report, capsys)
    assert rc == 1 and out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "selftest.json" in lines[0], err


_PATHS = list(paths(REPORT, lists=True))


@settings(derandomize=True, max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(_PATHS), value=JSON, whole=st.booleans())
def test_any_report_is_a_table_or_one_line(path, value, whole, tmp_path_factory, capsys):
    """Arbitrary JSON anywhere in the report (or as all of it): exit 0 with a table, or exit 1
    with one line, never a traceback."""
    report = value if whole else replaced(REPORT, path, value)
    rc, out, err = summary(tmp_path_factory.mktemp("summary"), report, capsys)
    if rc == 0:
        assert out.startswith("### Self-test: ") and err == "", err
    else:
        assert rc == 1 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
