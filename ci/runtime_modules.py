"""The runtime's modules for ci/uv_pip.py alone: ci/test.sh runs it with the test environment's Python
before that environment has the runtime package (uv_pip installs what the runtime's own install needs).
The installed rocm_vllm_runtime when there is one, else this checkout's runtime/src. Every other tool
imports rocm_vllm_runtime plainly; this goes once ci/test.sh runs uv_pip with the runtime importable."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().parents[1] / "runtime" / "src"


def module(name: str) -> ModuleType:
    """rocm_vllm_runtime.<name>; where neither is there, the program stops in one line."""
    try:
        return importlib.import_module(f"rocm_vllm_runtime.{name}")
    except ModuleNotFoundError:
        if not (SOURCE / "rocm_vllm_runtime" / f"{name}.py").is_file():
            raise SystemExit(f"error: rocm_vllm_runtime.{name} is neither installed nor at {SOURCE}: run the tool "
                             "from a whole checkout of this repository") from None
        if str(SOURCE) not in sys.path:
            sys.path.append(str(SOURCE))
        return importlib.import_module(f"rocm_vllm_runtime.{name}")
