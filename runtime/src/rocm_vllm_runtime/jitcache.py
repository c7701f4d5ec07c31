"""Where AITER keeps modules it compiles at run time, and how prebuilt ones stay visible.

AITER compiles a module it cannot import (JIT, with hipcc) into `AITER_JIT_DIR`. When that is set,
AITER imports every module from there only, so the modules prebuilt into the wheel
(`<site-packages>/aiter/jit/*.so`) would be rebuilt at first use. `prepare()` therefore links each
into the cache directory; modules compiled at run time land beside them and survive restarts on a
volume. The default directory is keyed by the image's AITER commit: a kept volume never feeds an
old module to a new AITER.

Two more caches go to the same volume unless their variable is set (`VOLUME_CACHES`): Triton's
kernel cache (`TRITON_CACHE_DIR`, in `triton/`: the decode planner compiles every launch shape at
start, and vLLM's own Triton kernels) and vLLM's cache folder (`VLLM_CACHE_ROOT`, in `vllm/`:
torch.compile's artifacts, what vLLM learns of a model class at every start, and from vLLM 0.34 its
start-up plans). Both key each entry by a hash of what it was made from, so one folder serves every
image.

AITER builds in `<AITER_JIT_DIR>/build` (`bd_dir` in aiter/jit/core.py) under lock files
(`build_module` -> `mp_lock` -> `FileBaton`, aiter/jit/utils/cpp_extension.py). On a volume a lock
of a killed build is never broken and the next start waits forever (ROCm/aiter #3635, #5266;
docs/troubleshooting.md, "AITER JIT build locks", says why). `link_build_dir()` therefore points
`<AITER_JIT_DIR>/build` at a directory of this container run only (`run_build_dir()`: under $TMPDIR,
keyed by `run_key()`). Compiled modules are still copied to `AITER_JIT_DIR` and stay on the volume.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from . import files

JIT_DIR_ENV = "AITER_JIT_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
VLLM_CACHE_ENV = "VLLM_CACHE_ROOT"
# The other programs' caches on the volume: variable -> folder under the cache root, and what it holds.
VOLUME_CACHES = {TRITON_CACHE_ENV: ("triton", "Triton kernels"), VLLM_CACHE_ENV: ("vllm", "vLLM's caches")}
CACHE_ROOT_ENV = "ROCM_VLLM_JIT_CACHE"
DEFAULT_CACHE_ROOT = "/var/cache/aiter-jit"
# AITER's build directory inside AITER_JIT_DIR (aiter/jit/core.py: bd_dir).
BUILD_DIR_NAME = "build"
# Where each container run keeps AITER's build directory: under $TMPDIR (default /tmp), which
# AITER needs writable anyway (it merges its tuned configs under /tmp/aiter_configs).
BUILD_ROOT_NAME = "rocm-vllm-aiter-build"
# The fixed path `<AITER_JIT_DIR>/build` points at, whichever container follows the link.
CURRENT_RUN = "current"
RUN_PREFIX = "run-"


def jit_dir_for(env: Mapping[str, str], aiter_commit: str) -> tuple[str, bool]:
    """(directory, chosen_by_user); RefusedError (one line) when the manifest's commit would put the
    directory outside the cache root."""
    if env.get(JIT_DIR_ENV):
        return env[JIT_DIR_ENV], True
    root = cache_root(env)
    if aiter_commit:
        try:
            return str(files.inside(root, f"aiter-{aiter_commit[:12]}")), False
        except files.RefusedError:
            raise files.RefusedError(
                f"the image manifest's aiter.commit {aiter_commit!r} is not a commit: the AITER JIT cache keyed "
                f"by it would leave {root}; rebuild the image (its manifest is damaged) or set {JIT_DIR_ENV}"
            ) from None
    return root, False


def cache_root(env: Mapping[str, str]) -> str:
    """The JIT cache volume's mount point."""
    return env.get(CACHE_ROOT_ENV) or DEFAULT_CACHE_ROOT


