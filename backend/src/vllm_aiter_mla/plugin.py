"""vLLM general-plugin entry point (group ``vllm.general_plugins``, name ``aiter_mla``).

vLLM calls :func:`register` once in every process (API server, engine core,
workers). It points vLLM's ``ROCM_AITER_MLA`` registry entry at this package's
backend, so vLLM's own ROCm selection picks it exactly where it would pick the
built-in one, and ``--attention-backend ROCM_AITER_MLA`` selects it. Where the release turns its
extensible KV cache on by default, it is turned off for MLA models on ROCm (``extensible_cache``).

Leaving ``aiter_mla`` out of ``VLLM_PLUGINS`` runs vLLM's built-in implementation
instead (for side-by-side comparison).

CPU development mode (``AITER_MLA_KERNELS=reference`` on vLLM's CPU platform):
the same planning and decode call, with the package's reference kernel, replaces
vLLM's CPU MLA backend. Never chosen implicitly.

A vLLM outside ``SUPPORTED_VLLM`` (the release tracks of versions.json) is refused where it can
be fixed: the image build stops (``python3 -m vllm_aiter_mla.plugin check``). At run time the
plugin never takes vLLM down (vLLM loads general plugins without catching their errors): it
registers nothing and logs one error line, so vLLM's built-in backend runs, and the image's
selector suite fails on it.
"""

from __future__ import annotations

import logging
import os

from . import SUPPORTED_VLLM, __version__, extensible_cache
from .kernels import KERNELS_ENV, kernel_mode

logger = logging.getLogger("vllm.aiter_mla")

ROCM_BACKEND_PATH = "vllm_aiter_mla.backend.AiterMLABackend"
CPU_DEV_BACKEND_PATH = "vllm_aiter_mla.cpu_dev.CPUDevMLABackend"


def _distributions():
    """The image runtime's one reader of installed metadata (rocm_vllm_runtime.distributions), imported
    when asked: importing the plugin imports none of the runtime, and where it is missing register()
    says so in its one line."""
    from rocm_vllm_runtime import distributions  # noqa: PLC0415

    return distributions


def _installed_vllm_version() -> str | None:
    """The installed vLLM's version; "" when its metadata has none; None when not installed."""
    dists = _distributions()
    return dists.version_of(*dists.VLLM_DISTRIBUTIONS)


def vllm_version_problem(found: str | None) -> str | None:
    """Why this package cannot serve the vLLM ``found`` (None: it can)."""
    from packaging.specifiers import SpecifierSet  # noqa: PLC0415
    from packaging.version import InvalidVersion, Version  # noqa: PLC0415

    if found is None:
        return "vllm-aiter-mla is a vLLM plugin, but vLLM is not installed"
    dists = _distributions()
    if found == dists.NO_VERSION:
        return dists.no_version_problem("vLLM", dists.VLLM_DISTRIBUTIONS)
    try:
        # A local build tag (+rocm...) is still that release; pre-releases are not.
        release = Version(Version(found).public)
    except InvalidVersion:
        return f"vllm-aiter-mla {__version__} cannot read the installed vLLM's version {found!r}"
    # Pre-releases are refused explicitly (packaging's own pre-release rule differs by version).
    if release.is_prerelease or release not in SpecifierSet(SUPPORTED_VLLM, prereleases=False):
        return f"vllm-aiter-mla {__version__} supports vLLM {SUPPORTED_VLLM} (releases only), found {found}"
    return None


def check_vllm_version(found: str | None) -> None:
    """RuntimeError naming the versions when this package cannot serve the vLLM ``found``."""
    problem = vllm_version_problem(found)
    if problem:
        raise RuntimeError(f"{problem}. Install a matching vLLM, or leave the plugin out with VLLM_PLUGINS.")


def _installed_vllm_problem() -> tuple[str | None, str | None]:
    """(the installed vLLM's version, why this package cannot serve it or None)."""
    dists = _distributions()
    try:
        found = _installed_vllm_version()
    except dists.MetadataError as exc:
        return None, f"vLLM's version cannot be read: {exc}"
    return found, vllm_version_problem(found)


def register() -> None:
    """Never raises: vLLM does not catch a general plugin's errors, so every vLLM process (API
    server, engine core, workers) would fail to start. Whatever stops the registration is one
    error line, and vLLM's built-in attention backends are used."""
    try:
        _register()
    except Exception as exc:  # noqa: BLE001 - the plugin must never take vLLM down
        reason = " ".join(str(exc).split()) or type(exc).__name__
        logger.error("vllm-aiter-mla: not registered (%s: %s); vLLM's built-in attention backends are used",
                     type(exc).__name__, reason)


def _register() -> None:
    _, problem = _installed_vllm_problem()
    if problem:
        logger.error("%s: not registered; vLLM's built-in attention backends are used", problem)
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend  # noqa: PLC0415

    register_backend(AttentionBackendEnum.ROCM_AITER_MLA, ROCM_BACKEND_PATH)
    extensible_cache.install()  # before vLLM settles its config: the real KV cache mapped before capture
    if kernel_mode() == "reference":
        from vllm.platforms import current_platform  # noqa: PLC0415

        logger.warning(
            "vllm-aiter-mla: %s=reference: pure-PyTorch reference kernels (development only, slow)",
            KERNELS_ENV,
        )
        if current_platform.is_cpu():
            register_backend(AttentionBackendEnum.CPU_MLA, CPU_DEV_BACKEND_PATH)
    logger.debug("vllm-aiter-mla %s registered (pid %d)", __version__, os.getpid())


def main(argv: list[str] | None = None) -> int:
    """``python3 -m vllm_aiter_mla.plugin check``: exit 1, in one line, when the installed vLLM is
    one this package does not support (the image build runs it after installing the backend)."""
    import sys  # noqa: PLC0415

    args = sys.argv[1:] if argv is None else argv
    if args != ["check"]:
        print("usage: python3 -m vllm_aiter_mla.plugin check", file=sys.stderr)
        return 2
    found, problem = _installed_vllm_problem()
    if problem:
        print(f"error: {problem}: build on a vLLM of a release track (versions.json tracks; TRACK, VLLM_IMAGE)",
              file=sys.stderr)
        return 1
    print(f"vllm-aiter-mla {__version__}: vLLM {found} is supported ({SUPPORTED_VLLM})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
