"""Stand-ins for what a Ray node's script runs, shared by the tests of compose.ray.yaml's node script
(deploy/ray/ray-node.sh) and of the LeaderWorkerSet's leader and worker (tests/test_kubernetes.py).
Ray itself is not in the CPU test image: vLLM 0.32's CPU platform refuses Ray.

* `ray`, a command that records its arguments, one line per call; `ray status` fails (the head is
  gone), every other call succeeds;
* a `ray` module whose init() does nothing and whose nodes() come from FAKE_RAY_NODES (JSON);
* `python3`, this interpreter, with the checkout's runtime package (rocm_vllm_runtime.ray_cluster)
  first on PYTHONPATH;
* an entrypoint that prints `ENTRYPOINT` and its argv, and an empty image manifest."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_SRC = ROOT / "runtime/src"


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@dataclass(frozen=True)
class StandIns:
    env: dict[str, str]  # PATH, PYTHONPATH, ROCM_VLLM_MANIFEST, HOME
    log: Path  # the `ray` command's calls
    entrypoint: Path
    me: str  # this node's identity, as the scripts compute it: the same python3, the same environment


def stand_ins(tmp_path: Path) -> StandIns:
    bin_dir, py_dir = tmp_path / "bin", tmp_path / "py" / "ray"
    bin_dir.mkdir()
    py_dir.mkdir(parents=True)
    log = tmp_path / "ray-calls.txt"
    executable(bin_dir / "ray", f'#!/bin/sh\necho "$*" >> {log}\n'
                                '[ "$1" = status ] && exit 1\nexit 0\n')
    (bin_dir / "python3").symlink_to(sys.executable)
    (py_dir / "__init__.py").write_text("import json, os\n\ndef init(**kwargs):\n    pass\n\n"
                                        "def nodes():\n    return json.loads(os.environ['FAKE_RAY_NODES'])\n")
    entry = executable(tmp_path / "entrypoint.sh", '#!/bin/sh\necho "ENTRYPOINT $*"\n')
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": f"{RUNTIME_SRC}:{tmp_path / 'py'}",
           "ROCM_VLLM_MANIFEST": str(manifest), "HOME": str(tmp_path)}
    me = subprocess.run([bin_dir / "python3", "-m", "rocm_vllm_runtime.ray_cluster", "identity"], env=env,
                        capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    return StandIns(env, log, entry, me)


def node(identity: str, alive: bool = True, address: str = "10.0.0.9") -> dict:
    """One entry of ray.nodes(): a node that advertises identity as a resource."""
    return {"Alive": alive, "NodeManagerAddress": address, "Resources": {"GPU": 8.0, identity: 1.0, "CPU": 64.0}}
