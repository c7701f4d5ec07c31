"""Repository-wide test policy: under CI a skip is a failure, unless the test needs
something no CI machine has.

The repository installs everything its tests need on a CI machine (a Docker engine with
buildx and compose through `.ci/run`, hadolint and BuildKit's Dockerfile parser through
`ci/test.sh`). So when `CI` is set, a test that would skip for want of one of them fails
with the same reason. Allowed to skip under CI:

* tests marked `gpu`: they need an AMD GPU with AITER;
* tests marked `image`: they need the image manifest (they run inside the built image).

The terminal summary ends with one line saying what skipped and why.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

ALLOWED_SKIP_MARKERS = ("gpu", "image")
_SKIPS: Counter[str] = Counter()


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    allowed = next((m for m in ALLOWED_SKIP_MARKERS if item.get_closest_marker(m)), None)
    if under_ci() and allowed is None:
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI, but the repository installs what this test needs "
                           f"(.ci/run, ci/test.sh): {reason}")
        return
    _SKIPS[f"{allowed or 'skip'}: {reason}"] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _SKIPS:
        line = "skipped: none"
    else:
        parts = [f"{n} x [{reason}]" for reason, n in sorted(_SKIPS.items(), key=lambda kv: (-kv[1], kv[0]))]
        line = f"skipped: {sum(_SKIPS.values())} ({'; '.join(parts)})"
    terminalreporter.section("skips")
    terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def ci_dir() -> Path:
    """The repository's ci/ folder (in-image suites, pipeline scripts), for tests that run its files."""
    return Path(__file__).resolve().parent / "ci"


@pytest.fixture(scope="session")
def runtime_dir() -> Path:
    """The repository's runtime/ folder (the image's entrypoint, selftest command and runtime package)."""
    return Path(__file__).resolve().parent / "runtime"
