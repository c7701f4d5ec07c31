"""Helpers the CI pipeline calls: image tags and build-cache refs from versions.json, the
self-test summary table. Standard library only (runs with the runner's python3)."""
