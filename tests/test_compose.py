"""compose.yaml and the CPU override: `docker compose config` validates them, and the
settings that make a ROCm server work (devices, groups, healthcheck, port binding) are there."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import compose_cli
import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_OVERRIDE = "tests/compose.cpu.yaml"
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


def test_cpu_override():
    env = {**BASE_ENV, "SERVE_IMAGE": "localhost/t/serve:cpu", "SELFTEST_IMAGE": "localhost/t/ci:cpu"}
    vllm = compose_config("compose.yaml", CPU_OVERRIDE, env=env)["services"]["vllm"]
    assert vllm["network_mode"] == "host"
    assert not vllm.get("devices") and not vllm.get("group_add") and not vllm.get("ports")
    assert vllm["image"] == "localhost/t/serve:cpu"
    e = vllm["environment"]
    assert e["ROCM_VLLM_REQUIRE_GPU"] == "0" and e["AITER_MLA_KERNELS"] == "reference"
    assert e["SERVE_HOST"] == "127.0.0.1" and e["ROCM_VLLM_PUBLISHED_ADDRESS"] == "127.0.0.1"
    assert vllm["user"] == SERVE_USER  # the CPU run serves as the same non-root user
    # The backend is named: on CPUs with AMX tiles vLLM would otherwise pick AMX_MLA.
    assert e["SERVE_ATTENTION_BACKEND"] == "CPU_MLA"
    assert e["ROCM_VLLM_FAKE_AMX"] == "1" and e["PYTHONPATH"] == "/opt/fake_amx"
    assert any(v["source"] == str(ROOT / "tests/fake_amx") and v["target"] == "/opt/fake_amx"
               for v in vllm["volumes"])
    assert vllm["restart"] == "no"
    assert "rocm_vllm_runtime.health" in vllm["healthcheck"]["test"]
