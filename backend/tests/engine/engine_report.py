"""Lines the engine tests add to pytest's terminal summary (tests/report_lines.py)."""

from report_lines import ReportLines

REPORT = ReportLines("engine comparison")
