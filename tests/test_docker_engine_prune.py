"""`ci/test-machine/docker-engine.sh` on an engine of the test's own (its own data root, socket and
daemon, as .ci/run starts the tests' engine): `prune` drops what no later run reuses (untagged
images) and keeps what the tests reuse by name (tagged images); `stop` ends the daemon. Its own
engine: a prune of the tests' engine would race the Docker tests of the other lane."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci/test-machine/docker-engine.sh"
TAG = "localhost/rocm-vllm-test/prune-probe:latest"
pytestmark = pytest.mark.docker


def _script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def engine_env():
    """The client environment of an engine started for this module (the one `prune` acts on);
    stopped and its folder removed afterwards."""
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip("no dockerd or not root: an engine of its own cannot start here (.ci/run runs as root "
                    "and installs the engine)")
    # a short folder: the daemon's sockets live under it (a socket path holds at most 107 bytes)
    folder = Path(tempfile.mkdtemp(prefix="prune-engine-"))
    script_env = {**os.environ, "DOCKER_ENGINE_ROOT": str(folder), "DOCKER_ENGINE_NO_INSTALL": "1"}
    started = _script("start", env=script_env)
    try:
        assert started.returncode == 0, started.stderr
        lines = _script("env", env=script_env).stdout.splitlines()
        pairs = (line.removeprefix("export ").split("=", 1) for line in lines)
        yield {**script_env, **dict(pairs)}
    finally:
        stopped = _script("stop", env=script_env)
        shutil.rmtree(folder, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stderr
    assert _script("status", env=script_env).returncode != 0, "the engine still answers after stop"


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

    proc = _script("prune", env=engine_env)
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
