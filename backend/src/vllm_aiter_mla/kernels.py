"""The one place AITER is imported (lazily), and the explicit choice of kernels.

``AITER_MLA_KERNELS`` selects the kernels:

* ``aiter`` (default): AITER's ``mla_decode_fwd`` (and its persistent-mode metadata). If
  ``aiter`` cannot be imported the backend fails with a message saying how to fix it.
* ``reference``: the package's pure-PyTorch reference (tests, CPU development mode).
  Chosen only by this setting, never as a fallback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

KERNELS_ENV = "AITER_MLA_KERNELS"
KERNEL_MODES = ("aiter", "reference")


class AiterUnavailableError(RuntimeError):
    """AITER is needed (production kernels) but cannot be imported."""


@dataclass(frozen=True)
class MLAKernels:
    name: str
    mla_decode_fwd: Callable[..., object]
    # Persistent-mode scheduling (None when the AITER build lacks it).
    get_mla_metadata_info_v1: Callable[..., object] | None = None
    get_mla_metadata_v1: Callable[..., object] | None = None


def kernel_mode(environ: Mapping[str, str] = os.environ) -> str:
    mode = environ.get(KERNELS_ENV, "aiter").strip().lower() or "aiter"
    if mode not in KERNEL_MODES:
        raise ValueError(f"{KERNELS_ENV}={environ[KERNELS_ENV]!r} is not one of {', '.join(KERNEL_MODES)}")
    return mode


def _import_aiter() -> MLAKernels:
    try:
        import aiter  # noqa: PLC0415  (lazy by design: importing aiter probes the GPU)
        from aiter.mla import mla_decode_fwd  # noqa: PLC0415
    except Exception as exc:  # aiter raises more than ImportError when no GPU is found
        raise AiterUnavailableError(
            f"ROCM_AITER_MLA needs AITER but `import aiter` failed ({type(exc).__name__}: {exc}). "
            "Run in the image built by this project (it ships AITER with prebuilt kernels) or "
            "install the AITER wheel built for your GPU; to serve without it pick another "
            "backend with --attention-backend TRITON_MLA. For CPU development only, set "
            f"{KERNELS_ENV}=reference."
        ) from exc
    return MLAKernels(
        "aiter",
        mla_decode_fwd,
        getattr(aiter, "get_mla_metadata_info_v1", None),
        getattr(aiter, "get_mla_metadata_v1", None),
    )


@functools.cache
def load_kernels(mode: str | None = None) -> MLAKernels:
    mode = mode or kernel_mode()
    if mode == "reference":
        from . import reference  # noqa: PLC0415

        return MLAKernels(
            "reference",
            reference.mla_decode_fwd,
            reference.get_mla_metadata_info_v1,
            reference.get_mla_metadata_v1,
        )
    return _import_aiter()
