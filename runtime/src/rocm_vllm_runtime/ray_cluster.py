"""Ray cluster membership for the two multi-host deployments: compose.ray.yaml (through
deploy/ray/ray-node.sh) and the Kubernetes LeaderWorkerSet (deploy/kubernetes/overlays/multinode).
Every node advertises what it runs as a Ray custom resource, and the head serves only when the
expected number of nodes has joined and every one of them matches the head.

  python3 -m rocm_vllm_runtime.ray_cluster identity    the resource name of this node: image content + GPUs
  python3 -m rocm_vllm_runtime.ray_cluster wait N      (head) wait until N alive nodes carry the head's
                                                       identity; a node that differs is refused with one
                                                       line, exit 1
  python3 -m rocm_vllm_runtime.ray_cluster settings    RAY_NODES and RAY_JOIN_TIMEOUT checked, printed as
                                                       one line `N S`; exit 2 with one line naming the
                                                       setting when one is no whole number >= 1

RAY_NODES (default 2) and RAY_JOIN_TIMEOUT (seconds, default 1200) are whole numbers from 1 to
MAX_SETTING (unset or empty: the default): no sign, fraction, exponent, NaN or infinity.

`--lws` (settings, wait): the LeaderWorkerSet's names. The node count is LWS_GROUP_SIZE, which its
controller sets in every pod of a group (required, no default), and the errors say what to do in a
group (read the worker pods' logs), not in compose.

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
from typing import NamedTuple

from rocm_vllm_runtime import numeric

PREFIX = "rocm-vllm-"
DEFAULT_MANIFEST = "/opt/rocm-vllm/manifest.json"
DEFAULT_APP_DIR = "/opt/rocm-vllm"
OWNED_PACKAGES = ("vllm_aiter_mla", "rocm_vllm_runtime")
# (setting, default (None: required), what it counts): whole numbers >= 1, read through `settings`
SETTINGS = (("RAY_NODES", 2, "nodes"), ("RAY_JOIN_TIMEOUT", 1200, "seconds"))
LWS_SETTINGS = (("LWS_GROUP_SIZE", None, "nodes"), SETTINGS[1])
MAX_SETTING = 10**9


class Deployment(NamedTuple):
    """What a deployment calls its settings, and what its errors tell the user to do."""
    settings: tuple[tuple[str, int | None, str], ...]  # the node count first, then RAY_JOIN_TIMEOUT
    missing: str  # nodes that have not joined within RAY_JOIN_TIMEOUT
    differs: str  # a node that runs something other than the head
    extra: str    # more nodes than the count


COMPOSE = Deployment(
    SETTINGS,
    "start the workers (docker compose -f compose.ray.yaml --profile worker up -d) or raise RAY_JOIN_TIMEOUT",
    "run the same SERVE_IMAGE on GPUs of the same kind on every node",
    "set RAY_NODES to the node count")
LWS = Deployment(
    LWS_SETTINGS,
    "read the worker pods' logs, or raise RAY_JOIN_TIMEOUT",
    "run one image on GPUs of the same kind in the leader's and the workers' pods",
    "join only this group's workers to its head (LWS_LEADER_ADDRESS)")


class SettingError(ValueError):
    """A setting that is no whole number >= 1; the message is one line naming it."""


def whole_number(name: str, value: str | None, default: int | None, unit: str) -> int:
    """value (unset or empty: default) as a whole number from 1 to MAX_SETTING (read by the one
    reading of numbers, rocm_vllm_runtime.numeric), else SettingError. A default of None: required."""
    if (value is None or value == "") and default is not None:
        return default
    value = value or ""
    try:
        return numeric.whole(name, value, 1, MAX_SETTING)
    except numeric.SettingError:
        shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"
        fix = f"set {name} (default {default})" if default is not None else f"set {name}"
        raise SettingError(f"error: {name}={shown} is not a whole number of {unit} from 1 to {MAX_SETTING}: "
                           f"{fix}") from None


def settings(env: Mapping[str, str], deployment: Deployment = COMPOSE) -> dict[str, int]:
    return {name: whole_number(name, env.get(name), default, unit) for name, default, unit in deployment.settings}


def gpu_part() -> str:
    try:
        import torch
        count = torch.cuda.device_count()
        archs = sorted({torch.cuda.get_device_properties(i).gcnArchName.split(":", 1)[0] for i in range(count)})
    except Exception:  # no ROCm torch or no GPU: the guard has already decided whether that is allowed
        count, archs = 0, []
    return f"{'+'.join(archs)}x{count}" if count else "cpu"


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


def check(nodes: Iterable[Mapping], expected: int, head_identity: str,
          deployment: Deployment = COMPOSE) -> tuple[bool, str]:
    """(ready, error) for Ray's node list: error names the first node whose identity differs."""
    alive = [n for n in nodes if n.get("Alive")]
    for node in alive:
        ids = sorted(r for r in node.get("Resources", {}) if r.startswith(PREFIX))
        if ids != [head_identity]:
            return False, (f"error: Ray node {node.get('NodeManagerAddress', '?')} runs "
                           f"{ids or 'no rocm-vllm identity'}, the head {head_identity}: {deployment.differs}")
    if len(alive) > expected:
        return False, (f"error: {len(alive)} Ray nodes joined, {deployment.settings[0][0]} says {expected}: "
                       f"{deployment.extra}")
    return len(alive) == expected, ""


def wait(expected: int, timeout: float, interval: float = 5.0, deployment: Deployment = COMPOSE,
         env: Mapping[str, str] = os.environ) -> int:
    import ray
    me = identity(env)
    ray.init(address="auto", logging_level="ERROR")
    deadline = time.monotonic() + timeout
    while True:
        nodes = ray.nodes()
        ready, error = check(nodes, expected, me, deployment)
        if error:
            print(error, file=sys.stderr, flush=True)
            return 1
        joined = sum(1 for n in nodes if n.get("Alive"))
        if ready:
            print(f"[rocm-vllm] ray: {joined} of {expected} nodes joined, all {me}", file=sys.stderr, flush=True)
            return 0
        if time.monotonic() >= deadline:
            print(f"error: {joined} of {expected} Ray nodes joined within {timeout:.0f}s: {deployment.missing}",
                  file=sys.stderr, flush=True)
            return 1
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rocm_vllm_runtime.ray_cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("identity", help="this node's identity (a Ray resource name)")
    for name, what in (("settings", "check the node count and RAY_JOIN_TIMEOUT, print them as `N S`"),
                       ("wait", "(head) wait for N nodes that carry this node's identity")):
        command = commands.add_parser(name, help=what)
        command.add_argument("--lws", action="store_true",
                             help="the LeaderWorkerSet's names: LWS_GROUP_SIZE, its pods' logs")
        if name == "wait":
            command.add_argument("nodes", metavar="N", help="the number of nodes (a whole number >= 1)")
    args = parser.parse_args(argv)
    if args.command == "identity":
        print(identity(env))
        return 0
    deployment = LWS if args.lws else COMPOSE
    count_name, count_default, count_unit = deployment.settings[0]
    try:
        if args.command == "settings":
            found = settings(env, deployment)
            print(found[count_name], found["RAY_JOIN_TIMEOUT"])
            return 0
        expected = whole_number(count_name, args.nodes, count_default, count_unit)
        name, default, unit = deployment.settings[1]  # RAY_JOIN_TIMEOUT (N is the argument)
        return wait(expected, whole_number(name, env.get(name), default, unit), deployment=deployment, env=env)
    except SettingError as exc:
        print(exc, file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
