"""Lines the engine tests add to pytest's terminal summary."""

REPORT: list[str] = []
