"""Helpers the CI pipeline calls: the self-test summary table. Standard library only (runs with
the runner's python3)."""
