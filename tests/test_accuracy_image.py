"""`selftest accuracy` inside the ci image built on the CPU vLLM image (marker `docker`): the
integration test's fixtures (Debian base, CPU vLLM image, build context copy), the CPU path's ci-cpu
bake target under this test's own tag, `docker run IMAGE selftest accuracy --json --junit` with a results folder
mounted, as an AMD host runs it (amd-runner/selftest.sh).

Two real vLLM API servers in the container, one after the other: this backend's CPU development
mode (cpu-plugin) and vLLM's CPU_MLA (cpu-vllm), the tiny model with seeded weights and its
tokenizer mounted, the tiny_mla tasks' data mounted at the default ACCURACY_DATA (/data/accuracy),
lm-eval offline. Every container runs with `--network none` (an air-gapped host: loopback only, no
hub, no PyPI). Checks:

1. without the dataset (nothing mounted at /data/accuracy, the default gsm8k tasks): one error
   line saying what to mount, the failed-suite exit status (1), no server started (first: it
   needs only the image, whose build is then its setup);
2. the gate passes: suite passed, its four checks passed in selftest.json and JUnit, both
   backends answer the same 30 of 40 questions with identical responses;
3. with the engine tests' decode fault in this backend's server processes
   (ROCM_VLLM_TEST_FAULT=last-slot-off-by-one, backend/tests/engine mounted), and vLLM's CPU_MLA
   taken from run 2's results (ACCURACY_REFERENCE, not served again), the suite fails and names the
   questions this backend lost, in JUnit, selftest.json and the output.

Figures go to the terminal summary. The gate's command line without data, in the test venv:
runtime/tests/test_accuracy_cpu.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import test_engine_integration as integration
from test_engine_integration import IMAGE_PREFIX, ROOT, own_target_image

# The integration test's fixtures (pytest collects fixtures among a module's globals).
h, cpu_vllm_image, context_dir = integration.h, integration.cpu_vllm_image, integration.context_dir

pytestmark = pytest.mark.docker(unit="second")
ENGINE_LOG_SUFFIX = "accuracy"
CI_TAG = f"{IMAGE_PREFIX}/ci:cpu-accuracy"
MODEL = "/models/tiny-mla-seeded"
REFERENCE = "/data/accuracy-reference"  # where an earlier run's results are mounted, as amd-runner/selftest.sh does
QUESTIONS, RIGHT = 40, 30  # what runtime/models/tiny_mla_accuracy.py wrote
CHECKS = ("test_backend_served_and_evaluated[cpu-plugin]", "test_backend_served_and_evaluated[cpu-vllm]",
          "test_not_significantly_fewer_right[cpu-vllm]", "test_loglikelihoods_agree[cpu-vllm]")
# vLLM's CPU platform told the CPU has AMX tiles (tests/fake_amx, mounted): the same selection on
# every CI machine, as in the integration test
FAKE_AMX_ENV = {"PYTHONPATH": "/opt/fake_amx", "ROCM_VLLM_FAKE_AMX": "1"}
SETTINGS = {
    "ROCM_VLLM_REQUIRE_GPU": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
    # vLLM's sampler computes the ranks of the log-probabilities lm-eval asks for with a function
    # wrapped in torch.compile (batched_count_greater_than), which Inductor compiles on the CPU
    # platform even with --enforce-eager; the CPU vLLM image has no C++ compiler (ROCm images do),
    # so every server would die at the first loglikelihood request (InvalidCxxCompiler). Eager:
    # the same tensor operations.
    "TORCHDYNAMO_DISABLE": "1",
    "ACCURACY_BACKENDS": "cpu-plugin,cpu-vllm", "ACCURACY_TASKS": "tiny_mla_gen",
    "ACCURACY_LOGLIK_TASKS": "tiny_mla_loglik", "ACCURACY_NUM_FEWSHOT": "0", "ACCURACY_LIMIT": "0",
    # one request at a time: vLLM 0.32's CPU engine answers this model differently in a shared batch
    "ACCURACY_CONCURRENCY": "1", "ACCURACY_START_TIMEOUT": "600",
    "ACCURACY_SERVE_ARGS": f"--model {MODEL} --dtype float32 --max-model-len 256 --max-num-seqs 4 "
                           "--gpu-memory-utilization 0.5 --enforce-eager --seed 0",
}


@pytest.fixture(scope="module")
def ci_image(h, cpu_vllm_image, context_dir) -> str:
    return own_target_image(h, cpu_vllm_image, context_dir, "ci-cpu", CI_TAG, "accuracy")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_mla_weights import write_tiny_mla  # runtime/models, on pytest.ini's pythonpath

    out = write_tiny_mla(tmp_path_factory.mktemp("tiny-mla-seeded"), seed=0)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "runtime/models/tiny-mla" / name, out / name)
    return out


def selftest(h, image: str, results: Path, what: str, mounts: dict[str, Path], env: dict[str, str],
             timeout: int = 1500):
    """`docker run IMAGE selftest accuracy` with the results folder at /results, no network but
    loopback; the container is removed afterwards even when the command times out."""
    results.mkdir(parents=True, exist_ok=True)
    name = f"rocm-vllm-accuracy-{os.getpid()}-{results.parent.name}"
    cmd = ["docker", "run", "--rm", "--name", name, "--network", "none", "--shm-size", "2g",
           "-v", f"{results}:/results"]
    for target, source in mounts.items():
        cmd += ["-v", f"{source}:{target}:ro"]
    for key, value in env.items():
        cmd += ["-e", f"{key}={value}"]
    cmd += [image, "selftest", "accuracy", "--json", "/results/selftest.json", "--junit", "/results/selftest.xml"]
    try:
        return h.run(cmd, timeout=timeout, check=False, what=what)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def gate(h, image: str, results: Path, model: Path, what: str, mounts=None, **env: str):
    """The gate on the tiny_mla tasks: the model at MODEL, their data at the default ACCURACY_DATA."""
    mounts = {MODEL: model, "/data/accuracy": ROOT / "runtime/models/tiny-mla-accuracy",
              "/opt/fake_amx": ROOT / "tests/fake_amx", **(mounts or {})}
    return selftest(h, image, results, what, mounts,
                    {**SETTINGS, **FAKE_AMX_ENV, **integration.SHARED_CORES_ENV, **env})


def cases(results: Path) -> dict[str, tuple[str, str]]:
    """JUnit test case -> ('', '') (passed) or its failure's message and full report (the element text)."""
    out = {}
    for case in ET.parse(results / "selftest.xml").getroot().iter("testcase"):
        failure = case.find("failure")
        out[case.get("name")] = ("", "") if failure is None else (failure.get("message", ""), failure.text or "")
    return out


