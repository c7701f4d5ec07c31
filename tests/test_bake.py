"""docker-bake.hcl: `docker buildx bake --print` resolves and agrees with versions.json."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ci.pins import model

ROOT = Path(__file__).resolve().parents[1]


def bake_print(*targets, env=None, files=("docker-bake.hcl", "versions.json")):
    if not shutil.which("docker"):
        pytest.skip("no docker client in PATH")
    if subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker buildx plugin not found (see ci/test-machine/docker-engine.sh env: DOCKER_CONFIG)")
    cmd = ["docker", "buildx", "bake", "--print"]
    for f in files:
        cmd += ["-f", f]
    proc = subprocess.run(cmd + list(targets), cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    return proc


def printed(*targets, env=None):
    proc = bake_print(*targets, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["target"]


def test_base_args_equal_versions_file():
    data = model.load()
    args = printed("base")["base"]["args"]
    expected = model.build_args(data)
    for key, value in expected.items():
        assert args[key] == value, key
    assert args["SOURCE_DATE_EPOCH"] == str(data["source_date_epoch"])


def test_base_target_settings():
    base = printed("base")["base"]
    assert base["dockerfile"] == "Dockerfile.rocm_base" and base["target"] == "final"
    assert any("rewrite-timestamp=true" in o for o in base["output"])
    assert any(s.startswith("id=ca-bundle") for s in base["secret"])


def test_overrides_from_environment():
    args = printed("base", env={"GPU_ARCHS": "gfx942", "AITER_PIN": "v0.1.20.post1",
                                "ALLOW_UNRESOLVED": "1"})["base"]["args"]
    data = model.load()
    known = data["aiter"]["pins"]["v0.1.20.post1"]
    assert args["GPU_ARCHS"] == "gfx942"
    assert args["AITER_COMMIT"] == known["commit"] and args["AITER_CK_COMMIT"] == known["ck_commit"]
    assert args["ROCM_IMAGE"] == model.build_args(data, allow_unresolved=True)["ROCM_IMAGE"]


def test_cache_settings_overridable():
    base = printed("base", env={"CACHE_FROM": "type=registry,ref=r/x:cache",
                                "CACHE_TO": "type=registry,ref=r/x:cache,mode=max"})["base"]
    assert base["cache-from"] == ["type=registry,ref=r/x:cache"]
    assert base["cache-to"] == ["type=registry,ref=r/x:cache,mode=max"]


def test_validate_group_resolves():
    targets = printed("validate")
    assert targets and all(t["dockerfile"] == "Dockerfile.rocm_base" for t in targets.values())


def test_fails_loudly_without_versions_file():
    proc = bake_print("base", files=("docker-bake.hcl",))
    assert proc.returncode != 0
    assert "variable" in proc.stderr.lower()


def test_unknown_aiter_pin_fails():
    proc = bake_print("base", env={"AITER_PIN": "v0.0.0"})
    assert proc.returncode != 0


def test_image_targets_use_dockerfile_rocm():
    targets = printed("vllm", "serve", "ci")
    for name in ("vllm", "serve", "ci"):
        assert targets[name]["dockerfile"] == "Dockerfile.rocm"
        assert targets[name]["target"] == name
        assert targets[name]["contexts"]["base"] == "target:base"
        assert targets[name]["args"]["VLLM_COMMIT"] == model.build_args(model.load())["VLLM_COMMIT"]


def test_ray_comes_from_its_lock_not_from_build_args():
    """Ray is installed from ci/docker/requirements-ray.txt (a lock), so no target passes Ray
    versions or hashes as build args."""
    proc = bake_print("serve", "ci")
    assert proc.returncode == 0, proc.stderr
    for target in json.loads(proc.stdout)["target"].values():
        assert not [a for a in target["args"] if a.startswith("RAY_")], target["args"]
