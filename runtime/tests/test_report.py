"""Verdicts of the self-test report: a skipped GPU check is not a pass."""
from __future__ import annotations

import json

from rocm_vllm_runtime import report
from rocm_vllm_runtime.report import Check

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="smoke" tests="3">
<testcase classname="test_smoke" name="test_a" time="0.5"/>
<testcase classname="test_smoke" name="test_b" time="0.1">
<skipped type="pytest.skip" message="no /dev/kfd: no AMD GPU">skip</skipped></testcase>
<testcase classname="test_smoke" name="test_c" time="0.2"><failure message="assert 1 == 2">trace</failure></testcase>
</testsuite></testsuites>"""


def test_parse_junit() -> None:
    checks = report.parse_junit(JUNIT)
    assert [(c.id, c.outcome) for c in checks] == [
        ("test_smoke::test_a", "passed"), ("test_smoke::test_b", "skipped"),
        ("test_smoke::test_c", "failed")]
    assert checks[1].message == "no /dev/kfd: no AMD GPU"


def test_gpu_suite_with_skips_did_not_run() -> None:
    checks = [Check("a", "skipped", "no /dev/kfd"), Check("b", "skipped", "no /dev/kfd")]
    result = report.judge("smoke", checks, needs_gpu=True, pytest_rc=0)
    assert result.status == report.NOT_RUN and "could not run: no /dev/kfd" == result.reason
    assert report.exit_code([result]) == report.EXIT_NOT_RUN


def test_cpu_suite_may_skip_some() -> None:
    checks = [Check("a", "passed"), Check("b", "skipped", "no manifest")]
    assert report.judge("selector", checks, needs_gpu=False, pytest_rc=0).status == report.PASSED


def test_failures_and_errors_win() -> None:
    checks = [Check("a", "passed"), Check("b", "error", "boom")]
    result = report.judge("selector", checks, needs_gpu=False, pytest_rc=1)
    assert result.status == report.FAILED and "b" in result.reason
    assert report.exit_code([result, report.SuiteResult("x", report.NOT_RUN)]) == report.EXIT_FAILED


def test_no_checks_or_pytest_crash() -> None:
    assert report.judge("s", [], needs_gpu=False, pytest_rc=5).status == report.NOT_RUN
    assert report.judge("s", [], needs_gpu=False, pytest_rc=4).status == report.FAILED
    assert report.judge("s", [Check("a", "passed")], needs_gpu=False, pytest_rc=3).status == report.FAILED


def test_all_skipped_cpu_suite_did_not_run() -> None:
    result = report.judge("selector", [Check("a", "skipped", "x")], needs_gpu=False, pytest_rc=0)
    assert result.status == report.NOT_RUN


def test_json_and_render_carry_versions_archs_and_checks() -> None:
    suites = [report.judge("smoke", report.parse_junit(JUNIT), True, 1)]
    doc = report.to_json(suites, {"vllm": "0.32.0", "aiter": ""},
                         [{"index": 0, "target": "gfx942:sramecc+:xnack-", "name": ""}], "rocminfo")
    assert json.loads(json.dumps(doc))["result"] == "failed" and doc["exit_code"] == 1
    assert doc["suites"][0]["counts"] == {"passed": 1, "skipped": 1, "failed": 1}
    text = report.render(doc)
    assert "vllm 0.32.0" in text and "aiter (not installed)" in text
    assert "gfx942:sramecc+:xnack-" in text
    assert "FAIL  test_smoke::test_c -- assert 1 == 2" in text
    assert "SKIP  test_smoke::test_b -- no /dev/kfd" in text
    assert "result: FAILED (exit 1)" in text


def test_merge_junit() -> None:
    merged = report.merge_junit([JUNIT, JUNIT.replace('name="smoke"', 'name="bench"')])
    assert merged.count("<testsuite ") == 2 and len(report.parse_junit(merged)) == 6
