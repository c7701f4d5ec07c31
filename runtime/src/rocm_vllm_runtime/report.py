"""Self-test results: JUnit XML from pytest in, a verdict, a printed summary and JSON out.

Pure functions. A suite that needs a GPU passes only when every check ran and
passed: a skipped check there means the suite could not run, which is not a pass.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

PASSED, FAILED, NOT_RUN = "passed", "failed", "not run"
EXIT_OK, EXIT_FAILED, EXIT_NOT_RUN = 0, 1, 2
_MARK = {"passed": "PASS", "failed": "FAIL", "error": "ERROR", "skipped": "SKIP"}


@dataclass(frozen=True)
class Check:
    id: str
    outcome: str  # passed | failed | error | skipped
    message: str = ""
    seconds: float = 0.0


@dataclass
class SuiteResult:
    name: str
    status: str
    reason: str = ""
    checks: list[Check] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(check.outcome for check in self.checks))


def parse_junit(xml_text: str) -> list[Check]:
    """Checks of a pytest --junitxml file (xunit1 or xunit2)."""
    root = ET.fromstring(xml_text)
    checks: list[Check] = []
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        ident = f"{classname}::{name}" if classname else name
        outcome, message = "passed", ""
        for tag, outcome_of_tag in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            node = case.find(tag)
            if node is not None:
                outcome, message = outcome_of_tag, node.get("message") or (node.text or "").strip()
                break
        checks.append(Check(ident, outcome, _one_line(message), float(case.get("time") or 0)))
    return checks


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def judge(name: str, checks: Sequence[Check], needs_gpu: bool, pytest_rc: int) -> SuiteResult:
    result = SuiteResult(name, PASSED, checks=list(checks))
    bad = [c for c in checks if c.outcome in ("failed", "error")]
    skipped = [c for c in checks if c.outcome == "skipped"]
    passed = [c for c in checks if c.outcome == "passed"]
    if bad:
        result.status, result.reason = FAILED, f"{len(bad)} check(s) failed: " + "; ".join(c.id for c in bad[:5])
    elif not checks:
        result.status, result.reason = ((FAILED, f"pytest exited {pytest_rc} before running checks")
                                        if pytest_rc not in (0, 5) else (NOT_RUN, "no checks collected"))
    elif pytest_rc not in (0, 1, 5):
        result.status, result.reason = FAILED, f"pytest exited {pytest_rc}"
    elif needs_gpu and skipped:
        reasons = sorted({c.message for c in skipped if c.message})
        result.status, result.reason = NOT_RUN, "could not run: " + ("; ".join(reasons) or "checks skipped")
    elif not passed:
        reasons = sorted({c.message for c in skipped})
        result.status, result.reason = NOT_RUN, "every check skipped: " + "; ".join(reasons)
    return result


def exit_code(suites: Sequence[SuiteResult]) -> int:
    if any(s.status == FAILED for s in suites):
        return EXIT_FAILED
    if any(s.status == NOT_RUN for s in suites):
        return EXIT_NOT_RUN
    return EXIT_OK


def overall(code: int) -> str:
    return {EXIT_OK: PASSED, EXIT_FAILED: FAILED}.get(code, NOT_RUN)


def to_json(suites: Sequence[SuiteResult], versions: Mapping[str, str],
            gpus: Sequence[Mapping[str, object]], gpu_source: str,
            extra: Mapping[str, object] | None = None) -> dict[str, object]:
    code = exit_code(suites)
    suites_json = [{"name": s.name, "status": s.status, "reason": s.reason, "counts": s.counts,
                    "checks": [asdict(c) for c in s.checks]} for s in suites]
    return {"result": overall(code), "exit_code": code, "versions": dict(versions), "gpus": [dict(g) for g in gpus],
            "gpu_source": gpu_source, "suites": suites_json, **(extra or {})}


def render(doc: Mapping[str, object]) -> str:
    """Printed summary of a `to_json` document."""
    lines = ["", "=" * 24 + " selftest summary " + "=" * 24]
    versions = doc.get("versions", {})
    assert isinstance(versions, Mapping)
    lines.append("versions:  " + "  ".join(f"{k} {v or '(not installed)'}" for k, v in versions.items()))
    gpus = doc.get("gpus") or []
    assert isinstance(gpus, list)
    lines.append(f"GPU archs: {', '.join(str(g['target']) for g in gpus)} (from {doc.get('gpu_source')})"
                 if gpus else "GPU archs: none found")
    for suite in doc.get("suites", []):  # type: ignore[union-attr]
        counts = ", ".join(f"{n} {k}" for k, n in sorted(suite["counts"].items())) or "no checks"
        lines.append(f"\n[{suite['name']}] {suite['status'].upper()} ({counts})")
        if suite["reason"]:
            lines.append(f"  {suite['reason']}")
        for check in suite["checks"]:
            line = f"  {_MARK.get(check['outcome'], check['outcome']):5} {check['id']}"
            if check["message"] and check["outcome"] != "passed":
                line += f" -- {check['message']}"
            lines.append(line)
    lines.append(f"\nresult: {str(doc['result']).upper()} (exit {doc['exit_code']})")
    return "\n".join(lines)


def junit_of(suite: str, checks: Sequence[Check]) -> str:
    """A JUnit document for checks that did not come from pytest (e.g. a suite stopped before it ran)."""
    root = ET.Element("testsuites")
    node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(checks)),
                         failures=str(sum(c.outcome == "failed" for c in checks)), errors="0", skipped="0")
    for check in checks:
        classname, _, name = check.id.rpartition("::")
        case = ET.SubElement(node, "testcase", classname=classname, name=name, time=f"{check.seconds:.3f}")
        if check.outcome == "failed":
            ET.SubElement(case, "failure", message=check.message)
    return ET.tostring(root, encoding="unicode")


def merge_junit(xml_texts: Sequence[str]) -> str:
    """One <testsuites> document from several pytest JUnit files."""
    merged = ET.Element("testsuites")
    for text in xml_texts:
        root = ET.fromstring(text)
        merged.extend([root] if root.tag == "testsuite" else list(root.iter("testsuite")))
    return ET.tostring(merged, encoding="unicode")
