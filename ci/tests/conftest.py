"""Shared fixtures for the tests of ci/ (the runtime package rocm_vllm_runtime is installed: ci/test.sh)."""
from __future__ import annotations

from pathlib import Path

import pytest

CI_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def ci_dir() -> Path:
    return CI_DIR
