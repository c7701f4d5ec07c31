"""Shared by tests/: the Docker-engine integration report, printed in pytest's terminal summary
(CI runs pytest without -s, so step times and results must not depend on captured output)."""
import pytest

ENGINE_REPORT: list[str] = []


@pytest.fixture(scope="session")
def engine_report() -> list[str]:
    return ENGINE_REPORT


def pytest_terminal_summary(terminalreporter):
    if ENGINE_REPORT:
        terminalreporter.section("Docker-engine integration (CPU)")
        for line in ENGINE_REPORT:
            terminalreporter.write_line(line)
