"""Shared by tests/: the Docker-engine integration report, printed in pytest's terminal summary
(CI runs pytest without -s, so step times and results must not depend on captured output;
tests/report_lines.py carries the lines from a lane's worker to the summary)."""
import pytest
from report_lines import ReportLines, print_section

ENGINE_REPORT = ReportLines("Docker-engine integration (CPU)")


@pytest.fixture(scope="session")
def engine_report() -> ReportLines:
    return ENGINE_REPORT


def pytest_terminal_summary(terminalreporter):
    print_section(terminalreporter, ENGINE_REPORT)
