"""Host-side scripts of the AMD runner, with a fake docker that records its arguments."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def host(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    (bin_dir / "docker").write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "print('== selftest summary ==\\nresult: PASSED (exit 0)')\n"
        "sys.exit(int(os.environ.get('FAKE_DOCKER_RC', '0')))\n")
    (bin_dir / "docker").chmod(0o755)
    dri = tmp_path / "dri"
    dri.mkdir()
    (dri / "renderD128").write_text("")
    kfd = tmp_path / "kfd"
    kfd.write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "DRI_DIR": str(dri),
           "KFD_PATH": str(kfd), "RESULTS_DIR": str(tmp_path / "results")}

    class Host:
        root = tmp_path

        def run(self, script: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["bash", str(script), *args], env={**env, **extra},
                                  capture_output=True, text=True, timeout=60)

        def calls(self) -> list[list[str]]:
            return [json.loads(l) for l in calls.read_text().splitlines()] if calls.exists() else []

    h = Host()
    h.kfd, h.dri = kfd, dri
    return h


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def real_docker_accepts(argv: list[str]) -> None:
    """The real docker client and engine take the `docker run` argv (every flag and value) up
    to the point where the image is looked up: `docker create --pull never` with the same
    arguments must fail only because the test image does not exist."""
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "version"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("no Docker engine answers to check the argv with (bash ci/test-machine/docker-engine.sh start; "
                    "eval \"$(bash ci/test-machine/docker-engine.sh env)\")")
    assert argv[0] == "run"
    proc = subprocess.run([docker, "create", "--pull", "never", *argv[1:]], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0
    assert "No such image" in proc.stderr, proc.stderr


def run_prefix(host, gid: str) -> list[str]:
    """selftest.sh's docker argv up to its settings: devices, groups, shared memory, results, JIT cache."""
    return ["run", "--rm", "--device", f"{host.kfd}:/dev/kfd", "--device", f"{host.dri}:/dev/dri",
            "--group-add", "video", "--group-add", gid,
            "--ipc=host", "--security-opt", "seccomp=unconfined", "--cap-add", "SYS_PTRACE",
            "--shm-size", "16g", "-v", f"{host.root / 'results'}:/results",
            "-v", "rocm-vllm-aiter-jit:/var/cache/aiter-jit", "-e", "SELFTEST_RESULTS_DIR=/results"]


def test_selftest_runs_image_with_device_flags(host, ci_dir: Path) -> None:
    proc = host.run(ci_dir / "pipeline/amd-runner/selftest.sh", "smoke", "--", "-x",
                    BENCH_NUM_PROMPTS="10", TAG="t1", GITHUB_STEP_SUMMARY=str(host.root / "sum.md"))
    assert proc.returncode == 0, proc.stderr
    (argv,) = host.calls()
    gid = str(os.stat(host.dri / "renderD128").st_gid)
    assert argv == [*run_prefix(host, gid),
                    "-e", "BENCH_NUM_PROMPTS=10",
                    "localhost/rocm-vllm/ci:t1", "selftest", "smoke", "--json", "/results/selftest.json",
                    "--junit", "/results/selftest.xml", "--", "-x"]
    real_docker_accepts(argv)
    assert "selftest summary" in (host.root / "results/selftest.log").read_text()
    assert "result: PASSED" in (host.root / "sum.md").read_text()


def test_selftest_mounts_an_earlier_accuracy_run_as_the_reference(host, ci_dir: Path) -> None:
    earlier = host.root / "earlier"
    earlier.mkdir()
    proc = host.run(ci_dir / "pipeline/amd-runner/selftest.sh", "accuracy", RENDER_GID="109",
                    ACCURACY_REFERENCE_DIR=str(earlier))
    assert proc.returncode == 2 and "holds no accuracy.json" in proc.stderr and host.calls() == []
    (earlier / "accuracy.json").write_text("{}")
    proc = host.run(ci_dir / "pipeline/amd-runner/selftest.sh", "accuracy", RENDER_GID="109",
                    ACCURACY_REFERENCE_DIR=str(earlier), ACCURACY_LIMIT="50")
    assert proc.returncode == 0, proc.stderr
    (argv,) = host.calls()
    assert argv == [*run_prefix(host, "109"),
                    "-v", f"{earlier}:/data/accuracy-reference:ro", "-e", "ACCURACY_REFERENCE=/data/accuracy-reference",
                    "-e", "ACCURACY_LIMIT=50",
                    "localhost/rocm-vllm/ci:dev", "selftest", "accuracy", "--json", "/results/selftest.json",
                    "--junit", "/results/selftest.xml"]
    real_docker_accepts(argv)


def test_selftest_passes_the_exit_status_on(host, ci_dir: Path) -> None:
    proc = host.run(ci_dir / "pipeline/amd-runner/selftest.sh", FAKE_DOCKER_RC="2", RENDER_GID="109")
    assert proc.returncode == 2
    (argv,) = host.calls()
    assert "109" in _flag_values(argv, "--group-add") and argv[-5] == "all"


