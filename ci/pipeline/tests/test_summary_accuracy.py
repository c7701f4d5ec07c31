"""The pipeline summary's accuracy row: the real selftest CLI runs a stand-in accuracy suite that writes
an accuracy.json built by the real comparison (rocm_vllm_runtime.accuracy.document), then
`python -m ci.pipeline summary` renders it next to the other suites."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.pipeline import summary
from rocm_vllm_runtime import accuracy

REPO = Path(__file__).resolve().parents[3]


def questions(right: list[bool], lls: list[float]) -> dict:
    gen = {str(i): {"correct": r, "response": "a" if r else "b", "target": "a", "prompt": f"p{i}"}
           for i, r in enumerate(right)}
    loglik = {str(i): {"loglik": [v], "prompt": f"q{i}"} for i, v in enumerate(lls)}
    return {"gsm8k": {"strict-match": gen}, "gsm8k_loglik": {"loglik": loglik}}


def run(name: str, impl: str, right: list[bool], lls: list[float]) -> dict:
    return {"asked": {"attention_backend": "ROCM_AITER_MLA", "implementation": impl}, "ok": True, "problems": [],
            "selected": {"attention_backends": ["ROCM_AITER_MLA"], "implementation": impl},
            "scores": {"gsm8k": {"exact_match,strict-match": sum(right) / len(right)}},
            "questions": questions(right, lls)}


def summary_of(tmp_path: Path, ours: list[bool], ours_ll: list[float] | None = None) -> tuple[int, str]:
    theirs = [True] * 8 + [False] * 2
    doc = accuracy.document({"plugin": run("plugin", "vllm-aiter-mla", ours, ours_ll or [-10.0] * 10),
                             "vllm-aiter": run("vllm-aiter", "vllm", theirs, [-10.1] * 10)},
                            accuracy.Settings(alpha=0.01), "bfloat16", (0.5, 0.02))
    suites, results = tmp_path / "suites", tmp_path / "results"
    suites.mkdir()
    results.mkdir()
    (suites / "test_accuracy.py").write_text(
        "import json, os, pathlib\n\ndef test_gate():\n"
        f"    doc = json.loads({json.dumps(json.dumps(doc))})\n"
        "    pathlib.Path(os.environ['SELFTEST_RESULTS_DIR'], 'accuracy.json').write_text(json.dumps(doc))\n"
        "    assert doc['ok']\n")
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text('{"question": "q", "answer": "a #### 1"}\n')
    env = {**os.environ, "SELFTEST_SUITES": str(suites), "SELFTEST_RESULTS_DIR": str(results),
           "ACCURACY_DATA": str(tmp_path / "data"), "ACCURACY_TASKS_DIR": str(REPO / "runtime/suites/accuracy_tasks")}
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime", "accuracy", "--json",
                           str(results / "selftest.json")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    summary = subprocess.run([sys.executable, "-m", "ci.pipeline", "summary", str(results)], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert summary.returncode == 0, summary.stderr
    return proc.returncode, summary.stdout


def test_the_summary_shows_the_accuracy_row(tmp_path: Path) -> None:
    code, text = summary_of(tmp_path, [True] * 8 + [False, True])
    assert code == 0
    row = next(line for line in text.splitlines() if line.startswith("| accuracy |"))
    assert row == ("| accuracy | passed | 1 passed | plugin: ROCM_AITER_MLA (vllm-aiter-mla) · "
                   "vllm-aiter: ROCM_AITER_MLA (vllm) | plugin vs vllm-aiter gsm8k strict-match: 9/10 vs 8/10 right, "
                   "0 lost / 1 won, p 1 · gsm8k_loglik max Δ log-likelihood 0.1 (atol 0.5, rtol 0.02) |")


def test_a_failed_gate_shows_in_the_row(tmp_path: Path) -> None:
    code, text = summary_of(tmp_path, [False] * 8 + [False, False])
    assert code == 1
    row = next(line for line in text.splitlines() if line.startswith("| accuracy |"))
    assert "plugin vs vllm-aiter gsm8k strict-match: 0/10 vs 8/10 right, 8 lost / 0 won, p 0.0039 FAILED" in row


@pytest.mark.parametrize("bad", [math.nan, -math.inf])
def test_a_non_finite_log_likelihood_fails_the_gate_and_shows_failed(tmp_path: Path, bad: float) -> None:
    code, text = summary_of(tmp_path, [True] * 8 + [False, True], [-10.0] * 9 + [bad])
    assert code == 1
    row = next(line for line in text.splitlines() if line.startswith("| accuracy |"))
    assert "gsm8k_loglik max Δ log-likelihood inf (atol 0.5, rtol 0.02) FAILED" in row, row


@pytest.mark.parametrize("recorded", [float("inf"), float("nan"), "Infinity", None])
def test_a_comparison_recorded_ok_with_a_non_finite_number_shows_failed(recorded) -> None:
    """An accuracy.json that says ok beside a number that is not finite (as the gate wrote before
    a non-finite value stopped agreeing): the summary never shows it as passed."""
    acc = {"ours": "plugin", "comparisons": {"vllm-aiter": {"ok": True, "tasks": {}, "loglik": {
        "gsm8k_loglik": {"n": 10, "max_abs_diff": recorded, "tolerance": [0.5, 0.02], "ok": True}}}}}
    cell = summary.accuracy_cell(json.loads(json.dumps(acc)))
    assert cell.endswith("FAILED") or "not recorded" in cell, cell
