"""README.md's CPU main job as written there: the command block of its "Without an AMD GPU"
paragraph, read from README.md (one command, the curl check, the stop command), run end to end on
a copy of the checkout (as a fresh clone has it) to one completion on 127.0.0.1, then stopped with
the README's stop command (marker docker). The images are the integration test's: the CPU vLLM
image by the tag derived from its inputs (tools/cpu_serve.py makes it for both), the serve-cpu layers
from the build cache. Only the port differs from the README (a free one: VLLM_PORT, and the
README's 127.0.0.1:8000 read as 127.0.0.1:<port>); the compose project and volumes are the
test's own (COMPOSE_PROJECT_NAME, HF_CACHE_VOLUME, AITER_JIT_VOLUME), removed at the end
(down -v) whatever happened. Without a Docker engine: what the script and its files do alone."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import compose_cli
import pytest

import test_engine_integration as integration
from tools import cpu_serve
from test_engine_integration import ROOT, free_port

# The integration test's fixtures (pytest collects fixtures among a module's globals).
h, cpu_vllm_image = integration.h, integration.cpu_vllm_image

ENGINE_LOG_SUFFIX = "readme"
PROJECT = "rocm-vllm-readme"
VOLUMES = {"HF_CACHE_VOLUME": "rocm-vllm-readme-hf-cache", "AITER_JIT_VOLUME": "rocm-vllm-readme-aiter-jit"}
README_ADDRESS = "127.0.0.1:8000"
# what the README's block must hold, in this order
SERVE, CHECK, STOP = range(3)


def readme_cpu_commands(text: str | None = None) -> list[str]:
    """The command block (indented or fenced) that follows README.md's "Without an AMD GPU" paragraph."""
    text = (ROOT / "README.md").read_text() if text is None else text
    start = text.find("\nWithout an AMD GPU")
    assert start >= 0, "README.md: no paragraph starting 'Without an AMD GPU'"
    block: list[str] = []
    fenced = False
    for line in text[start + 1:].splitlines()[1:]:
        if line.startswith("```"):
            if fenced:
                break
            fenced = True
        elif fenced or line.startswith("    "):
            if line.strip():
                block.append(line.strip())
        elif block:
            break
    return block


def test_readme_cpu_block_is_the_command_the_check_and_the_stop():
    commands = readme_cpu_commands()
    assert len(commands) == 3, commands
    assert commands[SERVE] == "bash serve-cpu.sh"
    assert commands[CHECK].startswith("curl ") and f"{README_ADDRESS}/v1/completions" in commands[CHECK]
    stop = shlex.split(commands[STOP])
    # no variable in front: .env holds RENDER_GID after serve-cpu.sh
    assert stop[:2] == ["docker", "compose"] and stop[-1] == "down", stop
    assert [stop[i + 1] for i, a in enumerate(stop) if a == "-f"] == list(cpu_serve.COMPOSE_FILES)


def test_readme_block_reader_takes_indented_and_fenced_blocks():
    para = "x\nWithout an AMD GPU, this:\n\n"
    assert readme_cpu_commands(para + "    a\n    b\n\nafter\n\n    c\n") == ["a", "b"]
    assert readme_cpu_commands(para + "```bash\na\nb\n```\n\n    c\n") == ["a", "b"]