def gen_comparison(doc: dict) -> dict:
    return doc["comparisons"]["cpu-vllm"]["tasks"]["tiny_mla_gen"]["strip"]


# First: the check that needs only the ci image, so that the image's build is its setup, apart from the
# passing gate's run (the next test's setup).
def test_missing_dataset_is_one_line_and_a_failed_suite(h, ci_image, tmp_path):
    """Nothing mounted at /data/accuracy and the default tasks (gsm8k 5-shot, gsm8k_loglik)."""
    results = tmp_path / "results"
    proc = selftest(h, ci_image, results, "selftest accuracy without the dataset (ci image)", {},
                    {"ROCM_VLLM_REQUIRE_GPU": "0"}, timeout=600)
    h.note(f"accuracy 1: without the dataset: rc={proc.returncode}, {proc.seconds:.1f}s, "
           f"stderr {proc.stderr.strip()!r}")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = ("no data for gsm8k, gsm8k_loglik in /data/accuracy: mount a directory holding "
                "gsm8k/test.jsonl, gsm8k/train.jsonl (JSON lines")
    # the entrypoint's start-up line ([rocm-vllm] GPU check ...), then the one error line
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("[rocm-vllm] ")]
    assert len(lines) == 1 and lines[0].startswith("selftest: error: "), proc.stderr
    assert expected in lines[0] and "set ACCURACY_DATA" in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and "== accuracy" not in proc.stdout
    suite = json.loads((results / "selftest.json").read_text())["suites"][0]
    assert (suite["name"], suite["status"]) == ("accuracy", "failed") and expected in suite["reason"]


@pytest.fixture(scope="module")
def passing(h, ci_image, model, tmp_path_factory):
    """The gate without a fault, both backends served: (the run, its results folder)."""
    results = tmp_path_factory.mktemp("accuracy-passing") / "results"
    return gate(h, ci_image, results, model, "selftest accuracy (ci image)"), results


