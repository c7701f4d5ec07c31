"""The accuracy gate's command line against the test environment: without its data, one line and
a failed suite, no server started, through the selftest CLI and the gate's own.

The gate itself, passing for this project's CPU development mode against vLLM's CPU_MLA and failing
with the engine tests' decode fault (naming the questions), runs with the same servers and lm-eval
inside the ci image: tests/test_accuracy_image.py. It runs there only, once each: the two runs
take minutes, and the image is where the gate runs on an AMD host.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine_setup import engine_env  # backend/tests/engine, on pytest.ini's pythonpath

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "runtime" / "models" / "tiny-mla-accuracy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accuracy_env(model: Path, **extra: str) -> dict[str, str]:
    serve = (f"--model {model} --dtype float32 --max-model-len 256 --max-num-seqs 4 "
             "--gpu-memory-utilization 0.5 --enforce-eager --seed 0")
    settings = dict(VLLM_CPU_KVCACHE_SPACE="1", SELFTEST_SUITES=str(REPO / "runtime" / "suites"),
                    ACCURACY_BACKENDS="cpu-plugin,cpu-vllm", ACCURACY_TASKS="tiny_mla_gen",
                    ACCURACY_LOGLIK_TASKS="tiny_mla_loglik", ACCURACY_NUM_FEWSHOT="0", ACCURACY_LIMIT="0",
                    ACCURACY_CONCURRENCY="1", ACCURACY_DATA=str(DATA), ACCURACY_SERVE_ARGS=serve,
                    ACCURACY_PORT=str(free_port()), ACCURACY_START_TIMEOUT="600",
                    HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env = engine_env(**{**settings, **extra})
    env.pop("VLLM_PLUGINS", None)
    return env


@pytest.mark.parametrize("command", [["-m", "rocm_vllm_runtime", "accuracy"], ["-m", "rocm_vllm_runtime.accuracy"]],
                         ids=["selftest", "accuracy-cli"])
def test_missing_data_is_one_line_and_a_failed_suite(tmp_path: Path, command: list[str]) -> None:
    env = accuracy_env(tmp_path / "no-model", ACCURACY_DATA=str(tmp_path / "empty"),
                       ACCURACY_TASKS="gsm8k", ACCURACY_LOGLIK_TASKS="gsm8k_loglik", ACCURACY_NUM_FEWSHOT="5",
                       SELFTEST_RESULTS_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, *command, "--json", str(tmp_path / "out.json")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    expected = (f"no data for gsm8k, gsm8k_loglik in {tmp_path / 'empty'}: mount a directory holding "
                "gsm8k/test.jsonl, gsm8k/train.jsonl (JSON lines")
    assert len(errors) == 1 and expected in errors[0] and "set ACCURACY_DATA" in errors[0], proc.stderr
    assert "== accuracy" not in proc.stdout and "== selftest accuracy" not in proc.stdout  # no server, no pytest
    if command[-1] == "accuracy":
        doc = json.loads((tmp_path / "out.json").read_text())
        assert doc["suites"][0]["status"] == "failed" and expected in doc["suites"][0]["reason"]