def test_a_track_typo_in_the_command_names_the_known_tracks():
    proc = subprocess.run([sys.executable, "-m", "tools.cpu_serve"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TRACK": "0.3"}, timeout=60)
    known = ", ".join(sorted(json.loads((ROOT / "versions.json").read_text())["tracks"]))
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"serve-cpu: error: TRACK=0.3 is no release track of versions.json; the tracks: {known}"], proc.stderr



def test_without_an_engine_the_command_says_in_one_line_how_to_get_one(tmp_path):
    """No engine answers (the client's address leads nowhere, this repository's engine is not
    running): one line naming how to start one, before anything is built."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/none.sock", "DOCKER_ENGINE_ROOT": str(tmp_path / "engine")}
    proc = subprocess.run(["bash", str(ROOT / "serve-cpu.sh")], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "serve-cpu: no Docker engine answers: start one (Docker Desktop, dockerd; on Debian, as root: "
        "bash ci/test-machine/docker-engine.sh start), then run this again"], proc.stderr

def test_the_stop_command_needs_no_variable_once_the_command_ran(tmp_path):
    """serve-cpu.sh writes RENDER_GID to .env when it has none (other lines kept, one already
    there kept), so that the README's `docker compose ... down` reads no variable from the caller."""
    for name in cpu_serve.COMPOSE_FILES:
        shutil.copy(ROOT / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if k != "RENDER_GID"}
    files = [a for name in cpu_serve.COMPOSE_FILES for a in ("-f", name)]
    config = ["docker", "compose", *files, "config", "--quiet"]
    if not shutil.which("docker") or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode:
        pytest.skip("no docker compose client")
    before = subprocess.run(config, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert before.returncode != 0 and "RENDER_GID" in before.stderr  # what a fresh clone would get
    (tmp_path / ".env").write_text("VLLM_PORT=8001")
    cpu_serve.ensure_env_file(tmp_path)
    lines = (tmp_path / ".env").read_text().splitlines()
    assert lines[0] == "VLLM_PORT=8001" and re.fullmatch(r"RENDER_GID=[0-9]+", lines[1]) and len(lines) == 2
    after = subprocess.run(config, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert after.returncode == 0, after.stderr
    (tmp_path / ".env").write_text("RENDER_GID=109\n")
    cpu_serve.ensure_env_file(tmp_path)
    assert (tmp_path / ".env").read_text() == "RENDER_GID=109\n"


def test_host_network_override_serves_where_compose_would_publish():
    """compose.hostnet.yaml (an engine without a bridge network): no port mapping, the server
    itself on VLLM_BIND_ADDRESS:VLLM_PORT of the host's network; the rest is the CPU override's."""
    files = (*cpu_serve.COMPOSE_FILES, cpu_serve.HOSTNET_FILE)
    env = {"RENDER_GID": "0", "VLLM_PORT": "18123"}
    shipped = compose_cli.compose_config(list(cpu_serve.COMPOSE_FILES), env=env)["services"]["vllm"]
    vllm = compose_cli.compose_config(list(files), env=env)["services"]["vllm"]
    assert vllm["network_mode"] == "host" and not vllm.get("ports")
    e = vllm["environment"]
    assert (e["SERVE_HOST"], e["SERVE_PORT"]) == ("127.0.0.1", "18123")
    assert {k: v for k, v in e.items() if k not in ("SERVE_HOST", "SERVE_PORT")} == shipped["environment"]
    for key in ("image", "user", "command", "healthcheck", "volumes", "shm_size"):
        assert vllm.get(key) == shipped.get(key), key


# ----------------------------------------------------------------- end to end

def fresh_checkout(dest: Path) -> Path:
    """The checkout's files as a clone has them: tracked and not ignored, no .env, no caches."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    for name in filter(None, out.split("\0")):
        src = ROOT / name
        if src.is_file() and name != ".env":
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.mark.docker
def test_readme_cpu_commands_serve_a_completion_and_stop(h, cpu_vllm_image, tmp_path):
    if not shutil.which("curl"):
        pytest.fail("the README's check needs curl: apt-get install curl")
    commands = readme_cpu_commands()
    port = free_port()
    local = [c.replace(README_ADDRESS, f"127.0.0.1:{port}") for c in commands]
    checkout = fresh_checkout(tmp_path / "clone")
    drop = ("RENDER_GID", "TRACK", "VLLM_CPU_IMAGE", "SERVE_CPU_IMAGE", "VLLM_IMAGE", "COMPOSE_FILE", "TAG")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({"VLLM_PORT": str(port), "COMPOSE_PROJECT_NAME": PROJECT, **VOLUMES})
    files = [a for name in (*cpu_serve.COMPOSE_FILES, cpu_serve.HOSTNET_FILE) for a in ("-f", name)]
    cleanup = ["docker", "compose", "-p", PROJECT, *files, "down", "-v", "--remove-orphans"]
    t0 = time.monotonic()
    try:
        serve = h.run(["bash", "-c", local[SERVE]], cwd=checkout, env=env, timeout=2400, check=False,
                      what=f"README: {commands[SERVE]}")
        if serve.returncode != 0:
            logs = h.run(["docker", "compose", "-p", PROJECT, *files, "logs", "--no-color", "--tail", "60"],
                         cwd=checkout, env={**env, "RENDER_GID": "0"}, check=False)
            pytest.fail(f"{commands[SERVE]} failed (rc={serve.returncode}):\n{serve.stderr[-3000:]}\n"
                        f"{logs.stdout[-2000:]}")
        h.note(f"readme 1: {commands[SERVE]}: served on 127.0.0.1:{port} after {serve.seconds:.1f}s")
        # the integration test's CPU vLLM image, found by its tag, not built again
        assert f"] CPU vLLM image {cpu_vllm_image}: on this engine already" in serve.stderr, serve.stderr[-2000:]
        steps = [line.removeprefix("serve-cpu: [").split("] ", 1) for line in serve.stderr.splitlines()
                 if line.startswith("serve-cpu: [") and "] step " in line]
        h.note("  at " + "; ".join(f"{at.strip()}: {what[:40]}" for at, what in steps))
        printed = [line.split(None, 1)[1] for line in serve.stdout.splitlines() if line.startswith(("check:", "stop:"))]
        assert printed == local[CHECK:], f"the command printed {printed}, README.md says {local[CHECK:]}"

        check = h.run(["bash", "-c", local[CHECK]], cwd=checkout, env=env, timeout=300, what="README: curl")
        body = json.loads(check.stdout)
        tokens = body["choices"][0]["token_ids"]
        assert len(tokens) == 8 and all(isinstance(t, int) for t in tokens), body
        h.note(f"readme 2: the README's curl: 8 tokens {tokens}, {check.seconds:.1f}s")

        stop = h.run(["bash", "-c", local[STOP]], cwd=checkout, env=env, check=False, what="README: stop")
        assert stop.returncode == 0, stop.stderr[-2000:]
        left = subprocess.run(["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}",
                               "--format", "{{.Names}}"], capture_output=True, text=True, check=True).stdout.split()
        assert left == [], f"the README's stop command left {left}"
        h.note(f"readme 3: the README's stop command: {stop.seconds:.1f}s; all three: {time.monotonic() - t0:.1f}s")
    finally:
        h.run(cleanup, cwd=checkout, env={**env, "RENDER_GID": "0"}, check=False, what="clean up (down -v)")