def test_accuracy_gate_passes_in_the_ci_image(h, passing):
    proc, results = passing
    report = json.loads((results / "selftest.json").read_text()) if (results / "selftest.json").is_file() else {}
    doc = report.get("accuracy") or {}
    runs = doc.get("runs", {})
    h.note(f"accuracy 2: selftest accuracy in the ci image: rc={proc.returncode}, {proc.seconds:.1f}s; "
           + "; ".join(f"{n}: server + lm-eval {r.get('total_s')}s (lm-eval {r.get('eval_s')}s)"
                       for n, r in runs.items()))
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert [(s["name"], s["status"], s["counts"]) for s in report["suites"]] == [("accuracy", "passed", {"passed": 4})]
    assert doc == json.loads((results / "accuracy.json").read_text())
    assert cases(results) == dict.fromkeys(CHECKS, ("", ""))
    assert doc["ok"] and doc["ours"] == "cpu-plugin" and list(doc["comparisons"]) == ["cpu-vllm"]
    for name, implementation in (("cpu-plugin", "vllm-aiter-mla"), ("cpu-vllm", "vllm")):
        run = runs[name]
        assert run["selected"] == {"attention_backends": ["CPU_MLA"], "implementation": implementation}, name
        assert run["problems"] == [] and run["scores"]["tiny_mla_gen"]["exact_match,strip"] == RIGHT / QUESTIONS
        samples = json.loads((results / Path(run["samples_file"]).name).read_text())
        assert len(samples["tiny_mla_gen"]) == QUESTIONS and len(samples["tiny_mla_loglik"]) == QUESTIONS
    gen = gen_comparison(doc)
    assert (gen["n"], gen["ours_correct"], gen["reference_correct"], gen["lost"], gen["won"]) == (
        QUESTIONS, RIGHT, RIGHT, 0, 0)
    assert gen["p_value"] == 1.0 and gen["identical_responses"] == QUESTIONS and gen["differing"] == []
    loglik = doc["comparisons"]["cpu-vllm"]["loglik"]["tiny_mla_loglik"]
    # fp32, and on CPU both backends share vLLM's prefill: the log-likelihoods agree far inside 1e-3
    assert loglik["n"] == QUESTIONS and loglik["ok"] and loglik["max_abs_diff"] <= 1e-3
    assert doc["settings"]["ll_tolerance"] == [1e-3, 1e-5] and doc["settings"]["dtype"] == "float32"
    assert "cpu-plugin vs cpu-vllm, tiny_mla_gen strip: 30 vs 30 of 40 right, 0 lost / 0 won, p = 1 -> ok" \
        in proc.stdout
    h.note(f"  {gen['ours_correct']} vs {gen['reference_correct']} of {gen['n']} right, "
           f"log-likelihoods max |diff| {loglik['max_abs_diff']:.3g}")


def test_accuracy_gate_fails_and_names_the_questions_with_the_decode_fault(h, ci_image, model, passing, tmp_path):
    """This backend served with the fault; vLLM's CPU_MLA taken from the passing run's results
    (ACCURACY_REFERENCE), as an AMD host re-checks an image against an earlier reference run."""
    earlier, reference = passing
    if earlier.returncode != 0:
        pytest.fail("the passing run failed (see test_accuracy_gate_passes_in_the_ci_image): no reference to take")
    results = tmp_path / "results"
    proc = gate(h, ci_image, results, model, "selftest accuracy with the decode fault (ci image)",
                {"/opt/engine_tests": ROOT / "backend/tests/engine", REFERENCE: reference},
                PYTHONPATH="/opt/fake_amx:/opt/engine_tests", ROCM_VLLM_TEST_FAULT="last-slot-off-by-one",
                ACCURACY_REFERENCE=REFERENCE)
    report = json.loads((results / "selftest.json").read_text()) if (results / "selftest.json").is_file() else {}
    doc = report.get("accuracy") or {}
    gen = gen_comparison(doc) if doc.get("comparisons") else {}
    h.note(f"accuracy 3: with the decode fault: rc={proc.returncode}, {proc.seconds:.1f}s; "
           + (f"{gen['ours_correct']} vs {gen['reference_correct']} of {gen['n']} right, {gen['lost']} lost / "
              f"{gen['won']} won, p = {gen['p_value']:.3g}" if gen else "no comparison"))
    assert proc.returncode == 1, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert [(s["name"], s["status"]) for s in report["suites"]] == [("accuracy", "failed")]
    assert not doc["ok"] and all(run["ok"] for run in doc["runs"].values())
    # only this backend was served: the reference came from the passing run
    assert doc["runs"]["cpu-vllm"]["reference"] == REFERENCE and "reference" not in doc["runs"]["cpu-plugin"]
    assert f"== accuracy cpu-vllm: taken from {REFERENCE} (an earlier run), not served" in proc.stdout
    assert not (results / "server-accuracy-cpu-vllm.log").exists()
    server_log = (results / Path(doc["runs"]["cpu-plugin"]["server_log"]).name).read_text()
    assert "ROCM_VLLM_TEST_FAULT: last-slot-off-by-one installed" in server_log
    assert gen["significant"] and gen["p_value"] < doc["settings"]["alpha"] and gen["lost"] > gen["won"]
    assert gen["ours_correct"] < gen["reference_correct"] == RIGHT
    lost = [q["doc_id"] for q in gen["differing"] if q["right"] == "reference"]
    assert lost and len(lost) == min(gen["lost"], 20)
    junit = cases(results)
    assert set(junit) == set(CHECKS)
    assert [name for name, (message, _) in junit.items() if message] == ["test_not_significantly_fewer_right[cpu-vllm]"]
    # the log-likelihoods come from the prefill, which both CPU backends share: the fault is in the decode
    assert junit["test_loglikelihoods_agree[cpu-vllm]"] == ("", "")
    message, text = junit["test_not_significantly_fewer_right[cpu-vllm]"]
    assert f"(questions {', '.join(lost)})" in message, message  # the lost questions, by id
    assert all(f" {d} (ours " in text for d in lost), text  # each with both answers, in the full report
    assert all(f"  question {d}: target " in proc.stdout for d in lost)
    h.note(f"  questions lost: {', '.join(lost)}")
