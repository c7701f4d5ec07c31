"""compose.ray.yaml (one model across hosts with Ray, Docker alone): `docker compose config`
validates each profile, the nodes get the GPU devices, groups and host network, and the node
script deploy/ray/ray-node.sh runs its head and worker paths against stand-ins for the `ray`
command, the `ray` module and the image's entrypoint (Ray itself is not in the CPU test image:
vLLM 0.32's CPU platform refuses Ray)."""
from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import compose_cli
import pytest

ROOT = Path(__file__).resolve().parents[1]
RAY_FILE = "compose.ray.yaml"
NODE_SCRIPT = ROOT / "deploy/ray/ray-node.sh"
BASE_ENV = {"RENDER_GID": "109", "RAY_HEAD_ADDRESS": "10.0.0.1"}

spec = importlib.util.spec_from_file_location("ray_cluster", ROOT / "deploy/ray/ray_cluster.py")
ray_cluster = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ray_cluster)


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


# ----------------------------------------------------------------- membership check

def node(identity, alive=True, address="10.0.0.9"):
    return {"Alive": alive, "NodeManagerAddress": address, "Resources": {"GPU": 8.0, identity: 1.0, "CPU": 64.0}}


def test_cluster_ready_only_when_every_expected_node_matches_the_head():
    me = "rocm-vllm-0123456789ab-gfx942x8"
    assert ray_cluster.check([node(me)], 2, me) == (False, "")
    assert ray_cluster.check([node(me), node(me)], 2, me) == (True, "")
    assert ray_cluster.check([node(me), node(me), node("x", alive=False)], 2, me) == (True, "")
    ready, error = ray_cluster.check([node(me), node("rocm-vllm-ffffffffffff-gfx942x8", address="10.0.0.7")], 2, me)
    assert not ready and error.startswith("error: Ray node 10.0.0.7") and "SERVE_IMAGE" in error and "\n" not in error
    ready, error = ray_cluster.check([node(me), node("rocm-vllm-0123456789ab-gfx950x8")], 2, me)
    assert not ready and "gfx950x8" in error
    ready, error = ray_cluster.check([node(me)] * 3, 2, me)
    assert not ready and "RAY_NODES" in error


def test_identity_names_the_manifest_and_the_gpus(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"vllm": {"version": "0.32.0"}}')
    a = ray_cluster.identity({"ROCM_VLLM_MANIFEST": str(manifest)})
    manifest.write_text('{"vllm": {"version": "0.32.1"}}')
    b = ray_cluster.identity({"ROCM_VLLM_MANIFEST": str(manifest)})
    assert a.startswith("rocm-vllm-") and a != b and a.endswith("-cpu")


def test_identity_covers_every_owned_layer_not_only_the_manifest(tmp_path):
    """The manifest sits below the runtime, backend and application layers: two images of different
    commits of this repository can share it. Their identities must differ all the same."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"vllm": {"version": "0.33.0"}}')
    app = tmp_path / "app"
    (app / "ci" / "suites").mkdir(parents=True)
    (app / "ci" / "suites" / "test_smoke.py").write_text("x = 1\n")
    env = {"ROCM_VLLM_MANIFEST": str(manifest), "ROCM_VLLM_APP_DIR": str(app)}
    before = ray_cluster.identity(env)
    (app / "ci" / "suites" / "__pycache__").mkdir()
    (app / "ci" / "suites" / "__pycache__" / "test_smoke.cpython-312.pyc").write_bytes(b"cache")
    assert ray_cluster.identity(env) == before  # byte-code caches are not content
    (app / "ci" / "suites" / "test_smoke.py").write_text("x = 2\n")
    assert ray_cluster.identity(env) != before
    # the installed backend and runtime packages count: a changed file of a package changes the digest
    package = tmp_path / "vllm_aiter_mla"
    package.mkdir()
    (package / "backend.py").write_text("a\n")
    one = ray_cluster.content_digest([manifest, package])
    (package / "backend.py").write_text("b\n")
    assert ray_cluster.content_digest([manifest, package]) != one
    owned = ray_cluster.owned_paths(env)
    assert {p.name for p in owned[2:]} == set(ray_cluster.OWNED_PACKAGES)  # found where they are installed


# ----------------------------------------------------------------- the node script, with stand-ins

def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture()
def stand_ins(tmp_path):
    """PATH with a `ray` command that records its arguments, a `ray` module whose nodes() come from
    FAKE_RAY_NODES, a python3 that is this interpreter, and an entrypoint that prints its argv."""
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
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path / "py"),
           "ROCM_VLLM_ENTRYPOINT": str(entry), "ROCM_VLLM_MANIFEST": str(manifest),
           "RAY_HEAD_ADDRESS": "10.0.0.1", "RAY_JOIN_TIMEOUT": "1", "HOME": str(tmp_path)}
    # the identity as the node script computes it: the same python3, the same environment
    me = subprocess.run([bin_dir / "python3", ROOT / "deploy/ray/ray_cluster.py", "identity"], env=env,
                        capture_output=True, text=True, check=True).stdout.strip()
    return env, log, me


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


def test_counts_take_their_defaults_when_unset_or_empty_and_wait_checks_its_argument(stand_ins):
    env, log, me = stand_ins
    assert ray_cluster.settings({}) == {"RAY_NODES": 2, "RAY_JOIN_TIMEOUT": 1200}
    assert ray_cluster.settings({"RAY_NODES": "", "RAY_JOIN_TIMEOUT": "30"}) == {"RAY_NODES": 2, "RAY_JOIN_TIMEOUT": 30}
    proc = subprocess.run([sys.executable, ROOT / "deploy/ray/ray_cluster.py", "wait", "two"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: RAY_NODES='two' is not a whole number"), proc.stderr
    proc = subprocess.run([sys.executable, ROOT / "deploy/ray/ray_cluster.py", "wait", "2"],
                          env={**env, "RAY_JOIN_TIMEOUT": "inf"}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: RAY_JOIN_TIMEOUT='inf'"), proc.stderr
