"""Runtime guard: decide, before any GPU code runs, whether and how this image may start.

Functional core: `decide(GuardInputs) -> Decision` (pure). The adapter `main()`
gathers the inputs (runs `amd-smi` and `rocminfo`, reads the manifest and the
environment, checks the KFD device node), prepares the AITER JIT cache
directory and prints the decided variables as shell `export` lines for
`entrypoint.sh` to evaluate. Log lines go to stderr, one line each; a fatal
decision prints one `error:` line and exits 1.

Settings (environment; a value outside the listed ones stops the container with one line):
  ROCM_VLLM_MANIFEST     image manifest (default /opt/rocm-vllm/manifest.json)
  ROCM_VLLM_REQUIRE_GPU  1: every mode needs a usable GPU; 0: skip the GPU check
                         (CPU runs); unset or empty: only `serve` needs one
  ROCM_VLLM_KFD_PATH     the ROCm compute device node (default /dev/kfd)
  ROCM_VLLM_DRI_PATH     the directory of the GPUs' render nodes renderD* (default /dev/dri);
                         each must open read-write (the container needs the host's render group)
  ROCM_VLLM_JIT_CACHE    mount point of the AITER JIT cache (default /var/cache/aiter-jit)
  AITER_JIT_DIR          used as given when set; either way its build/ (AITER's build directory
                         and lock files) becomes a link to a directory of this container run,
                         so no lock outlives the run or is seen by another container
  TMPDIR                 where those per-run build directories live (default /tmp); must be
                         the container's own
  TRITON_CACHE_DIR       used as given when set; unset: triton/ under ROCM_VLLM_JIT_CACHE
  VLLM_CACHE_ROOT        used as given when set; unset: vllm/ under ROCM_VLLM_JIT_CACHE
  VLLM_ROCM_USE_AITER    as vLLM reads it: 1 or true (any case) on, 0 or false off; kept when
                         set; unset or empty: 1 on gfx942/gfx950, 0 elsewhere
  VLLM_ROCM_USE_AITER_MLA  as vLLM reads it (1/true on, 0/false off, any case; unset: on); any
                         other value stops the container (vLLM would read it as off)
"""
from __future__ import annotations

import argparse
import errno
import os
import shlex
import shutil
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rocm_vllm_runtime import children, files, jitcache
from rocm_vllm_runtime.devices import Gpu, parse_listing
from rocm_vllm_runtime.manifest import Manifest, ManifestError, load_manifest

AITER_ARCHS = ("gfx942", "gfx950")
REQUIRE_GPU_ENV = "ROCM_VLLM_REQUIRE_GPU"
KFD_ENV = "ROCM_VLLM_KFD_PATH"
DEFAULT_KFD = "/dev/kfd"
DRI_ENV = "ROCM_VLLM_DRI_PATH"
DEFAULT_DRI = "/dev/dri"
USE_AITER_ENV = "VLLM_ROCM_USE_AITER"
# The AITER switches vLLM's MLA selection reads (vllm/envs.py; tests/test_vllm_source.py holds
# each track's reading to AITER_VALUES).
AITER_SWITCHES = (USE_AITER_ENV, "VLLM_ROCM_USE_AITER_MLA")
LOG_PREFIX = "[rocm-vllm]"
# vLLM 0.32 (vllm/envs.py): on for "1"/"true", any case; every other value is off. Only the
# values vLLM gives a meaning to are accepted: anything else would be silently off.
AITER_VALUES = {"1": True, "true": True, "0": False, "false": False}
REQUIRE_GPU_VALUES = ("0", "1")
RENDER_GID_HINT = ("set RENDER_GID to the host's render group id "
                   "(echo RENDER_GID=$(getent group render | cut -d: -f3) >> .env; "
                   "docker run: --group-add <that id>)")


def kfd_path(env: Mapping[str, str]) -> str:
    """The ROCm compute device node this container is to have (ROCM_VLLM_KFD_PATH, default /dev/kfd)."""
    return env.get(KFD_ENV) or DEFAULT_KFD


