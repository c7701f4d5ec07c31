"""The accuracy gate through the selftest CLI against real vLLM API servers on CPU, scored by the real lm-eval.

The tiny model with seeded weights (runtime/models/tiny_mla_weights.py) and its tokenizer, the task
tiny_mla_gen / tiny_mla_loglik (ci/suites/accuracy_tasks, data written by
runtime/models/tiny_mla_accuracy.py: 40 questions, a correct backend scores 30), this project's CPU
development mode against vLLM's CPU_MLA. It passes; with the engine tests' decode fault
(ROCM_VLLM_TEST_FAULT=last-slot-off-by-one: one slot index off in this backend's decode plan) it
fails and names the questions. Without the data: one line, exit 1, no server started. lm-eval runs
offline (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1). Servers get the engine tests' environment (fake
AMX); requests go one at a time (ACCURACY_CONCURRENCY=1: vLLM 0.32's CPU engine answers this model
differently when questions share a batch). No timing is asserted.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from engine_setup import engine_env  # backend/tests/engine, on pytest.ini's pythonpath

REPO = Path(__file__).resolve().parents[2]
CI_DIR = REPO / "ci"
TINY = REPO / "runtime" / "models" / "tiny-mla"
DATA = REPO / "runtime" / "models" / "tiny-mla-accuracy"
QUESTIONS, RIGHT = 40, 30  # what runtime/models/tiny_mla_accuracy.py wrote


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_mla_weights import write_tiny_mla  # runtime/models, on pytest.ini's pythonpath

    out = write_tiny_mla(tmp_path_factory.mktemp("tiny-mla-seeded"), seed=0)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / name, out / name)
    return out


def accuracy_env(model: Path, **extra: str) -> dict[str, str]:
    serve = (f"--model {model} --dtype float32 --max-model-len 256 --max-num-seqs 4 "
             "--gpu-memory-utilization 0.5 --enforce-eager --seed 0")
    settings = dict(VLLM_CPU_KVCACHE_SPACE="1", SELFTEST_SUITES=str(CI_DIR / "suites"),
                    ACCURACY_BACKENDS="cpu-plugin,cpu-vllm", ACCURACY_TASKS="tiny_mla_gen",
                    ACCURACY_LOGLIK_TASKS="tiny_mla_loglik", ACCURACY_NUM_FEWSHOT="0", ACCURACY_LIMIT="0",
                    ACCURACY_CONCURRENCY="1", ACCURACY_DATA=str(DATA), ACCURACY_SERVE_ARGS=serve,
                    ACCURACY_PORT=str(free_port()), ACCURACY_START_TIMEOUT="600",
                    HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env = engine_env(**{**settings, **extra})
    env.pop("VLLM_PLUGINS", None)
    return env


def selftest(env: dict[str, str], results: Path) -> subprocess.CompletedProcess[str]:
    env = dict(env, SELFTEST_RESULTS_DIR=str(results))
    return subprocess.run([sys.executable, "-m", "rocm_vllm_runtime", "accuracy",
                           "--json", str(results / "selftest.json"), "--junit", str(results / "selftest.xml")],
                          env=env, cwd=results.parent, capture_output=True, text=True, timeout=1500)


def cases(results: Path) -> dict[str, str]:
    """JUnit test case -> '' (passed) or its failure message."""
    out = {}
    for case in ET.parse(results / "selftest.xml").getroot().iter("testcase"):
        failure = case.find("failure")
        out[case.get("name")] = "" if failure is None else failure.get("message", "")
    return out


@pytest.mark.engine
def test_gate_passes_for_the_cpu_backends_through_the_selftest_cli(model: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = selftest(accuracy_env(model), results)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]

    report = json.loads((results / "selftest.json").read_text())
    assert [(s["name"], s["status"], s["counts"]) for s in report["suites"]] == [("accuracy", "passed", {"passed": 4})]
    doc = report["accuracy"]
    assert doc == json.loads((results / "accuracy.json").read_text())
    assert doc["ok"] and doc["ours"] == "cpu-plugin" and list(doc["comparisons"]) == ["cpu-vllm"]
    for name, implementation in (("cpu-plugin", "vllm-aiter-mla"), ("cpu-vllm", "vllm")):
        run = doc["runs"][name]
        assert run["selected"] == {"attention_backends": ["CPU_MLA"], "implementation": implementation}, name
        assert run["problems"] == [] and run["scores"]["tiny_mla_gen"]["exact_match,strip"] == RIGHT / QUESTIONS
        samples = json.loads(Path(run["samples_file"]).read_text())  # lm-eval's own per-question records
        assert len(samples["tiny_mla_gen"]) == QUESTIONS and len(samples["tiny_mla_loglik"]) == QUESTIONS
    gen = doc["comparisons"]["cpu-vllm"]["tasks"]["tiny_mla_gen"]["strip"]
    assert (gen["n"], gen["ours_correct"], gen["reference_correct"], gen["lost"], gen["won"]) == (
        QUESTIONS, RIGHT, RIGHT, 0, 0)
    assert gen["p_value"] == 1.0 and gen["identical_responses"] == QUESTIONS and gen["differing"] == []
    loglik = doc["comparisons"]["cpu-vllm"]["loglik"]["tiny_mla_loglik"]
    # fp32, and on CPU both backends share vLLM's prefill: the log-likelihoods agree far inside 1e-3
    assert loglik["n"] == QUESTIONS and loglik["ok"] and loglik["max_abs_diff"] <= 1e-3
    assert doc["settings"]["ll_tolerance"] == [1e-3, 1e-5] and doc["settings"]["dtype"] == "float32"
    assert cases(results) == {
        "test_backend_served_and_evaluated[cpu-plugin]": "", "test_backend_served_and_evaluated[cpu-vllm]": "",
        "test_not_significantly_fewer_right[cpu-vllm]": "", "test_loglikelihoods_agree[cpu-vllm]": ""}
    line = "cpu-plugin vs cpu-vllm, tiny_mla_gen strip: 30 vs 30 of 40 right, 0 lost / 0 won, p = 1 -> ok"
    assert line in proc.stdout


@pytest.mark.engine
def test_gate_fails_and_names_the_questions_when_the_decode_is_wrong(model: Path, tmp_path: Path) -> None:
    """The engine tests' fault switch (backend/tests/engine/engine_driver.py install_fault), in the server
    processes through tests/fake_amx/sitecustomize.py: this backend's decode reads a wrong key."""
    results = tmp_path / "results"
    env = accuracy_env(model, ROCM_VLLM_TEST_FAULT="last-slot-off-by-one")
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO / "backend" / "tests" / "engine")])
    proc = selftest(env, results)
    assert proc.returncode == 1, proc.stdout[-5000:] + proc.stderr[-3000:]

    doc = json.loads((results / "selftest.json").read_text())["accuracy"]
    assert not doc["ok"] and all(run["ok"] for run in doc["runs"].values())
    assert "ROCM_VLLM_TEST_FAULT: last-slot-off-by-one installed" in Path(
        doc["runs"]["cpu-plugin"]["server_log"]).read_text()
    gen = doc["comparisons"]["cpu-vllm"]["tasks"]["tiny_mla_gen"]["strip"]
    assert gen["significant"] and gen["p_value"] < doc["settings"]["alpha"] and gen["lost"] > gen["won"]
    assert gen["ours_correct"] < gen["reference_correct"] == RIGHT
    lost = [q["doc_id"] for q in gen["differing"] if q["right"] == "reference"]
    assert len(lost) == min(gen["lost"], 20) and all(q["ours"] != q["reference"] for q in gen["differing"])
    message = cases(results)["test_not_significantly_fewer_right[cpu-vllm]"]
    assert f"question {lost[0]}" not in message  # the JUnit message names them by id:
    assert f"differing: {lost[0]} (ours " in message or f", {lost[0]} (ours " in message
    assert f"  question {lost[0]}: target " in proc.stdout
    # the log-likelihoods come from the prefill, which both CPU backends share: the fault is in the decode
    assert cases(results)["test_loglikelihoods_agree[cpu-vllm]"] == ""
    # what the summary prints
    print(f"fault: {gen['ours_correct']} vs {gen['reference_correct']} of {gen['n']} right, "
          f"{gen['lost']} lost / {gen['won']} won, p = {gen['p_value']:.3g}")


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