def test_selftest_without_kfd_or_render_node_fails_clearly(host, ci_dir: Path) -> None:
    (host.dri / "renderD128").unlink()
    proc = host.run(ci_dir / "pipeline/amd-runner/selftest.sh")
    assert proc.returncode == 1 and "RENDER_GID" in proc.stderr
    host.kfd.unlink()
    proc = host.run(ci_dir / "pipeline/amd-runner/selftest.sh")
    assert proc.returncode == 1 and "no " in proc.stderr and "kfd" in proc.stderr
    assert host.calls() == []


def test_build_bakes_targets(host, ci_dir: Path) -> None:
    """The whole argv: bake file, pins file, metadata file, extra arguments, targets."""
    proc = host.run(ci_dir / "pipeline/amd-runner/build.sh", TAG="t2")
    assert proc.returncode == 0, proc.stderr
    metadata = str(host.root / "results/bake-metadata.json")
    assert host.calls() == [["buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json",
                             "--metadata-file", metadata, "--load", "ci", "serve"]]
    host.run(ci_dir / "pipeline/amd-runner/build.sh", "base", BAKE_ARGS="--push --progress plain")
    assert host.calls()[1] == ["buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json",
                               "--metadata-file", metadata, "--push", "--progress", "plain", "base"]
    # PUSH=1: bake pushes (docker-bake.hcl's output), so the images are not also loaded
    host.run(ci_dir / "pipeline/amd-runner/build.sh", "serve", PUSH="1")
    assert host.calls()[2] == ["buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json",
                               "--metadata-file", metadata, "serve"]


def _real_buildx() -> str:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client in PATH (bash ci/test-machine/docker-engine.sh start installs one)")
    if subprocess.run([docker, "buildx", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker buildx plugin not found "
                    "(eval \"$(bash ci/test-machine/docker-engine.sh env)\" sets DOCKER_CONFIG)")
    return docker


def test_build_resolves_the_graph_with_real_bake(tmp_path: Path, ci_dir: Path) -> None:
    """The script's own argv through the real `docker buildx bake --print`."""
    from tools.pins import model

    _real_buildx()
    repo = ci_dir.parent
    # versions.json's pins are unresolved: bake prints the ROCm targets under ALLOW_UNRESOLVED=1 only
    env = {**os.environ, "BAKE_ARGS": "--print", "RESULTS_DIR": str(tmp_path / "results"),
           "REGISTRY": "registry.example/team", "TAG": "t3", "VCS_REF": "0123abc", "ALLOW_UNRESOLVED": "1"}
    env.pop("DOCKER", None)
    proc = subprocess.run(["bash", str(ci_dir / "pipeline/amd-runner/build.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    targets = json.loads(proc.stdout)["target"]  # progress lines go to stderr
    assert {"ci", "serve"} <= set(targets)
    data = model.load(repo / "versions.json")
    expected = model.build_args(data, allow_unresolved=True)
    default = data["default_track"]
    for name in ("ci", "serve"):
        target = targets[name]
        assert target["dockerfile"] == "Dockerfile.rocm" and target["target"] == name
        # every image names its track; the default track's also carries the plain tag
        assert target["tags"] == [f"registry.example/team/{name}:t3-vllm{default}",
                                  f"registry.example/team/{name}:t3"]
        assert all(target["args"][k] == expected[k] for k in ("VLLM_REPOSITORY", "VLLM_TAG", "VLLM_COMMIT"))
        assert target["contexts"]["base"] == "target:base"
    assert any("0123abc" in v for v in targets["serve"].get("labels", {}).values()), targets["serve"].get("labels")
    # another track: its own pins and a tag naming it only
    other = model.track_names(data)[-1]
    proc = subprocess.run(["bash", str(ci_dir / "pipeline/amd-runner/build.sh")], env={**env, "TRACK": other},
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    serve = json.loads(proc.stdout)["target"]["serve"]
    assert serve["tags"] == [f"registry.example/team/serve:t3-vllm{other}"]
    assert serve["args"] | model.build_args(data, track_name_=other, allow_unresolved=True) == serve["args"]


def test_build_without_the_pins_file_fails_through_real_bake(tmp_path: Path, ci_dir: Path) -> None:
    """Bake without the pins file (-f docker-bake.pins.json) is refused by the real bake."""
    docker = _real_buildx()
    proc = subprocess.run([docker, "buildx", "bake", "-f", "docker-bake.hcl", "--print", "ci", "serve"],
                          cwd=ci_dir.parent, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "variable" in proc.stderr.lower(), proc.stderr


def test_selftest_forwards_pytest_addopts(host, ci_dir: Path) -> None:
    """The pipeline's pytest options reach the suites' pytest through PYTEST_ADDOPTS (the
    self-test CLI takes `-- PYTEST_ARGS` only before its own options)."""
    proc = host.run(ci_dir / "pipeline/amd-runner/selftest.sh", "all", RENDER_GID="109",
                    PYTEST_ADDOPTS="-o junit_logging=system-out")
    assert proc.returncode == 0, proc.stderr
    (argv,) = host.calls()
    assert argv == [*run_prefix(host, "109"),
                    "-e", "PYTEST_ADDOPTS=-o junit_logging=system-out",
                    "localhost/rocm-vllm/ci:dev", "selftest", "all", "--json", "/results/selftest.json",
                    "--junit", "/results/selftest.xml"]
    real_docker_accepts(argv)
