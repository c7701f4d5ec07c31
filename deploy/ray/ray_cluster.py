"""Ray cluster membership for compose.ray.yaml: every node advertises what it runs as a Ray custom
resource, and the head serves only when the expected number of nodes has joined and every one of
them matches the head.

  python3 ray_cluster.py identity        the resource name of this node: image manifest + GPUs
  python3 ray_cluster.py wait N          (head) wait until N alive nodes carry the head's identity;
                                         a node that differs is refused with one line, exit 1

The identity is `rocm-vllm-<12 hex of the image manifest's sha256>-<GPU archs and count>`, e.g.
rocm-vllm-3f2a9c1b0d4e-gfx942x8; on a CPU run (ROCM_VLLM_REQUIRE_GPU=0) the GPU part is `cpu`.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterable, Mapping

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


def identity(env: Mapping[str, str] = os.environ) -> str:
    path = env.get("ROCM_VLLM_MANIFEST") or DEFAULT_MANIFEST
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
    except OSError:
        digest = "nomanifest"
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


def wait(expected: int, timeout: float, interval: float = 5.0) -> int:
    import ray
    me = identity()
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
        time.sleep(interval)


def main(argv: list[str]) -> int:
    if argv[:1] == ["identity"]:
        print(identity())
        return 0
    if argv[:1] == ["wait"] and len(argv) == 2:
        return wait(int(argv[1]), float(os.environ.get("RAY_JOIN_TIMEOUT") or 1200))
    print("usage: ray_cluster.py identity | wait N", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