@dataclass(frozen=True)
class RenderNode:
    """A render node under the DRI directory; `error` empty when it opened read-write."""
    path: str
    error: str = ""


@dataclass(frozen=True)
class Listing:
    """Output of one device tool; `text` None when the tool is absent or failed."""
    tool: str
    text: str | None
    problem: str = ""


@dataclass(frozen=True)
class GuardInputs:
    mode: str  # "serve", "selftest" or "exec"
    listings: Sequence[Listing]
    env: Mapping[str, str]
    has_kfd: bool
    manifest: Manifest | None = None
    manifest_error: str = ""
    aiter_installed: bool = True
    render_nodes: Sequence[RenderNode] | None = None  # None: not checked


@dataclass
class Decision:
    env: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    fatal: str = ""
    gpus: list[Gpu] = field(default_factory=list)
    jit_dir: str = ""
    jit_mount: str = ""  # where a volume keeps the JIT cache
    jit_build: str = ""  # the container-local root of AITER's build directory per run
    cache_dirs: dict[str, str] = field(default_factory=dict)  # jitcache.VOLUME_CACHES not set: variable -> folder
    jit_problem: str = ""  # why there is no JIT cache directory (a manifest commit that is no name)

    @property
    def ok(self) -> bool:
        return not self.fatal


def find_gpus(listings: Sequence[Listing]) -> tuple[list[Gpu], str, list[str]]:
    """First listing that names an arch for every GPU: (gpus, tool, problems)."""
    problems: list[str] = []
    for listing in listings:
        if listing.text is None:
            problems.append(f"{listing.tool}: {listing.problem or 'not available'}")
            continue
        gpus = parse_listing(listing.text)
        if not gpus:
            problems.append(f"{listing.tool}: lists no GPU")
        elif any(not g.target for g in gpus):
            problems.append(f"{listing.tool}: no graphics arch for some GPUs")
        else:
            return gpus, listing.tool, problems
    return [], "", problems


def user_aiter(env: Mapping[str, str]) -> bool | None:
    """VLLM_ROCM_USE_AITER as vLLM reads it; None when unset or empty (the guard decides)."""
    value = env.get(USE_AITER_ENV, "")
    return None if value == "" else AITER_VALUES.get(value.lower())


def setting_problem(env: Mapping[str, str]) -> str:
    """One line naming the first setting whose value is not one of its documented values."""
    for name in AITER_SWITCHES:
        value = env.get(name, "")
        if value != "" and value.lower() not in AITER_VALUES:
            default = "for the guard's choice" if name == USE_AITER_ENV else "for vLLM's default (on)"
            return (f"{name}={shlex.quote(value)} is not a value vLLM reads (it would "
                    f"silently mean off): set 1 or true for on, 0 or false for off, or leave it "
                    f"empty {default}")
    value = env.get(REQUIRE_GPU_ENV, "")
    if value != "" and value not in REQUIRE_GPU_VALUES:
        return (f"{REQUIRE_GPU_ENV}={shlex.quote(value)} is not one of its values: set 1 (every "
                "mode needs a GPU), 0 (no GPU check, CPU runs) or leave it empty (only serve needs one)")
    return ""


def strictness(mode: str, env: Mapping[str, str]) -> str:
    """'strict' (problems are fatal), 'warn' (problems are logged) or 'off'."""
    value = env.get(REQUIRE_GPU_ENV, "")
    if value == "0":
        return "off"
    if value == "1" or mode == "serve":
        return "strict"
    return "warn"


def describe(gpus: Sequence[Gpu]) -> str:
    counts = Counter(gpu.target + (f" ({gpu.name})" if gpu.name else "") for gpu in gpus)
    return ", ".join(f"{n} x {label}" for label, n in counts.items())


