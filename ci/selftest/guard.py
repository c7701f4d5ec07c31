"""Runtime guard: decide, before any GPU code runs, whether and how this image may start.

Functional core: `decide(GuardInputs) -> Decision` (pure). The adapter `main()`
gathers the inputs (runs `amd-smi` and `rocminfo`, reads the manifest and the
environment, checks the KFD device node), prepares the AITER JIT cache
directory and prints the decided variables as shell `export` lines for
`entrypoint.sh` to evaluate. Log lines go to stderr, one line each; a fatal
decision prints one `error:` line and exits 1.

Settings (environment):
  ROCM_VLLM_MANIFEST     image manifest (default /opt/rocm-vllm/manifest.json)
  ROCM_VLLM_REQUIRE_GPU  1: every mode needs a usable GPU; 0: skip the GPU check
                         (CPU runs); unset: only `serve` needs one
  ROCM_VLLM_KFD_PATH     the ROCm compute device node (default /dev/kfd)
  ROCM_VLLM_JIT_CACHE    mount point of the AITER JIT cache (default /var/cache/aiter-jit)
  AITER_JIT_DIR          used as given when set
  VLLM_ROCM_USE_AITER    used as given when set; else 1 on gfx942/gfx950, 0 elsewhere
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from selftest import jitcache
from selftest.devices import Gpu, parse_listing
from selftest.manifest import Manifest, ManifestError, load_manifest

AITER_ARCHS = ("gfx942", "gfx950")
REQUIRE_GPU_ENV = "ROCM_VLLM_REQUIRE_GPU"
KFD_ENV = "ROCM_VLLM_KFD_PATH"
DEFAULT_KFD = "/dev/kfd"
USE_AITER_ENV = "VLLM_ROCM_USE_AITER"
LOG_PREFIX = "[rocm-vllm]"


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


@dataclass
class Decision:
    env: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    fatal: str = ""
    gpus: list[Gpu] = field(default_factory=list)
    jit_dir: str = ""
    jit_mount: str = ""  # where a volume keeps the JIT cache

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


def strictness(mode: str, env: Mapping[str, str]) -> str:
    """'strict' (problems are fatal), 'warn' (problems are logged) or 'off'."""
    value = env.get(REQUIRE_GPU_ENV, "").strip()
    if value == "0":
        return "off"
    if value == "1" or mode == "serve":
        return "strict"
    return "warn"


def describe(gpus: Sequence[Gpu]) -> str:
    counts: dict[str, int] = {}
    for gpu in gpus:
        label = gpu.target + (f" ({gpu.name})" if gpu.name else "")
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{n} x {label}" for label, n in counts.items())


def _aiter_default(decision: Decision, env: Mapping[str, str], value: str, why: str) -> None:
    if env.get(USE_AITER_ENV, "") != "":
        decision.log.append(f"{USE_AITER_ENV}={env[USE_AITER_ENV]} set by the user: kept")
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
    if not inputs.aiter_installed:
        return
    commit = inputs.manifest.aiter_commit if inputs.manifest else ""
    path, by_user = jitcache.jit_dir_for(inputs.env, commit)
    decision.jit_dir = path
    decision.jit_mount = path if by_user else (
        inputs.env.get(jitcache.CACHE_ROOT_ENV) or jitcache.DEFAULT_CACHE_ROOT)
    if not by_user:
        decision.env[jitcache.JIT_DIR_ENV] = path


def decide(inputs: GuardInputs) -> Decision:
    env = inputs.env
    decision = Decision()
    level = strictness(inputs.mode, env)
    _jit_cache(decision, inputs)

    if level == "off":
        _aiter_default(decision, env, "0",
                       f"GPU check off ({REQUIRE_GPU_ENV}=0): AITER off (VLLM_ROCM_USE_AITER=0)")
        return decision

    kfd = env.get(KFD_ENV) or DEFAULT_KFD
    if not inputs.has_kfd:
        return _problem(decision, level, (
            f"no {kfd} in the container, so no AMD GPU can be used: run it with "
            f"--device /dev/kfd --device /dev/dri (or set {REQUIRE_GPU_ENV}=0 for a CPU run)"
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
        if not inputs.aiter_installed and env.get(USE_AITER_ENV, "") != "0":
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
    if env.get(USE_AITER_ENV) == "1" and not set(archs) <= set(AITER_ARCHS):
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
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Listing(tool, None, f"failed ({exc.__class__.__name__})")
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return Listing(tool, None, f"exit {proc.returncode} {last[0][:120]}".strip())
    return Listing(tool, proc.stdout)


def gather(mode: str, env: Mapping[str, str]) -> GuardInputs:
    manifest, manifest_error = None, ""
    try:
        manifest = load_manifest(env)
    except ManifestError as exc:
        manifest_error = str(exc)
    listings: list[Listing] = []
    if strictness(mode, env) != "off":
        listings = [run_tool(["amd-smi", "static", "--asic"]), run_tool(["rocminfo"])]
    return GuardInputs(
        mode=mode,
        listings=listings,
        env=env,
        has_kfd=os.path.exists(env.get(KFD_ENV) or DEFAULT_KFD),
        manifest=manifest,
        manifest_error=manifest_error,
        aiter_installed=jitcache.aiter_prebuilt_dir() is not None,
    )


def apply_jit_cache(decision: Decision, level: str) -> None:
    """Side effect: create the JIT cache directory and link the prebuilt modules."""
    if not decision.jit_dir:
        return
    try:
        linked = jitcache.prepare(decision.jit_dir, jitcache.aiter_prebuilt_dir())
    except OSError as exc:
        message = (f"cannot prepare the AITER JIT cache {decision.jit_dir} "
                   f"({exc.strerror or exc}): set AITER_JIT_DIR to a writable directory")
        if level == "strict":
            decision.fatal = message
        else:
            decision.log.append(f"warning: {message}")
        return
    decision.log.append(
        f"AITER JIT cache: {decision.jit_dir} ({linked} prebuilt modules linked; mount a "
        f"volume at {decision.jit_mount} to keep modules compiled at run time)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m selftest.guard", description=__doc__,
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
