"""Lines tests add to pytest's terminal summary, one section each (the Docker-engine integration's
step times, the engine comparison's figures).

The lines go through files in the folder named by ROCM_VLLM_TEST_REPORTS, which the repository's
conftest.py makes before any test runs and prints at the end: when the run is split into lanes
(pytest-xdist), the tests that write lines run in worker processes and the controller prints the
summary. Without that folder (a test module run on its own outside the repository's conftest)
lines are kept in memory."""
from __future__ import annotations

import os
from pathlib import Path

REPORTS_ENV = "ROCM_VLLM_TEST_REPORTS"


class ReportLines:
    """Append-only lines of one summary section."""

    def __init__(self, section: str):
        self.section = section
        self._memory: list[str] = []

    def _file(self) -> Path | None:
        folder = os.environ.get(REPORTS_ENV)
        if not folder:
            return None
        return Path(folder) / (self.section.replace("/", "-") + ".txt")  # printed by conftest.py

    def append(self, line: str) -> None:
        path = self._file()
        if path is None:
            self._memory.append(line)
            return
        with path.open("a") as f:
            f.write(line.replace("\n", " ") + "\n")

    def lines(self) -> list[str]:
        path = self._file()
        if path is None:
            return list(self._memory)
        return path.read_text().splitlines() if path.is_file() else []