def _aiter_default(decision: Decision, env: Mapping[str, str], value: str, why: str) -> None:
    user = user_aiter(env)
    if user is not None:
        decision.log.append(f"{USE_AITER_ENV}={env[USE_AITER_ENV]} set by the user: kept "
                            f"(AITER {'on' if user else 'off'})")
        return
    decision.env[USE_AITER_ENV] = value
    decision.log.append(why)


def _problem(decision: Decision, level: str, message: str, env: Mapping[str, str],
             why: str = "AITER off: no usable AMD GPU (VLLM_ROCM_USE_AITER=0)") -> Decision:
    """Strict: the message is fatal. Otherwise a warning, and AITER off (`why`)."""
    if level == "strict":
        decision.fatal = message
        return decision
    decision.log.append(f"warning: {message}")
    _aiter_default(decision, env, "0", why)
    return decision


def _jit_cache(decision: Decision, inputs: GuardInputs) -> None:
    # Triton's and vLLM's caches serve an image without AITER too (vLLM's Triton kernels, torch.compile).
    decision.cache_dirs = jitcache.volume_cache_dirs(inputs.env)
    decision.env.update(decision.cache_dirs)
    decision.jit_mount = jitcache.cache_root(inputs.env)
    if not inputs.aiter_installed:
        return
    commit = inputs.manifest.aiter_commit if inputs.manifest else ""
    try:
        path, by_user = jitcache.jit_dir_for(inputs.env, commit)
    except files.RefusedError as exc:
        decision.jit_problem = str(exc)
        return
    decision.jit_dir, decision.jit_build = path, jitcache.build_root_for(inputs.env)
    if by_user:
        decision.jit_mount = path
    else:
        decision.env[jitcache.JIT_DIR_ENV] = path


def decide(inputs: GuardInputs) -> Decision:
    env = inputs.env
    decision = Decision()
    decision.fatal = setting_problem(env)
    if decision.fatal:
        return decision
    level = strictness(inputs.mode, env)
    _jit_cache(decision, inputs)

    if level == "off":
        _aiter_default(decision, env, "0",
                       f"GPU check off ({REQUIRE_GPU_ENV}=0): AITER off (VLLM_ROCM_USE_AITER=0)")
        return decision

    kfd = kfd_path(env)
    if not inputs.has_kfd:
        return _problem(decision, level, (
            f"no {kfd} in the container, so no AMD GPU can be used: run it with "
            f"--device /dev/kfd --device /dev/dri (or set {REQUIRE_GPU_ENV}=0 for a CPU run)"
        ), env)

    if inputs.render_nodes is not None:
        dri = env.get(DRI_ENV) or DEFAULT_DRI
        if not inputs.render_nodes:
            return _problem(decision, level, (
                f"no render node (renderD*) under {dri} in the container: run it with "
                f"--device /dev/dri (or set {REQUIRE_GPU_ENV}=0 for a CPU run)"
            ), env)
        closed = [node for node in inputs.render_nodes if node.error]
        if closed:
            more = f" and {len(closed) - 1} more" if len(closed) > 1 else ""
            return _problem(decision, level, (
                f"cannot open the render node {closed[0].path} ({closed[0].error}){more}: the "
                f"container lacks the host's render group; {RENDER_GID_HINT}"
            ), env)

    gpus, tool, problems = find_gpus(inputs.listings)
    if not gpus:
        return _problem(decision, level, (
            f"no AMD GPU found ({'; '.join(problems)}): check that /dev/dri is passed "
            f"to the container and the amdgpu driver is loaded on the host "
            f"(or set {REQUIRE_GPU_ENV}=0 for a CPU run)"
        ), env)
    decision.gpus = gpus
    decision.log.append(f"GPUs ({tool}): {describe(gpus)}")

    if inputs.manifest is None:
        message = (inputs.manifest_error or "image manifest missing") + \
            ": the image's GPU archs cannot be checked"
        if level == "strict":
            decision.fatal = message
            return decision
        decision.log.append(f"warning: {message}")
    else:
        built = sorted({a.split(":", 1)[0].lower() for a in inputs.manifest.gpu_archs})
        missing = sorted({g.arch for g in gpus} - set(built))
        if missing:
            where = ", ".join(f"GPU {g.index}" for g in gpus if g.arch in missing)
            message = (
                f"GPU arch {';'.join(missing)} ({where}) is not among the archs this image "
                f"was built for ({';'.join(built)}): rebuild with GPU_ARCHS including "
                f"{';'.join(missing)}, or hide those GPUs with HIP_VISIBLE_DEVICES"
            )
            return _problem(decision, level, message, env)

    archs = sorted({g.arch for g in gpus})
    if set(archs) <= set(AITER_ARCHS):
        if not inputs.aiter_installed and user_aiter(env) is not False:
            message = ("the aiter package is not installed in this image; rebuild the base "
                       "image, or set VLLM_ROCM_USE_AITER=0 to serve without AITER")
            return _problem(decision, level, message, env, why="AITER off: aiter not installed")
        _aiter_default(decision, env, "1", f"AITER on for {';'.join(archs)} (VLLM_ROCM_USE_AITER=1)")
    elif len(archs) > 1:
        _aiter_default(decision, env, "0", (
            f"AITER off: mixed GPU archs {';'.join(archs)} on this host; AITER needs "
            f"{' or '.join(AITER_ARCHS)} on every GPU (choose GPUs with HIP_VISIBLE_DEVICES)"
        ))
    else:
        _aiter_default(decision, env, "0", (
            f"AITER off: {archs[0]} is not supported by AITER (needs "
            f"{' or '.join(AITER_ARCHS)}); vLLM uses its Triton attention backends"
        ))
    if user_aiter(env) is True and not set(archs) <= set(AITER_ARCHS):
        decision.log.append(
            f"warning: {USE_AITER_ENV}=1 but {';'.join(archs)} is not supported by AITER; "
            "vLLM will not use it there"
        )
    return decision


