"""compose.yaml and the CPU overrides (compose.cpu.yaml, tests/compose.cpu.yaml): `docker compose
config` validates them, and the settings that make a ROCm server work (devices, groups,
healthcheck, port binding) and a CPU one work are there."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import compose_cli
import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_OVERRIDE = "compose.cpu.yaml"
TESTS_CPU_OVERRIDE = "tests/compose.cpu.yaml"
BASE_ENV = {"RENDER_GID": "109"}
SERVE_USER = "1000:1000"  # the serve image's non-root user (Dockerfile.rocm, serve-files/serve-base)


def compose_config(*files, env=None, check=True, profiles=()):
    return compose_cli.compose_config(files or ("compose.yaml",), profiles, env=env, check=check)


def test_validates_with_defaults():
    cfg = compose_config(env=BASE_ENV)
    assert set(cfg["services"]) == {"vllm"}  # selftest only under its profile


def test_rocm_devices_groups_and_runtime_settings():
    vllm = compose_config(env=BASE_ENV)["services"]["vllm"]
    assert {d["source"] for d in vllm["devices"]} == {"/dev/kfd", "/dev/dri"}
    assert vllm["group_add"] == ["video", "109"]
    assert vllm["ipc"] == "host"
    assert int(vllm["shm_size"]) >= 8 * 2**30
    assert vllm["image"].endswith("/serve:dev")
    assert vllm["command"] == ["serve"]


def test_server_runs_unprivileged_as_the_images_serve_user():
    """The server: the image's non-root user, the video and render groups, no seccomp or ptrace
    exceptions; those stay with the self-test service."""
    cfg = compose_config(env=BASE_ENV)
    vllm = cfg["services"]["vllm"]
    assert vllm["user"] == SERVE_USER
    assert vllm["group_add"] == ["video", "109"]
    assert not vllm.get("security_opt") and not vllm.get("cap_add") and not vllm.get("privileged")
    selftest = compose_config(env=BASE_ENV, profiles=("selftest",))["services"]["selftest"]
    assert "seccomp=unconfined" in selftest["security_opt"] and "SYS_PTRACE" in selftest["cap_add"]


def test_serve_user_owns_the_cache_mount_points_in_the_image():
    """compose's user is the one serve-base sets, and the image stages the mount points of both
    cache volumes owned by it (a fresh named volume takes the mount point's owner)."""
    text = (ROOT / "Dockerfile.rocm").read_text()
    serve_base = text[text.index("FROM vllm AS serve-base"):text.index("FROM serve-base AS serve\n")]
    assert re.search(rf"^USER {re.escape(SERVE_USER)}$", serve_base, re.M), "serve-base: USER"
    files = text[text.index("FROM vllm AS serve-files"):text.index("FROM vllm AS ci-tools")]
    uid, gid = SERVE_USER.split(":")
    mounts = {v["target"] for v in compose_config(env=BASE_ENV)["services"]["vllm"]["volumes"]
              if v["type"] == "volume"}
    assert mounts == {"/var/cache/huggingface", "/var/cache/aiter-jit"}
    chown = re.search(rf"chown (?:-h )?{uid}:{gid} ([^&\\]+)", files)
    assert chown, "serve-files: chown of the mount points"
    owned = set(chown.group(1).split())
    for mount in mounts:
        assert f"/staging{mount}" in owned, mount
    assert re.search(rf"vllm:x:{uid}:{gid}:[^:]*:(/home/vllm):", files), "serve-files: passwd entry"
    assert "/staging/home/vllm" in owned


def test_published_address_and_no_key_opt_out_reach_the_launcher():
    e = compose_config(env=BASE_ENV)["services"]["vllm"]["environment"]
    assert e["ROCM_VLLM_PUBLISHED_ADDRESS"] == "127.0.0.1" and e["ROCM_VLLM_ALLOW_NO_API_KEY"] == ""
    e = compose_config(env={**BASE_ENV, "VLLM_BIND_ADDRESS": "0.0.0.0", "ROCM_VLLM_ALLOW_NO_API_KEY": "1"})[
        "services"]["vllm"]["environment"]
    assert e["ROCM_VLLM_PUBLISHED_ADDRESS"] == "0.0.0.0" and e["ROCM_VLLM_ALLOW_NO_API_KEY"] == "1"


def test_render_gid_is_required_and_named():
    proc = compose_config(env={}, check=False)
    assert proc.returncode != 0
    assert "RENDER_GID" in proc.stderr and "getent group render" in proc.stderr


def test_healthcheck_is_the_runtimes_probe_with_configurable_start_period():
    """One health probe everywhere: compose.yaml runs the runtime's (compose.ray.yaml and the
    Kubernetes manifests do too), its whole check bounded within compose's own timeout."""
    vllm = compose_config(env=BASE_ENV)["services"]["vllm"]
    hc = vllm["healthcheck"]
    assert hc["test"][:4] == ["CMD", "python3", "-m", "rocm_vllm_runtime.health"]
    probe_timeout = float(hc["test"][hc["test"].index("--timeout") + 1])
    assert probe_timeout < int(hc["timeout"].rstrip("s"))
    assert hc["start_period"] == "30m0s"
    assert compose_config(env={**BASE_ENV, "HEALTH_START_PERIOD": "5m"})["services"]["vllm"][
        "healthcheck"]["start_period"] == "5m0s"


def test_port_bound_to_loopback_by_default_and_configurable():
    ports = compose_config(env=BASE_ENV)["services"]["vllm"]["ports"]
    assert [(p["host_ip"], str(p["published"]), p["target"]) for p in ports] == [("127.0.0.1", "8000", 8000)]
    ports = compose_config(env={**BASE_ENV, "VLLM_BIND_ADDRESS": "0.0.0.0", "VLLM_PORT": "9000"})[
        "services"]["vllm"]["ports"]
    assert [(p["host_ip"], str(p["published"])) for p in ports] == [("0.0.0.0", "9000")]


def test_serving_settings_from_environment():
    env = {**BASE_ENV, "SERVE_MODEL": "deepseek-ai/DeepSeek-R1", "SERVE_TENSOR_PARALLEL_SIZE": "8",
           "SERVE_BLOCK_SIZE": "1", "SERVE_MAX_MODEL_LEN": "32768", "SERVE_EXTRA_ARGS": "--trust-remote-code",
           "VLLM_API_KEY": "k-123"}
    environment = compose_config(env=env)["services"]["vllm"]["environment"]
    for key, value in env.items():
        if key != "RENDER_GID":
            assert environment[key] == value, key
    defaults = compose_config(env=BASE_ENV)["services"]["vllm"]["environment"]
    assert defaults["SERVE_MODEL"] == "" and defaults["VLLM_API_KEY"] == ""  # tiny model, no key
    assert "AITER_JIT_DIR" not in defaults  # the entrypoint derives it


def test_caches_are_named_volumes_and_server_policies():
    cfg = compose_config(env=BASE_ENV)
    vllm = cfg["services"]["vllm"]
    mounts = {v["target"]: v for v in vllm["volumes"]}
    assert mounts["/var/cache/huggingface"]["type"] == "volume"
    assert vllm["environment"]["HF_HOME"] == "/var/cache/huggingface"
    assert mounts["/var/cache/aiter-jit"]["type"] == "volume"
    assert {v["name"] for v in cfg["volumes"].values()} == {"rocm-vllm-hf-cache", "rocm-vllm-aiter-jit"}
    assert vllm["restart"] == "unless-stopped"
    assert vllm["stop_grace_period"]


def test_selftest_service_under_profile_with_same_devices():
    proc = subprocess.run(["docker", "compose", "--project-directory", str(ROOT), "-f", str(ROOT / "compose.yaml"),
                           "--env-file", os.devnull, "--profile", "selftest", "config", "--format", "json"],
                          capture_output=True, text=True, env={**os.environ, **BASE_ENV}) \
        if shutil.which("docker") else pytest.skip("no docker client in PATH")
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    selftest, vllm = services["selftest"], services["vllm"]
    assert selftest["profiles"] == ["selftest"]
    assert selftest["devices"] == vllm["devices"] and selftest["group_add"] == vllm["group_add"]
    assert selftest["command"][0] == "selftest" and selftest["image"].endswith("/ci:dev")


def test_env_example_documents_every_variable():
    used = set()
    for name in ("compose.yaml",):
        used |= set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", (ROOT / name).read_text()))
    documented = set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", (ROOT / ".env.example").read_text(), re.M))
    assert used - documented == set(), "variables of compose.yaml missing in .env.example"
    assert documented - used == set(), ".env.example names variables compose.yaml does not read"


def test_env_example_is_a_valid_env_file():
    proc = subprocess.run(["docker", "compose", "--project-directory", str(ROOT), "-f", str(ROOT / "compose.yaml"),
                           "--env-file", str(ROOT / ".env.example"), "config", "--format", "json"],
                          capture_output=True, text=True, env={**os.environ, "RENDER_GID": "109"}) \
        if shutil.which("docker") else pytest.skip("no docker client in PATH")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["services"]["vllm"]["ports"][0]["host_ip"] == "127.0.0.1"


def test_cpu_override_serves_the_tiny_model_without_devices():
    """The shipped CPU override (compose.cpu.yaml): compose.yaml's service, port mapping, user and
    probe, with no devices or groups, the GPU check off, the backend's CPU development mode and
    the serve-cpu image of the bake target (docker-bake.hcl)."""
    cfg = compose_config("compose.yaml", CPU_OVERRIDE, env=BASE_ENV)
    vllm = cfg["services"]["vllm"]
    assert set(cfg["services"]) == {"vllm"}
    assert not vllm.get("devices") and not vllm.get("group_add") and not vllm.get("cap_add")
    assert vllm["image"] == "localhost/rocm-vllm/serve-cpu:dev" and vllm["command"] == ["serve"]
    assert "network_mode" not in vllm  # a laptop's Docker: the loopback port mapping of compose.yaml
    assert [(p["host_ip"], str(p["published"]), p["target"]) for p in vllm["ports"]] == [("127.0.0.1", "8000", 8000)]
    assert vllm["user"] == SERVE_USER  # the CPU run serves as the same non-root user
    assert int(vllm["shm_size"]) <= 4 * 2**30  # a laptop's memory, not a GPU host's
    e = vllm["environment"]
    assert e["ROCM_VLLM_REQUIRE_GPU"] == "0" and e["AITER_MLA_KERNELS"] == "reference"
    # The backend is named: on CPUs with AMX tiles vLLM would otherwise pick AMX_MLA.
    assert e["SERVE_ATTENTION_BACKEND"] == "CPU_MLA"
    assert e["SERVE_MODEL"] == "" and e["VLLM_API_KEY"] == ""  # the tiny model in the image, no key
    assert e["ROCM_VLLM_PUBLISHED_ADDRESS"] == "127.0.0.1"
    assert e["VLLM_CPU_KVCACHE_SPACE"] == "1" and e["SERVE_MAX_MODEL_LEN"] == "512"
    assert "--dtype float32" in e["SERVE_EXTRA_ARGS"]
    assert not any(k in e for k in ("PYTHONPATH", "ROCM_VLLM_FAKE_AMX", "AITER_MLA_STATS")), "test-only settings"
    assert all(v["type"] == "volume" for v in vllm["volumes"])  # no bind mount of this repository
    assert "rocm_vllm_runtime.health" in vllm["healthcheck"]["test"]


def test_cpu_override_settings_from_environment():
    env = {**BASE_ENV, "SERVE_CPU_IMAGE": "localhost/t/serve-cpu:x", "SELFTEST_CPU_IMAGE": "localhost/t/ci-cpu:x",
           "SERVE_EXTRA_ARGS": "--seed 1", "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_PORT": "9001",
           "SERVE_IMAGE": "localhost/t/rocm-serve:x"}
    cfg = compose_config("compose.yaml", CPU_OVERRIDE, env=env, profiles=("selftest",))
    vllm, selftest = cfg["services"]["vllm"], cfg["services"]["selftest"]
    # SERVE_IMAGE (an AMD host's .env) does not leak into the CPU path
    assert vllm["image"] == "localhost/t/serve-cpu:x" and selftest["image"] == "localhost/t/ci-cpu:x"
    assert vllm["environment"]["SERVE_EXTRA_ARGS"] == "--seed 1"
    assert vllm["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert str(vllm["ports"][0]["published"]) == "9001"


def test_cpu_override_selftest_runs_the_gpu_free_suite_unprivileged():
    selftest = compose_config("compose.yaml", CPU_OVERRIDE, env=BASE_ENV, profiles=("selftest",))[
        "services"]["selftest"]
    assert selftest["image"] == "localhost/rocm-vllm/ci-cpu:dev"
    assert not selftest.get("devices") and not selftest.get("group_add")
    assert not selftest.get("cap_add") and not selftest.get("security_opt")
    assert selftest["command"][:2] == ["selftest", "selector"]
    assert selftest["environment"]["ROCM_VLLM_REQUIRE_GPU"] == "0"


def test_cpu_override_names_only_images_of_the_cpu_bake_targets():
    """The images compose.cpu.yaml runs by default are tags docker-bake.hcl's serve-cpu and ci-cpu
    give (the CPU path's two commands fit together)."""
    from test_cpu_path import printed_cpu_targets  # noqa: PLC0415 - one bake --print helper

    targets = printed_cpu_targets()
    cfg = compose_config("compose.yaml", CPU_OVERRIDE, env=BASE_ENV, profiles=("selftest",))["services"]
    assert cfg["vllm"]["image"] in targets["serve-cpu"]["tags"]
    assert cfg["selftest"]["image"] in targets["ci-cpu"]["tags"]


def test_tests_cpu_override_adds_only_test_settings():
    """tests/compose.cpu.yaml, layered on the shipped override as the engine tests run it: host
    networking on the given port, the AMX hook and the decode statistics; everything else is the
    shipped override's."""
    env = {**BASE_ENV, "SERVE_CPU_IMAGE": "localhost/t/serve:cpu", "SELFTEST_CPU_IMAGE": "localhost/t/ci:cpu",
           "VLLM_PORT": "18000"}
    shipped = compose_config("compose.yaml", CPU_OVERRIDE, env=env, profiles=("selftest",))["services"]
    tested = compose_config("compose.yaml", CPU_OVERRIDE, TESTS_CPU_OVERRIDE, env=env,
                            profiles=("selftest",))["services"]
    vllm = tested["vllm"]
    assert vllm["network_mode"] == "host" and not vllm.get("ports")
    assert vllm["image"] == "localhost/t/serve:cpu" and tested["selftest"]["image"] == "localhost/t/ci:cpu"
    e = vllm["environment"]
    assert e["SERVE_HOST"] == "127.0.0.1" and e["SERVE_PORT"] == "18000"
    assert e["ROCM_VLLM_FAKE_AMX"] == "1" and e["PYTHONPATH"] == "/opt/fake_amx"
    assert any(v["source"] == str(ROOT / "tests/fake_amx") and v["target"] == "/opt/fake_amx"
               for v in vllm["volumes"])
    assert e["OMP_WAIT_POLICY"] == "PASSIVE"  # the lanes share the cores
    added = {"SERVE_HOST", "SERVE_PORT", "AITER_MLA_STATS", "PYTHONPATH", "ROCM_VLLM_FAKE_AMX", "OMP_WAIT_POLICY"}
    assert {k: v for k, v in e.items() if k not in added} == shipped["vllm"]["environment"]
    for key in ("user", "shm_size", "command", "healthcheck", "devices", "group_add"):
        assert vllm.get(key) == shipped["vllm"].get(key), key
    for key in ("command", "devices", "cap_add", "security_opt"):
        assert tested["selftest"].get(key) == shipped["selftest"].get(key), key
    assert tested["selftest"]["environment"] == {**shipped["selftest"]["environment"], "OMP_WAIT_POLICY": "PASSIVE"}
    assert tested["selftest"]["network_mode"] == "host"


@pytest.mark.parametrize(("missing", "named"), [("SERVE_CPU_IMAGE", "SELFTEST_CPU_IMAGE"),
                                               ("SELFTEST_CPU_IMAGE", "SERVE_CPU_IMAGE")])
def test_tests_cpu_override_needs_the_images_named(missing, named):
    # One image named at a time: with both missing, compose names whichever it meets first.
    env = {**BASE_ENV, named: "localhost/rocm-vllm/test-image:1"}
    proc = compose_config("compose.yaml", CPU_OVERRIDE, TESTS_CPU_OVERRIDE, env=env, check=False)
    assert proc.returncode != 0 and f"set {missing} to the" in proc.stderr
