"""The build helpers of docker/ (standard-library scripts that the Docker build stages run as
`python3 -B /opt/rocm-vllm/docker/<name>.py`), imported on the host by the pin tool and the tests.

docker/ is no package, and is not imported by its folder's name: `import docker` gives whichever
`docker` Python finds first, and an installed docker-py (a regular package) beats the checkout's
folder (a namespace package). Each script is imported here instead, by the folder's path, as a module
of a private package bound to that folder: `load("lock_lines")` is `_rocm_vllm_build_scripts.lock_lines`.
A script's `from .lock_lines import ...` finds its sibling in the same package; run as a script in a
build stage, it imports the sibling from its own folder (docker/vllm_requirements.py does both).
This is the one place that loads a file of docker/ as a module (tests/test_docker_name.py)."""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

FOLDER = Path(__file__).resolve().parents[1] / "docker"
PACKAGE = "_rocm_vllm_build_scripts"


def load(name: str) -> ModuleType:
    """docker/<name>.py as the module `_rocm_vllm_build_scripts.<name>`, imported once per process."""
    if "." in name or not name.isidentifier():
        raise ValueError(f"{name!r}: not the name of a script of docker/ (lock_lines, pinned_dists, ...)")
    if PACKAGE not in sys.modules:
        spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [str(FOLDER)]
        sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f"{PACKAGE}.{name}")