def shell_exports(variables: Mapping[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(variables.items()))


# ---------------------------------------------------------------- adapter

def run_tool(argv: Sequence[str], timeout: float = 60.0) -> Listing:
    tool = argv[0]
    if shutil.which(tool) is None:
        return Listing(tool, None, "not installed")
    proc = children.output(argv, timeout)
    if proc.error or proc.timed_out:
        return Listing(tool, None, f"failed ({proc.error or 'TimeoutExpired'})")
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return Listing(tool, None, f"exit {proc.returncode} {last[0][:120]}".strip())
    return Listing(tool, proc.stdout)


def render_nodes(env: Mapping[str, str]) -> list[RenderNode]:
    """Open each renderD* node under the DRI directory read-write, as the ROCm runtime does."""
    dri = env.get(DRI_ENV) or DEFAULT_DRI
    try:
        names = sorted(n for n in os.listdir(dri) if n.startswith("renderD"))
    except OSError:
        return []
    nodes = []
    for name in names:
        path = str(files.inside(dri, name, "a render node's name"))
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))
        except OSError as exc:
            nodes.append(RenderNode(path, exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))))
        else:
            nodes.append(RenderNode(path))
    return nodes


def gather(mode: str, env: Mapping[str, str]) -> GuardInputs:
    manifest, manifest_error = None, ""
    try:
        manifest = load_manifest(env)
    except ManifestError as exc:
        manifest_error = str(exc)
    listings: list[Listing] = []
    nodes: list[RenderNode] | None = None
    if not setting_problem(env) and strictness(mode, env) != "off":
        listings = [run_tool(["amd-smi", "static", "--asic"]), run_tool(["rocminfo"])]
        nodes = render_nodes(env)
    return GuardInputs(mode, listings, env, os.path.exists(kfd_path(env)), manifest, manifest_error,
                       aiter_installed=jitcache.aiter_prebuilt_dir() is not None, render_nodes=nodes)


