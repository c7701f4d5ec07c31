"""compose.ray.yaml (one model across hosts with Ray, Docker alone): `docker compose config`
validates each profile, the nodes get the GPU devices, groups and host network, and the node
script deploy/ray/ray-node.sh runs its head and worker paths against stand-ins for the `ray`
command, the `ray` module and the image's entrypoint (tests/ray_stand_ins.py; Ray itself is not in
the CPU test image: vLLM 0.32's CPU platform refuses Ray). The script's membership checks are the
image's rocm_vllm_runtime.ray_cluster (the checkout's, on PYTHONPATH), tested on its own in
runtime/tests/test_ray_cluster.py."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import compose_cli
import pytest
import ray_stand_ins
from ray_stand_ins import node

ROOT = Path(__file__).resolve().parents[1]
RAY_FILE = "compose.ray.yaml"
NODE_SCRIPT = ROOT / "deploy/ray/ray-node.sh"
BASE_ENV = {"RENDER_GID": "109", "RAY_HEAD_ADDRESS": "10.0.0.1"}


def compose_config(*profiles, env=None, check=True, files=(RAY_FILE,)):
    return compose_cli.compose_config(files, profiles, env=env, check=check)


# ----------------------------------------------------------------- docker compose config

def test_profiles_select_head_and_worker():
    assert compose_config(env=BASE_ENV)["services"] == {}
    assert set(compose_config("head", env=BASE_ENV)["services"]) == {"ray-head"}
    assert set(compose_config("worker", env=BASE_ENV)["services"]) == {"ray-worker"}


def test_nodes_run_the_serve_image_with_gpus_on_the_host_network():
    services = compose_config("head", "worker", env=BASE_ENV)["services"]
    serve_image = compose_config(env={"RENDER_GID": "109"}, files=("compose.yaml",))["services"]["vllm"]["image"]
    for name, role in (("ray-head", "head"), ("ray-worker", "worker")):
        node = services[name]
        assert node["image"] == serve_image
        assert node["network_mode"] == "host"
        assert {d["source"] for d in node["devices"]} == {"/dev/kfd", "/dev/dri"}
        assert node["group_add"] == ["video", "109"]
        assert node["ipc"] == "host" and "seccomp=unconfined" in node["security_opt"]
        assert node["command"] == ["bash", "/opt/rocm-vllm-deploy/ray/ray-node.sh", role]
        env = node["environment"]
        assert env["ROCM_VLLM_REQUIRE_GPU"] == "1", "the guard must check the GPUs on every node"
        assert env["RAY_HEAD_ADDRESS"] == "10.0.0.1" and env["RAY_NODES"] == "2"
        mounts = {v["target"]: v for v in node["volumes"]}
        assert mounts["/opt/rocm-vllm-deploy/ray"]["source"] == str(ROOT / "deploy/ray")
        assert mounts["/opt/rocm-vllm-deploy/ray"]["read_only"] is True
        assert {"/root/.cache/huggingface", "/var/cache/aiter-jit"} <= set(mounts)


def test_head_serves_the_tiny_model_behind_a_health_check():
    head = compose_config("head", env=BASE_ENV)["services"]["ray-head"]
    env = head["environment"]
    assert env["SERVE_MODEL"] == "" and env["SERVE_TENSOR_PARALLEL_SIZE"] == "1"
    assert env["SERVE_HOST"] == "127.0.0.1" and env["VLLM_API_KEY"] == ""
    # the image's probe with one generated token: a lost node shows without other traffic
    assert head["healthcheck"]["test"][:5] == ["CMD", "python3", "-m", "rocm_vllm_runtime.health", "--generate"]
    assert head["healthcheck"]["start_period"] == "30m0s"
    env = compose_config("head", env={**BASE_ENV, "RAY_NODES": "4", "SERVE_TENSOR_PARALLEL_SIZE": "8",
                                      "SERVE_MODEL": "deepseek-ai/DeepSeek-R1"})["services"]["ray-head"]["environment"]
    assert (env["RAY_NODES"], env["SERVE_TENSOR_PARALLEL_SIZE"], env["SERVE_MODEL"]) == \
        ("4", "8", "deepseek-ai/DeepSeek-R1")


@pytest.mark.parametrize("missing", ["RAY_HEAD_ADDRESS", "RENDER_GID"])
def test_required_settings_are_named(missing):
    env = {k: v for k, v in BASE_ENV.items() if k != missing}
    proc = compose_config("head", env=env, check=False)
    assert proc.returncode != 0 and missing in proc.stderr, proc.stderr


# ----------------------------------------------------------------- the node script, with stand-ins

@pytest.fixture()
def stand_ins(tmp_path):
    """tests/ray_stand_ins.py's stand-ins, with the settings compose.ray.yaml gives (the entrypoint
    through ROCM_VLLM_ENTRYPOINT, a join timeout of 1 s): (env, the `ray` calls' log, the identity)."""
    found = ray_stand_ins.stand_ins(tmp_path)
    env = {**found.env, "ROCM_VLLM_ENTRYPOINT": str(found.entrypoint), "RAY_HEAD_ADDRESS": "10.0.0.1",
           "RAY_JOIN_TIMEOUT": "1"}
    return env, found.log, found.me


def test_node_script_runs_the_images_membership_module():
    """The mounted deploy/ray holds the node script only: settings, identity and wait are the image's
    module, the one the LeaderWorkerSet runs too."""
    script = NODE_SCRIPT.read_text()
    for command in ("settings", "identity", 'wait "$nodes"'):
        assert f"python3 -m rocm_vllm_runtime.ray_cluster {command}" in script, command
    assert not list(NODE_SCRIPT.parent.glob("*.py"))


def run_node(role, env, timeout=120):
    return subprocess.run(["bash", str(NODE_SCRIPT), role], capture_output=True, text=True, env=env, timeout=timeout)


def test_head_starts_ray_waits_for_matching_nodes_then_serves_with_the_ray_executor(stand_ins):
    env, log, me = stand_ins
    env = {**env, "FAKE_RAY_NODES": json.dumps([node(me, address="10.0.0.1"), node(me, address="10.0.0.2")])}
    proc = run_node("head", env)
    assert proc.returncode == 0, proc.stderr
    (start,) = log.read_text().splitlines()
    assert start.startswith("start --head --port=6379") and f'{{"{me}": 1}}' in start and "--num-gpus=8" in start
    assert proc.stdout.strip() == ("ENTRYPOINT serve --distributed-executor-backend ray --pipeline-parallel-size 2")


def test_head_refuses_a_node_that_differs_and_a_cluster_that_never_fills(stand_ins):
    env, log, me = stand_ins
    other = "rocm-vllm-ffffffffffff-gfx90ax8"
    proc = run_node("head", {**env, "FAKE_RAY_NODES": json.dumps([node(me), node(other, address="10.0.0.5")])})
    assert proc.returncode == 1 and "ENTRYPOINT" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("error: Ray node 10.0.0.5 runs ['rocm-vllm-ffffffffffff")
    proc = run_node("head", {**env, "FAKE_RAY_NODES": json.dumps([node(me)])})
    assert proc.returncode == 1, proc.stderr
    assert "1 of 2 Ray nodes joined within 1s" in proc.stderr and "RAY_JOIN_TIMEOUT" in proc.stderr


def test_worker_joins_the_head_and_exits_when_it_is_gone(stand_ins):
    env, log, me = stand_ins
    proc = run_node("worker", {k: v for k, v in env.items()})
    assert proc.returncode == 1 and "RAY_NODE_ADDRESS" in proc.stderr
    proc = run_node("worker", {**env, "RAY_NODE_ADDRESS": "10.0.0.2"})
    assert proc.returncode == 1 and proc.stderr.strip().endswith("error: lost the Ray head 10.0.0.1:6379")
    start, status = log.read_text().splitlines()
    assert start.startswith("start --address=10.0.0.1:6379") and "--node-ip-address=10.0.0.2" in start
    assert me in start and status == "status --address=10.0.0.1:6379"


BAD_COUNTS = ("abc", "0", "-1", "nan", "NaN", "inf", "-inf", "1e3", "1.5", "2.0", " 2", "0x10", "\u0662",
              "99999999999", "++2", "9" * 5000)


@pytest.mark.parametrize("value", BAD_COUNTS)
@pytest.mark.parametrize("setting", ("RAY_NODES", "RAY_JOIN_TIMEOUT"))
@pytest.mark.parametrize("role", ("head", "worker"))
def test_node_script_refuses_a_count_that_is_no_whole_number(stand_ins, role, setting, value):
    """Before Ray starts, in one line naming the setting, exit 2 (no traceback; bash arithmetic
    would read `abc` as 0 and Python's float() takes nan and inf)."""
    env, log, me = stand_ins
    proc = run_node(role, {**env, "RAY_NODE_ADDRESS": "10.0.0.2", setting: value,
                           "FAKE_RAY_NODES": json.dumps([node(me), node(me)])})
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith(f"error: {setting}={value[:40]!r}"), proc.stderr  # a long value cut short
    assert " is not a whole number of " in proc.stderr and proc.stderr.count("\n") == 1 and \
        "Traceback" not in proc.stderr, proc.stderr
    assert not log.exists() and "ENTRYPOINT" not in proc.stdout