def volume_cache_dirs(env: Mapping[str, str]) -> dict[str, str]:
    """Each of VOLUME_CACHES whose variable is not set: its variable -> its folder on the JIT cache volume."""
    root = Path(cache_root(env))
    return {name: str(root / folder) for name, (folder, _) in VOLUME_CACHES.items() if not env.get(name)}


def build_root_for(env: Mapping[str, str]) -> str:
    """The container-local directory that holds AITER's build directory of each run."""
    tmp = env.get("TMPDIR") or ""
    return str(Path(tmp if os.path.isabs(tmp) else "/tmp") / BUILD_ROOT_NAME)


def _start_time(stat: str) -> str:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks after boot); the command name
    before it may hold spaces and parentheses."""
    return stat[stat.rindex(")") + 2:].split()[19]


def run_key(proc: Path = Path("/proc")) -> str:
    """Identity of this container run: boot, PID namespace and start of its process 1 (a part that
    cannot be read counts as empty). A `docker exec` shares it; a restarted container gets another."""
    parts = []
    for read in (lambda: (proc / "sys/kernel/random/boot_id").read_text().strip(),
                 lambda: os.readlink(proc / "self/ns/pid"),
                 lambda: _start_time((proc / "1/stat").read_text())):
        try:
            parts.append(read())
        except (OSError, ValueError, IndexError):
            parts.append("")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def run_build_dir(root: str, key: str) -> Path:
    """`<root>/current`, a link to this run's own directory `<root>/run-<key>`.

    The root must be this program's (files.made_problem, else RefusedError), so the other `run-*`
    directories in it belong to runs whose processes are all gone, their locks stale: those this
    program made are removed.
    """
    base = Path(root)
    files.make_dir(base)
    problem = files.made_problem(base)
    if problem:
        raise files.RefusedError(f"{base} was not made by this program ({problem}): nothing in it is used or "
                                 "removed; set TMPDIR to a folder of this container only")
    run = files.make_dir(files.inside(base, f"{RUN_PREFIX}{key}", "the container run's key"))
    current = base / CURRENT_RUN
    files.point_link(current, run.name, _is_run_name)
    for entry in base.iterdir():
        if _is_run_name(entry.name) and entry.name != run.name and files.is_made(entry):
            files.remove_made(entry, base)
    return current


def _is_run_name(target: str) -> bool:
    return target.startswith(RUN_PREFIX) and "/" not in target


def _is_current_run(target: str) -> bool:
    """A link `link_build_dir` made: to `<TMPDIR>/rocm-vllm-aiter-build/current`."""
    path = Path(target)
    return path.name == CURRENT_RUN and path.parent.name == BUILD_ROOT_NAME


def link_build_dir(jit_dir: str, build_dir: Path) -> None:
    """Point AITER's build directory `<jit_dir>/build` at `build_dir` (this run's own).

    Only a link this program made there is replaced; anything else (also a real build directory of an
    image without this layout: its locks cannot be told from live ones) is kept, RefusedError. Run as
    root, the link takes the owner of the cache directory.
    """
    jit = Path(jit_dir)
    files.point_link(jit / BUILD_DIR_NAME, str(build_dir), _is_current_run, _owner_to_keep(jit),
                     advice=f"move it away, or set {JIT_DIR_ENV} to another directory")


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

    Real files (modules compiled at run time) are left alone; our own links follow the image's current
    AITER. Run as root, what is created takes the owner of its folder (the server's user owns the volume).
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
        if link.is_symlink() and not _is_prebuilt_link(os.readlink(link)):
            continue  # a link of someone else's
        if not link.is_symlink() and os.path.lexists(link):
            continue  # a module compiled at run time
        files.point_link(link, str(module), _is_prebuilt_link, owner)
        linked += 1
    return linked


def _is_prebuilt_link(target: str) -> bool:
    """A link `prepare` made: to a module in an AITER package's jit folder (of this image or an earlier one)."""
    path = Path(target)
    return path.suffix == ".so" and path.parent.name == "jit" and path.parent.parent.name == "aiter"
