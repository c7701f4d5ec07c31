"""Ray cluster membership for compose.ray.yaml (run by deploy/ray/ray-node.sh, from the image's
runtime package): every node advertises what it runs as a Ray custom resource, and the head serves
only when the expected number of nodes has joined and every one of them matches the head.

  python3 -m rocm_vllm_runtime.ray_cluster identity    the resource name of this node: image content + GPUs
  python3 -m rocm_vllm_runtime.ray_cluster wait N      (head) wait until N alive nodes carry the head's
                                                       identity; a node that differs is refused with one
                                                       line, exit 1
  python3 -m rocm_vllm_runtime.ray_cluster settings    RAY_NODES and RAY_JOIN_TIMEOUT checked, printed as
                                                       one line `N S`; exit 2 with one line naming the
                                                       setting when one is no whole number >= 1

RAY_NODES (default 2) and RAY_JOIN_TIMEOUT (seconds, default 1200) are whole numbers from 1 to
MAX_SETTING (unset or empty: the default): no sign, fraction, exponent, NaN or infinity.

The identity is `rocm-vllm-<12 hex of the image's own content>-<GPU archs and count>`, e.g.
rocm-vllm-3f2a9c1b0d4e-gfx942x8; on a CPU run (ROCM_VLLM_REQUIRE_GPU=0) the GPU part is `cpu`.
The content is every layer this repository owns, not only the manifest (written below the runtime,
backend and application layers): the manifest, the installed backend (vllm_aiter_mla) and runtime
(rocm_vllm_runtime) packages, and the application files under /opt/rocm-vllm (ROCM_VLLM_APP_DIR),
each file by path and bytes (byte-code caches left out). Nodes built from different commits of
this repository differ.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from rocm_vllm_runtime import numeric

PREFIX = "rocm-vllm-"
DEFAULT_MANIFEST = "/opt/rocm-vllm/manifest.json"


def gpu_part() -> str:
    try:
        import torch
        count = torch.cuda.device_count()
        archs = sorted({torch.cuda.get_device_properties(i).gcnArchName.split(":", 1)[0] for i in range(count)})
    except Exception:  # no ROCm torch or no GPU: the guard has already decided whether that is allowed
        count, archs = 0, []
    return f"{'+'.join(archs)}x{count}" if count else "cpu"


DEFAULT_APP_DIR = "/opt/rocm-vllm"
# (setting, default, what it counts): whole numbers >= 1, read by ray-node.sh through `settings`
SETTINGS = (("RAY_NODES", 2, "nodes"), ("RAY_JOIN_TIMEOUT", 1200, "seconds"))
MAX_SETTING = 10**9


class SettingError(ValueError):
    """A setting that is no whole number >= 1; the message is one line naming it."""


def whole_number(name: str, value: str | None, default: int, unit: str) -> int:
    """value (unset: default) as a whole number from 1 to MAX_SETTING (read by the one reading of
    numbers, rocm_vllm_runtime.numeric), else SettingError."""
    if value is None or value == "":
        return default
    try:
        return numeric.whole(name, value, 1, MAX_SETTING)
    except numeric.SettingError:
        shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"
        raise SettingError(f"error: {name}={shown} is not a whole number of {unit} from 1 to {MAX_SETTING}: "
                           f"set {name} (default {default})") from None


def settings(env: Mapping[str, str]) -> dict[str, int]:
    return {name: whole_number(name, env.get(name), default, unit) for name, default, unit in SETTINGS}


OWNED_PACKAGES = ("vllm_aiter_mla", "rocm_vllm_runtime")


def owned_paths(env: Mapping[str, str]) -> list[Path]:
    """The manifest, the application folder and the installed packages this repository owns."""
    paths = [Path(env.get("ROCM_VLLM_MANIFEST") or DEFAULT_MANIFEST),
             Path(env.get("ROCM_VLLM_APP_DIR") or DEFAULT_APP_DIR)]
    for name in OWNED_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None:
            paths += [Path(p) for p in spec.submodule_search_locations or []]
    return paths


def content_digest(paths: Iterable[Path]) -> str:
    """sha256 over every regular file under paths (sorted; each file's path, within its root, and
    bytes; __pycache__ and *.pyc left out). A path that is absent counts as absent."""
    digest = hashlib.sha256()
    for root in paths:
        digest.update(f"root {root.name}\n".encode())
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
        if not root.exists():
            digest.update(b"absent\n")
        for path in files:
            rel = path.relative_to(root).as_posix() if path != root else root.name
            try:
                data = path.read_bytes()
            except OSError:
                continue
            digest.update(f"{rel} {len(data)}\n".encode())
            digest.update(data)
    return digest.hexdigest()


def identity(env: Mapping[str, str] = os.environ) -> str:
    paths = owned_paths(env)
    digest = content_digest(paths)[:12] if paths[0].is_file() else "nomanifest"
    return f"{PREFIX}{digest}-{gpu_part()}"


def check(nodes: Iterable[Mapping], expected: int, head_identity: str) -> tuple[bool, str]:
    """(ready, error) for Ray's node list: error names the first node whose identity differs."""
    alive = [n for n in nodes if n.get("Alive")]
    for node in alive:
        ids = sorted(r for r in node.get("Resources", {}) if r.startswith(PREFIX))
        if ids != [head_identity]:
            return False, (f"error: Ray node {node.get('NodeManagerAddress', '?')} runs "
                           f"{ids or 'no rocm-vllm identity'}, the head {head_identity}: "
                           "run the same SERVE_IMAGE on GPUs of the same kind on every node")
    if len(alive) > expected:
        return False, (f"error: {len(alive)} Ray nodes joined, RAY_NODES says {expected}: "
                       "set RAY_NODES to the node count")
    return len(alive) == expected, ""


def wait(expected: int, timeout: float, interval: float = 5.0, env: Mapping[str, str] = os.environ) -> int:
    import ray
    me = identity(env)
    ray.init(address="auto", logging_level="ERROR")
    deadline = time.monotonic() + timeout
    joined = 0
    while True:
        nodes = ray.nodes()
        ready, error = check(nodes, expected, me)
        if error:
            print(error, file=sys.stderr, flush=True)
            return 1
        joined = sum(1 for n in nodes if n.get("Alive"))
        if ready:
            print(f"[rocm-vllm] ray: {joined} of {expected} nodes joined, all {me}", file=sys.stderr, flush=True)
            return 0
        if time.monotonic() >= deadline:
            print(f"error: {joined} of {expected} Ray nodes joined within {timeout:.0f}s: start the workers "
                  f"(docker compose -f compose.ray.yaml --profile worker up -d) or raise RAY_JOIN_TIMEOUT",
                  file=sys.stderr, flush=True)
            return 1
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rocm_vllm_runtime.ray_cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("identity", help="this node's identity (a Ray resource name)")
    commands.add_parser("settings", help="check RAY_NODES and RAY_JOIN_TIMEOUT, print them as `N S`")
    command = commands.add_parser("wait", help="(head) wait for N nodes that carry this node's identity")
    command.add_argument("nodes", metavar="N", help="the number of nodes (a whole number >= 1)")
    args = parser.parse_args(argv)
    if args.command == "identity":
        print(identity(env))
        return 0
    try:
        if args.command == "settings":
            found = settings(env)
            print(found["RAY_NODES"], found["RAY_JOIN_TIMEOUT"])
            return 0
        expected = whole_number("RAY_NODES", args.nodes, 2, "nodes")
        return wait(expected, settings(env)["RAY_JOIN_TIMEOUT"], env=env)
    except SettingError as exc:
        print(exc, file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