def _jit_cache_problem(decision: Decision, level: str, message: str) -> None:
    """Strict: fatal. Otherwise a warning, and no AITER_JIT_DIR of the guard's."""
    if level == "strict":
        decision.fatal = message
        return
    # A directory that could not be prepared is not handed to AITER (it would fail at its
    # first JIT compile, rebuild every prebuilt module, or wait on locks of runs long gone).
    if decision.env.pop(jitcache.JIT_DIR_ENV, None) is not None:
        message += f"; {jitcache.JIT_DIR_ENV} not set (AITER uses its default, ~/.aiter/jit)"
    decision.log.append(f"warning: {message}")


def _prepare_volume_caches(decision: Decision) -> list[str]:
    """Side effect: create the other caches' folders on the volume; one that cannot be made is not exported
    (its program then uses its own default in the container: made again at each start), with a warning.
    Returns what the cache line says of each made."""
    made = []
    for name, path in decision.cache_dirs.items():
        what = jitcache.VOLUME_CACHES[name][1]
        try:
            jitcache.prepare(path, None)
            made.append(f"{what} in {path}")
        except OSError as exc:
            decision.env.pop(name, None)
            decision.log.append(f"warning: cannot create the folder of {what} {path} ({exc.strerror or exc}); "
                                f"{name} not set (its default in the container is used, made again at each start)")
    return made


def apply_jit_cache(decision: Decision, level: str) -> None:
    """Side effect: create the JIT cache directory, link the prebuilt modules into it and point
    AITER's build directory in it at this container run's own (jitcache.link_build_dir)."""
    caches = _prepare_volume_caches(decision)
    if decision.jit_problem:
        _jit_cache_problem(decision, level, decision.jit_problem)
        return
    if not decision.jit_dir:
        if caches:
            decision.log.append(f"caches: {', '.join(caches)} (no AITER in this image; mount a volume at "
                                f"{decision.jit_mount} to keep them)")
        return
    prebuilt = jitcache.aiter_prebuilt_dir()
    # AITER run from its own package directory builds in the container already.
    in_package = prebuilt is not None and Path(decision.jit_dir).resolve() == prebuilt.resolve()
    message, build = "", None
    if not in_package:
        try:
            build = jitcache.run_build_dir(decision.jit_build, jitcache.run_key())
        except files.RefusedError as exc:
            message = f"AITER's build directory: {exc}"
        except OSError as exc:
            message = (f"cannot create AITER's build directory under {decision.jit_build} "
                       f"({exc.strerror or exc}): give the container a writable /tmp, or set "
                       "TMPDIR to a writable directory of this container only")
    if not message:
        try:
            jitcache.prepare(decision.jit_dir, None)  # the directory only: nothing is linked into it
            if build is not None:  # before the modules, so a refused build/ leaves the directory as it was
                jitcache.link_build_dir(decision.jit_dir, build)
            linked = jitcache.prepare(decision.jit_dir, prebuilt)
        except files.RefusedError as exc:
            message = f"AITER's build directory: {exc}"
        except OSError as exc:
            message = (f"cannot prepare the AITER JIT cache {decision.jit_dir} "
                       f"({exc.strerror or exc}): set AITER_JIT_DIR to a writable directory")
    if message:
        _jit_cache_problem(decision, level, message)
        return
    builds = f"; AITER builds, with their lock files, in {build} (this container run's own)" if build else ""
    others = "".join(f", {made}" for made in caches)
    decision.log.append(
        f"AITER JIT cache: {decision.jit_dir} ({linked} prebuilt modules linked{others}{builds}; "
        f"mount a volume at {decision.jit_mount} to keep modules compiled at run time)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rocm_vllm_runtime.guard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("serve", "selftest", "exec"), default="serve")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    decision = decide(gather(args.mode, env))
    if decision.ok:
        apply_jit_cache(decision, strictness(args.mode, env))
    for line in decision.log:
        print(f"{LOG_PREFIX} {line}", file=sys.stderr)
    if decision.fatal:
        print(f"{LOG_PREFIX} error: {decision.fatal}", file=sys.stderr)
        return 1
    sys.stdout.write(shell_exports(decision.env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
