"""rocm_vllm_runtime.ray_cluster, the Ray cluster membership both multi-host deployments run
(compose.ray.yaml through deploy/ray/ray-node.sh, the LeaderWorkerSet with --lws): the check of
Ray's node list against the head's identity, the identity over every layer the repository owns,
the settings (RAY_NODES or LWS_GROUP_SIZE, RAY_JOIN_TIMEOUT) and the wait's messages. The node
scripts that run it: tests/test_compose_ray.py and tests/test_kubernetes.py."""
from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from rocm_vllm_runtime import ray_cluster
from rocm_vllm_runtime.ray_cluster import COMPOSE, LWS


def node(identity, alive=True, address="10.0.0.9"):
    return {"Alive": alive, "NodeManagerAddress": address, "Resources": {"GPU": 8.0, identity: 1.0, "CPU": 64.0}}


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LWS_"))}
    return subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.ray_cluster", *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------- membership check

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


def test_a_group_names_its_own_settings_and_pods():
    """--lws: the same check, the LeaderWorkerSet's words (its group size, its pods; no compose)."""
    me = "rocm-vllm-0123456789ab-gfx942x8"
    assert ray_cluster.check([node(me), node(me)], 2, me, LWS) == (True, "")
    ready, error = ray_cluster.check([node(me), {"Alive": True, "NodeManagerAddress": "10.0.0.7",
                                                 "Resources": {"GPU": 8.0}}], 2, me, LWS)
    assert not ready and error.startswith("error: Ray node 10.0.0.7 runs no rocm-vllm identity, the head ")
    assert "pods" in error and "SERVE_IMAGE" not in error and "\n" not in error
    ready, error = ray_cluster.check([node(me)] * 3, 2, me, LWS)
    assert not ready and "3 Ray nodes joined, LWS_GROUP_SIZE says 2" in error and "RAY_NODES" not in error


# ----------------------------------------------------------------- identity

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
    (app / "suites").mkdir(parents=True)
    (app / "suites" / "test_smoke.py").write_text("x = 1\n")
    env = {"ROCM_VLLM_MANIFEST": str(manifest), "ROCM_VLLM_APP_DIR": str(app)}
    before = ray_cluster.identity(env)
    (app / "suites" / "__pycache__").mkdir()
    (app / "suites" / "__pycache__" / "test_smoke.cpython-312.pyc").write_bytes(b"cache")
    assert ray_cluster.identity(env) == before  # byte-code caches are not content
    (app / "suites" / "test_smoke.py").write_text("x = 2\n")
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
    # this module is part of the runtime package: the identity covers the membership check itself
    assert any((p / "ray_cluster.py").is_file() for p in owned[2:])


# ----------------------------------------------------------------- settings

def test_counts_take_their_defaults_when_unset_or_empty_and_wait_checks_its_argument(tmp_path):
    env = {"ROCM_VLLM_MANIFEST": str(tmp_path / "manifest.json")}
    assert ray_cluster.settings({}) == {"RAY_NODES": 2, "RAY_JOIN_TIMEOUT": 1200}
    assert ray_cluster.settings({"RAY_NODES": "", "RAY_JOIN_TIMEOUT": "30"}) == {"RAY_NODES": 2, "RAY_JOIN_TIMEOUT": 30}
    proc = run("wait", "two", env=env)
    assert proc.returncode == 2 and proc.stderr.startswith("error: RAY_NODES='two' is not a whole number"), proc.stderr
    proc = run("wait", "2", env={**env, "RAY_JOIN_TIMEOUT": "inf"})
    assert proc.returncode == 2 and proc.stderr.startswith("error: RAY_JOIN_TIMEOUT='inf'"), proc.stderr
    proc = run("settings", env={"RAY_NODES": "4", "RAY_JOIN_TIMEOUT": "30"})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "4 30\n", "")


@pytest.mark.parametrize("value", ["", "abc", "0", "-2", "2.0", "1e3", "inf", " 2", "99999999999"])
def test_a_group_size_is_required_and_a_whole_number(value):
    """--lws: the node count is LWS_GROUP_SIZE, which the LeaderWorkerSet controller sets in each pod:
    no default, and a bad one is one line naming it (exit 2)."""
    proc = run("settings", "--lws", env={"LWS_GROUP_SIZE": value, "RAY_JOIN_TIMEOUT": "30"})
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
    assert proc.stderr.startswith(f"error: LWS_GROUP_SIZE={value!r} is not a whole number of nodes from 1 to "), \
        proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    proc = run("wait", "--lws", value, env={"RAY_JOIN_TIMEOUT": "30"})
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: LWS_GROUP_SIZE={value!r} is not"), proc.stderr


def test_a_group_reads_its_size_and_the_join_timeout():
    assert ray_cluster.settings({"LWS_GROUP_SIZE": "3"}, LWS) == {"LWS_GROUP_SIZE": 3, "RAY_JOIN_TIMEOUT": 1200}
    proc = run("settings", "--lws", env={"LWS_GROUP_SIZE": "2", "RAY_JOIN_TIMEOUT": "010", "RAY_NODES": "x"})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "2 10\n", "")  # RAY_NODES is compose's: not read
    proc = run("settings", "--lws", env={"LWS_GROUP_SIZE": "2", "RAY_JOIN_TIMEOUT": "nan"})
    assert proc.returncode == 2 and proc.stderr.startswith("error: RAY_JOIN_TIMEOUT='nan'"), proc.stderr
    proc = run("identity", "--lws", env={})
    assert proc.returncode == 2 and "usage:" in proc.stderr  # the identity is the same in both


# ----------------------------------------------------------------- the wait, with a stand-in ray module

@pytest.mark.parametrize("deployment, says", [
    (COMPOSE, "error: 1 of 2 Ray nodes joined within 0s: start the workers (docker compose -f compose.ray.yaml "
              "--profile worker up -d) or raise RAY_JOIN_TIMEOUT"),
    (LWS, "error: 1 of 2 Ray nodes joined within 0s: read the worker pods' logs, or raise RAY_JOIN_TIMEOUT"),
])
def test_the_wait_says_what_to_do_in_each_deployment(monkeypatch, capsys, tmp_path, deployment, says):
    env = {"ROCM_VLLM_MANIFEST": str(tmp_path / "manifest.json")}
    me = ray_cluster.identity(env)
    listed = [[node(me)]]
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=lambda **kwargs: None,
                                                                  nodes=lambda: listed[0]))
    assert ray_cluster.wait(2, 0, interval=0, deployment=deployment, env=env) == 1
    assert capsys.readouterr().err == says + "\n"
    listed[0] = [node(me), node(me, address="10.0.0.2")]
    assert ray_cluster.wait(2, 0, interval=0, deployment=deployment, env=env) == 0
    assert capsys.readouterr().err == f"[rocm-vllm] ray: 2 of 2 nodes joined, all {me}\n"
