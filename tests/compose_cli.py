"""`docker compose config` as the compose tests run it: only the files named, no .env of a
developer, no variables of the calling shell but the Docker client's own."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLIENT_ENV = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT")


def compose_config(files: Sequence[str], profiles: Sequence[str] = (), env: dict | None = None,
                   check: bool = True):
    """The resolved configuration as JSON (check) or the finished process (check=False)."""
    if not shutil.which("docker"):
        pytest.skip("no docker client in PATH")
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker compose plugin not found "
                    "(eval \"$(bash ci/test-machine/docker-engine.sh env)\" sets DOCKER_CONFIG)")
    cmd = ["docker", "compose", "--project-directory", str(ROOT)]
    for f in files:
        cmd += ["-f", str(ROOT / f)]
    for p in profiles:
        cmd += ["--profile", p]
    clean = {k: v for k, v in os.environ.items() if k in CLIENT_ENV}
    proc = subprocess.run(cmd + ["--env-file", os.devnull, "config", "--format", "json"],
                          capture_output=True, text=True, env={**clean, **(env or {})})
    if not check:
        return proc
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
