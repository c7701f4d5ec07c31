"""Where AITER keeps modules it compiles at run time, and how prebuilt ones stay visible.

AITER compiles a module it cannot import (JIT, with hipcc) into `AITER_JIT_DIR`.
When `AITER_JIT_DIR` is set, AITER imports every module from that directory
only, so the modules prebuilt into the wheel (`<site-packages>/aiter/jit/*.so`)
would be rebuilt at first use. `prepare()` therefore links each prebuilt module
into the cache directory; modules compiled at run time land beside them as
real files and survive container restarts when the directory is a volume.

The default directory is keyed by the AITER commit of the image, so a cache
volume kept across image upgrades never feeds an old module to a new AITER.

Triton's kernel cache (`TRITON_CACHE_DIR`: the backend's decode planner, which compiles every
launch shape at start, and vLLM's own Triton kernels) goes to `triton/` on the same volume
unless set: Triton keys its entries by its version and each kernel's source, so one directory
serves every image.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

JIT_DIR_ENV = "AITER_JIT_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
CACHE_ROOT_ENV = "ROCM_VLLM_JIT_CACHE"
DEFAULT_CACHE_ROOT = "/var/cache/aiter-jit"


def jit_dir_for(env: Mapping[str, str], aiter_commit: str) -> tuple[str, bool]:
    """(directory, chosen_by_user)."""
    if env.get(JIT_DIR_ENV):
        return env[JIT_DIR_ENV], True
    root = env.get(CACHE_ROOT_ENV) or DEFAULT_CACHE_ROOT
    if aiter_commit:
        return str(Path(root) / f"aiter-{aiter_commit[:12]}"), False
    return root, False


def triton_dir_for(env: Mapping[str, str]) -> str | None:
    """Triton's cache directory on the JIT cache volume, or None when TRITON_CACHE_DIR is set."""
    if env.get(TRITON_CACHE_ENV):
        return None
    return str(Path(env.get(CACHE_ROOT_ENV) or DEFAULT_CACHE_ROOT) / "triton")


def aiter_prebuilt_dir() -> Path | None:
    """`<site-packages>/aiter/jit` without importing aiter (its import probes the GPU)."""
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    jit = Path(list(spec.submodule_search_locations)[0]) / "jit"
    return jit if jit.is_dir() else None


def prebuilt_modules(prebuilt_dir: Path) -> list[Path]:
    return sorted(p for p in prebuilt_dir.glob("*.so") if p.is_file())


def _owner_to_keep(existing: Path) -> tuple[int, int] | None:
    """(uid, gid) of `existing` when running as root in a directory another user owns."""
    if os.geteuid() != 0:
        return None
    info = os.stat(existing)
    return (info.st_uid, info.st_gid) if info.st_uid != 0 else None


def prepare(jit_dir: str, prebuilt_dir: Path | None) -> int:
    """Create the directory and link prebuilt modules into it; returns the link count.

    Real files (modules compiled at run time) are left alone; our own links are
    refreshed so they follow the image's current AITER. Run as root, directories and links
    created here take the owner of the directory they are created in (the cache volume is
    owned by the server's user).
    """
    target = Path(jit_dir)
    missing = [p for p in (target, *target.parents) if not os.path.lexists(p)]
    owner = _owner_to_keep(target.parents[len(missing) - 1] if missing else target)
    target.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        if owner:
            os.chown(created, *owner)
    if prebuilt_dir is None or target.resolve() == prebuilt_dir.resolve():
        return 0
    linked = 0
    for module in prebuilt_modules(prebuilt_dir):
        link = target / module.name
        if link.is_symlink():
            link.unlink()
        elif link.exists():
            continue
        os.symlink(module, link)
        if owner:
            os.chown(link, *owner, follow_symlinks=False)
        linked += 1
    return linked
