"""The test environments carry bytecode for what they install (ci/test.sh and tests/track_env.py
install with --compile-bytecode). Where PYTHONDONTWRITEBYTECODE is set, Python never writes
bytecode at import, and every test process that imports vLLM and torch would compile them from
source again: about 15 s of CPU each on the 2-core CI machine, dozens of processes a run."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# deep modules every vLLM test process imports, beside the packages' own __init__
MODULES = {"vllm": ("__init__.py", "v1/attention/backends/mla/rocm_aiter_mla.py", "_aiter_ops.py"),
           "torch": ("__init__.py", "_tensor.py"), "transformers": ("__init__.py",)}


def uncompiled(package: str, files: tuple[str, ...]) -> list[str]:
    """The files of ``package`` (installed, not imported) without current bytecode beside them."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed here"
    folder = Path(next(iter(spec.submodule_search_locations)))
    missing = []
    for name in files:
        source = folder / name
        cached = Path(importlib.util.cache_from_source(str(source)))
        if not cached.is_file() or cached.stat().st_mtime < source.stat().st_mtime - 1:
            missing.append(str(source.relative_to(folder.parent)))
    return missing


def test_the_test_environment_has_bytecode_for_vllm_and_torch():
    if not os.environ.get("VIRTUAL_ENV") and not Path(os.sys.prefix, "pyvenv.cfg").is_file():
        pytest.skip("not running in a virtual environment made by ci/test.sh")
    missing = [f for package, files in MODULES.items() for f in uncompiled(package, files)]
    assert not missing, f"no bytecode for {missing}: ci/test.sh installs the lock with --compile-bytecode"


def test_both_installers_ask_for_bytecode():
    script = (ROOT / "ci/test.sh").read_text()
    assert "--compile-bytecode -r tests/requirements.lock" in script
    assert '"--compile-bytecode"' in (ROOT / "tests/track_env.py").read_text()
