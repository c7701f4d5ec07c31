"""The OpenAI-compatible server on 127.0.0.1 with the backend's CPU development mode:
same tokens as the offline engine, and a clean stop with no process left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from processes import group_running

from engine_setup import engine_env
from engine_driver import SEQUENTIAL_PROMPTS, prompts
from engine_report import REPORT

pytestmark = pytest.mark.engine

MAX_TOKENS = 32
START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, payload: dict | None = None, timeout: float = 120) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body else {}


def wait_healthy(base: str, proc: subprocess.Popen, log: Path) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < START_TIMEOUT_S:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode} before /health:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    pytest.fail(f"server not healthy after {START_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")


group_alive = group_running  # tests/processes.py: a zombie of the group has ended


@pytest.fixture(scope="module")
def server(tiny_weights, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("server")
    port, log, stats = free_port(), workdir / "server.log", workdir / "stats.txt"
    env = engine_env(AITER_MLA_KERNELS="reference", AITER_MLA_STATS=str(stats), VLLM_CPU_KVCACHE_SPACE="1")
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_weights), "--load-format", "safetensors", "--skip-tokenizer-init",
        "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "16",
        "--gpu-memory-utilization", "0.5", "--enforce-eager", "--seed", "0",
        "--host", "127.0.0.1", "--port", str(port),
        # CPU_MLA named: the (faked) AMX CPU would otherwise get AMX_MLA; the plugin's CPU
        # development mode points CPU_MLA at this backend.
        "--attention-backend", "CPU_MLA",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    state = {"proc": proc, "base": base, "log": log, "stats": stats, "pgid": os.getpgid(proc.pid)}
    try:
        state["start_s"] = wait_healthy(base, proc, log)
        yield state
    finally:
        if proc.poll() is None:
            os.killpg(state["pgid"], signal.SIGKILL)
            proc.wait(timeout=30)


def completion(base: str, prompt: list[int]) -> list[int]:
    body = http_json(f"{base}/v1/completions", {
        "model": http_json(f"{base}/v1/models")["data"][0]["id"],
        "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True,
    })
    return body["choices"][0]["token_ids"]


def test_health_probe_passes_against_the_real_server(server):
    """The image's health probe (rocm_vllm_runtime.health): /health and one generated token."""
    for extra in ([], ["--generate"]):
        proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.health", "--url", server["base"], *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"health {extra}: {proc.stderr}"


def test_server_completions_equal_offline_engine_and_stop_cleanly(server, engine_runs):
    # The client sends one request after another: compare with the offline engine
    # serving the same requests one at a time (same batch shapes, same arithmetic).
    offline = engine_runs.get("ours", schedule="sequential")["results"]
    assert sorted(offline, key=int) == [str(i) for i in range(SEQUENTIAL_PROMPTS)]
    for i, prompt in enumerate(prompts()[:SEQUENTIAL_PROMPTS]):
        assert completion(server["base"], prompt) == offline[str(i)]["token_ids"], f"request {i}"

    proc, pgid = server["proc"], server["pgid"]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    deadline = time.monotonic() + 60
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not group_alive(pgid), "server left processes behind after SIGTERM"
    # The backend ran in the engine process (one line per process that decoded).
    lines = server["stats"].read_text().splitlines() if server["stats"].exists() else []
    per_pid: dict[str, int] = {}
    for line in lines:
        pid, count = line.split(" decode_calls=")
        per_pid[pid] = max(per_pid.get(pid, 0), int(count))
    calls = sum(per_pid.values())
    REPORT.append(f"server: healthy after {server['start_s']:.1f}s, {SEQUENTIAL_PROMPTS} completions equal offline, "
                  f"decode calls {calls}, exit code {proc.returncode}")
    assert calls > 0
    log = server["log"].read_text()
    assert "Using CPU_MLA backend" in log and "AMX_MLA" not in log, "the server did not run CPU_MLA"
    assert "vllm-aiter-mla CPU development mode" in log
