"""Host-side scripts of the AMD runner, with a fake docker that records its arguments."""
from __future__ import annotations

import json
import os
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


def test_selftest_runs_image_with_device_flags(host, ci_dir: Path) -> None:
    proc = host.run(ci_dir / "amd-runner/selftest.sh", "smoke", "--", "-x",
                    BENCH_NUM_PROMPTS="10", TAG="t1", GITHUB_STEP_SUMMARY=str(host.root / "sum.md"))
    assert proc.returncode == 0, proc.stderr
    (argv,) = host.calls()
    gid = str(os.stat(host.dri / "renderD128").st_gid)
    assert argv[0] == "run"
    assert _flag_values(argv, "--device") == [f"{host.kfd}:/dev/kfd", f"{host.dri}:/dev/dri"]
    assert _flag_values(argv, "--group-add") == ["video", gid]
    for flag in ("--ipc=host", "seccomp=unconfined", "SYS_PTRACE", "--shm-size"):
        assert flag in argv
    assert f"{host.root / 'results'}:/results" in _flag_values(argv, "-v")
    assert "rocm-vllm-aiter-jit:/var/cache/aiter-jit" in _flag_values(argv, "-v")
    assert "BENCH_NUM_PROMPTS=10" in _flag_values(argv, "-e")
    i = argv.index("localhost/rocm-vllm/ci:t1")
    assert argv[i + 1:] == ["selftest", "smoke", "--json", "/results/selftest.json",
                            "--junit", "/results/selftest.xml", "--", "-x"]
    assert "selftest summary" in (host.root / "results/selftest.log").read_text()
    assert "result: PASSED" in (host.root / "sum.md").read_text()


def test_selftest_passes_the_exit_status_on(host, ci_dir: Path) -> None:
    proc = host.run(ci_dir / "amd-runner/selftest.sh", FAKE_DOCKER_RC="2", RENDER_GID="109")
    assert proc.returncode == 2
    (argv,) = host.calls()
    assert "109" in _flag_values(argv, "--group-add") and argv[-5] == "all"


def test_selftest_without_kfd_or_render_node_fails_clearly(host, ci_dir: Path) -> None:
    (host.dri / "renderD128").unlink()
    proc = host.run(ci_dir / "amd-runner/selftest.sh")
    assert proc.returncode == 1 and "RENDER_GID" in proc.stderr
    host.kfd.unlink()
    proc = host.run(ci_dir / "amd-runner/selftest.sh")
    assert proc.returncode == 1 and "no " in proc.stderr and "kfd" in proc.stderr
    assert host.calls() == []


def test_build_bakes_targets(host, ci_dir: Path) -> None:
    proc = host.run(ci_dir / "amd-runner/build.sh", TAG="t2")
    assert proc.returncode == 0, proc.stderr
    (argv,) = host.calls()
    assert argv[:3] == ["buildx", "bake", "-f"] and argv[-3:] == ["--load", "ci", "serve"]
    assert "--metadata-file" in argv
    host.run(ci_dir / "amd-runner/build.sh", "base", BAKE_ARGS="--push --progress plain")
    assert host.calls()[1][-4:] == ["--push", "--progress", "plain", "base"]
