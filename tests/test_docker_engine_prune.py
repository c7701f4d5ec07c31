"""`ci/test-machine/docker-engine.sh prune`, on the private engine that .ci/run starts: what no
later run reuses goes (untagged images), what the tests reuse by name stays (tagged images)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci/test-machine/docker-engine.sh"
TAG = "localhost/rocm-vllm-test/prune-probe:latest"
pytestmark = pytest.mark.docker


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def engine_env() -> dict[str, str]:
    """The client environment of the private engine (the one `prune` acts on)."""
    if _script("status").returncode != 0:
        pytest.skip("the private Docker engine is not running (bash ci/test-machine/docker-engine.sh start)")
    lines = _script("env").stdout.splitlines()
    pairs = (line.removeprefix("export ").split("=", 1) for line in lines)
    return {**os.environ, **dict(pairs)}


def _build(env: dict[str, str], context: Path, content: str) -> str:
    """An image of one file FROM scratch (nothing to pull), tagged TAG; returns its ID."""
    (context / "marker").write_text(content)
    (context / "Dockerfile").write_text("FROM scratch\nCOPY marker /marker\n")
    subprocess.run(["docker", "build", "--quiet", "--tag", TAG, str(context)],
                   env=env, check=True, capture_output=True, text=True, timeout=300)
    return _image_id(env, TAG)


def _image_id(env: dict[str, str], ref: str) -> str:
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref],
                          env=env, capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def test_prune_drops_untagged_images_and_keeps_tagged_ones(engine_env, tmp_path) -> None:
    # the same tag built twice: the first image loses its tag and nothing else refers to it
    first = _build(engine_env, tmp_path, "first")
    second = _build(engine_env, tmp_path, "second")
    assert first and second and first != second
    assert _image_id(engine_env, first) == first

    proc = _script("prune")
    assert proc.returncode == 0, proc.stderr
    assert "pruned:" in proc.stderr and "free on" in proc.stderr, proc.stderr

    assert _image_id(engine_env, first) == "", "an untagged image survived the prune"
    assert _image_id(engine_env, TAG) == second, "the tagged image was pruned"
    subprocess.run(["docker", "image", "rm", TAG], env=engine_env, capture_output=True, timeout=60)


def test_prune_without_an_engine_says_so_and_succeeds(tmp_path) -> None:
    if shutil.which("docker") is None:
        pytest.skip("no docker client in PATH (bash ci/test-machine/docker-engine.sh start installs one)")
    proc = subprocess.run(["bash", str(SCRIPT), "prune"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DOCKER_ENGINE_ROOT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "nothing to prune" in proc.stderr
