"""Shared set-up of the self-test suites (they run in this repository and in the image)."""

import os

from rocm_vllm_runtime.guard import kfd_path

# vLLM decides pin-memory and device defaults at import. Where there is no AMD GPU
# (this repository's CI), say "CPU"; inside the image on a GPU host leave vLLM alone.
if not os.path.exists(kfd_path(os.environ)):
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def pytest_configure(config) -> None:
    # Inside the image the suites run without this repository's pytest.ini.
    config.addinivalue_line("markers", "gpu: needs an AMD GPU with AITER (skipped elsewhere)")
    config.addinivalue_line("markers", "image: runs inside the built image (needs its manifest)")
