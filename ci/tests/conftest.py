"""Shared fixtures for the tests of ci/ (the runtime package rocm_vllm_runtime is installed: ci/test.sh)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

CI_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def fake_openai() -> ModuleType:
    """The fake streaming OpenAI server module next to these tests."""
    path = Path(__file__).resolve().parent / "fake_openai_server.py"
    spec = importlib.util.spec_from_file_location("ci_tests_fake_openai_server", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def ci_dir() -> Path:
    return CI_DIR
