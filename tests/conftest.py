"""Shared by tests/: the Docker-engine integration report, printed in pytest's terminal summary
(CI runs pytest without -s, so step times and results must not depend on captured output;
tests/report_lines.py carries the lines to the summary the repository's conftest.py prints)."""
import pytest
from report_lines import ReportLines

ENGINE_REPORT = ReportLines("Docker-engine integration (CPU)")


@pytest.fixture(scope="session")
def engine_report() -> ReportLines:
    return ENGINE_REPORT
