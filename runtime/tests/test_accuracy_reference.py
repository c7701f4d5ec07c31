"""The accuracy gate's reference from an earlier run (ACCURACY_REFERENCE / --reference DIR): the
backends after the first are taken from that run's results folder (its accuracy.json and lm-eval
samples) instead of being served again, and compared question by question as if served now. A
folder that does not hold them, or holds them from other settings, is refused in one line before
any server starts.

No server here: `run_backend` (one server and lm-eval) is replaced by one that records whom it
would serve and answers from given samples (and lm-eval's task configs by none). The gate with real
servers, taking its reference from the passing run in the ci image: tests/test_accuracy_image.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rocm_vllm_runtime import accuracy, bench

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "runtime" / "models" / "tiny-mla-accuracy"
SERVE = ["--model", "/models/tiny-mla", "--dtype", "float32"]
SETTINGS = accuracy.Settings(tasks=("tiny_mla_gen",), loglik_tasks=("tiny_mla_loglik",), num_fewshot=0, limit=None,
                             concurrency=1, data=str(DATA), tasks_dir=str(REPO / "runtime/suites/accuracy_tasks"))
BACKENDS = bench.backends([])
OURS, REFERENCE = BACKENDS["cpu-plugin"], BACKENDS["cpu-vllm"]
QUESTIONS = 12


def samples(wrong: set[int] = frozenset(), prompt: str = "p") -> dict:
    """lm-eval samples of both tasks: every question right but those in `wrong`."""
    gen = [{"doc_id": i, "filter": "strip", "metrics": ["exact_match"], "exact_match": float(i not in wrong),
            "filtered_resps": ["x" if i in wrong else str(i)], "target": str(i), "prompt_hash": f"{prompt}{i}"}
           for i in range(QUESTIONS)]
    loglik = [{"doc_id": i, "filtered_resps": [[-1.5 * i, False]], "prompt_hash": f"{prompt}l{i}"}
              for i in range(QUESTIONS)]
    return {"tiny_mla_gen": gen, "tiny_mla_loglik": loglik}


def served_run(backend: bench.Backend, out_dir: Path, answered: dict) -> dict:
    """What run_backend returns after serving `backend`, its samples file written where it writes it."""
    samples_file = out_dir / f"lm-eval-samples-{backend.name}.json"
    samples_file.write_text(json.dumps(answered))
    return {"asked": {"attention_backend": backend.attention_backend, "implementation": backend.implementation},
            "server_log": str(out_dir / f"server-accuracy-{backend.name}.log"), "samples_file": str(samples_file),
            "selected": {"attention_backends": [backend.attention_backend], "implementation": backend.implementation},
            "ok": True, "problems": [], "scores": {},
            "questions": accuracy.per_question(answered, SETTINGS.loglik_tasks), "total_s": 1.0}


@pytest.fixture()
def serving(monkeypatch):
    """run_backend replaced: the names it was asked to serve, answering from SERVED[name]."""
    served: list[str] = []
    answers: dict[str, dict] = {}

    def run_backend(backend, serve_args, configs, settings, port, out_dir, start_timeout_s):
        served.append(backend.name)
        return served_run(backend, out_dir, answers.get(backend.name, samples()))

    monkeypatch.setattr(accuracy, "run_backend", run_backend)
    # lm-eval's task index takes seconds to build; the tasks' data are not what is tested here
    monkeypatch.setattr(accuracy, "task_configs", lambda settings: [])
    return served, answers


@pytest.fixture()
def earlier(tmp_path, serving) -> Path:
    """The results folder of an earlier gate that served both backends, as the suite writes it."""
    folder = tmp_path / "earlier"
    doc = accuracy.compare([OURS, REFERENCE], SERVE, SETTINGS, 0, folder, 1)
    (folder / "accuracy.json").write_text(json.dumps(doc, indent=2))
    serving[0].clear()
    return folder


def test_the_reference_backends_are_taken_from_the_earlier_run_not_served(earlier, serving, tmp_path):
    served, _ = serving
    doc = accuracy.compare([OURS, REFERENCE], SERVE, replace(SETTINGS, reference=str(earlier)), 0, tmp_path / "now", 1)
    assert served == ["cpu-plugin"]
    assert doc["ok"] and doc["runs"]["cpu-vllm"]["reference"] == str(earlier)
    gen = doc["comparisons"]["cpu-vllm"]["tasks"]["tiny_mla_gen"]["strip"]
    assert (gen["n"], gen["reference_correct"], gen["lost"]) == (QUESTIONS, QUESTIONS, 0)
    assert doc["comparisons"]["cpu-vllm"]["loglik"]["tiny_mla_loglik"]["n"] == QUESTIONS
    assert doc["settings"]["reference"] == str(earlier) and doc["settings"]["serve_args"] == SERVE


def test_a_worse_backend_fails_against_the_reference_naming_the_questions(earlier, serving, tmp_path):
    _, answers = serving
    answers["cpu-plugin"] = samples(wrong={1, 4, 5, 7, 8, 9, 10, 11})
    doc = accuracy.compare([OURS, REFERENCE], SERVE, replace(SETTINGS, reference=str(earlier)), 0, tmp_path / "now", 1)
    gen = doc["comparisons"]["cpu-vllm"]["tasks"]["tiny_mla_gen"]["strip"]
    assert not doc["ok"] and gen["significant"] and gen["lost"] == 8 and gen["won"] == 0
    assert [q["doc_id"] for q in gen["differing"]] == ["1", "4", "5", "7", "8", "9", "10", "11"]


def test_other_prompts_than_the_references_fail_both_comparisons(earlier, serving, tmp_path):
    _, answers = serving
    answers["cpu-plugin"] = samples(prompt="q")
    doc = accuracy.compare([OURS, REFERENCE], SERVE, replace(SETTINGS, reference=str(earlier)), 0, tmp_path / "now", 1)
    entry = doc["comparisons"]["cpu-vllm"]
    assert not doc["ok"]
    for result in (entry["tasks"]["tiny_mla_gen"]["strip"], entry["loglik"]["tiny_mla_loglik"]):
        assert any("different prompts for 12 questions" in p for p in result["problems"]), result["problems"]


def _edit_doc(folder: Path, edit) -> None:
    doc = json.loads((folder / "accuracy.json").read_text())
    edit(doc)
    (folder / "accuracy.json").write_text(json.dumps(doc))


def _replace_by_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _replace_by_link(path: Path, target: str) -> None:
    path.unlink()
    path.symlink_to(target)


REFUSALS = {
    "no accuracy.json": (lambda f: (f / "accuracy.json").unlink(), "cannot read"),
    "not JSON": (lambda f: (f / "accuracy.json").write_text("{"), "not an accuracy gate's JSON"),
    "other tasks": (lambda f: _edit_doc(f, lambda d: d["settings"].update(tasks=["gsm8k"])), "had tasks ['gsm8k']"),
    "other shots": (lambda f: _edit_doc(f, lambda d: d["settings"].update(num_fewshot=5)), "had num_fewshot 5"),
    "other limit": (lambda f: _edit_doc(f, lambda d: d["settings"].update(limit=10)), "had limit 10"),
    "other dtype": (lambda f: _edit_doc(f, lambda d: d["settings"].update(dtype="bfloat16")), "had dtype"),
    "other model": (lambda f: _edit_doc(f, lambda d: d["settings"].update(serve_args=["--model", "x"])),
                    "had serve_args ['--model', 'x']"),
    "no serve args recorded": (lambda f: _edit_doc(f, lambda d: d["settings"].pop("serve_args")),
                               "had serve_args None"),
    "no such run": (lambda f: _edit_doc(f, lambda d: d["runs"].pop("cpu-vllm")), "no run of cpu-vllm there"),
    "a failed run": (lambda f: _edit_doc(f, lambda d: d["runs"]["cpu-vllm"].update(ok=False, problems=["died"])),
                     "its run of cpu-vllm failed (died)"),
    "samples gone": (lambda f: (f / "lm-eval-samples-cpu-vllm.json").unlink(), "cannot read the lm-eval samples"),
    "samples not JSON": (lambda f: (f / "lm-eval-samples-cpu-vllm.json").write_text("]"),
                         "cannot read the lm-eval samples"),
    # opening a FIFO would wait for a writer: refused before it is opened
    "accuracy.json a FIFO": (lambda f: _replace_by_fifo(f / "accuracy.json"), "is not a regular file (it is a FIFO)"),
    "samples a FIFO": (lambda f: _replace_by_fifo(f / "lm-eval-samples-cpu-vllm.json"),
                       "is not a regular file (it is a FIFO)"),
    "accuracy.json a device": (lambda f: _replace_by_link(f / "accuracy.json", "/dev/zero"),
                               "is not a regular file (it is a device)"),
    "samples file named ..": (lambda f: _edit_doc(f, lambda d: d["runs"]["cpu-vllm"].update(samples_file="/x/..")),
                              "is not a plain name"),
}


def test_the_command_line_refuses_a_bad_reference_in_one_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SELFTEST_SUITES": str(REPO / "runtime/suites"),
           "ACCURACY_BACKENDS": "cpu-plugin,cpu-vllm", "ACCURACY_TASKS": "tiny_mla_gen",
           "ACCURACY_LOGLIK_TASKS": "tiny_mla_loglik", "ACCURACY_NUM_FEWSHOT": "0", "ACCURACY_DATA": str(DATA)}
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.accuracy", "--reference", str(tmp_path / "none"),
                           "--", *SERVE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"accuracy: error: ACCURACY_REFERENCE={tmp_path / 'none'}: cannot read {tmp_path / 'none' / 'accuracy.json'}: "
        "No such file or directory; it must be a folder an earlier gate wrote accuracy.json and its lm-eval samples "
        "to"], proc.stderr
    assert "== accuracy" not in proc.stdout


# ------------------------------------------------------------------ data of the wrong shape
# The folder's files are checked against the schemas accuracy.py declares (accuracy.RESULTS_SCHEMA,
# accuracy.samples_schema) as they are read: a wrong shape is one line naming the file and the field,
# never a traceback deep in the comparison or the report.

def _edit_samples(folder: Path, edit) -> None:
    path = folder / "lm-eval-samples-cpu-vllm.json"
    doc = json.loads(path.read_text())
    doc = edit(doc) or doc
    path.write_text(json.dumps(doc))


def _run(edit):
    return lambda f: _edit_doc(f, lambda d: edit(d["runs"]["cpu-vllm"]))


SHAPES = {
    "problems a number": (_run(lambda r: r.update(ok=False, problems=5)), "accuracy.json: runs.cpu-vllm.problems"),
    "ok a string": (_run(lambda r: r.update(ok="yes")), "accuracy.json: runs.cpu-vllm.ok"),
    "selected a list": (_run(lambda r: r.update(selected=["TRITON_MLA"])), "accuracy.json: runs.cpu-vllm.selected"),
    "scores not numbers": (_run(lambda r: r.update(scores={"tiny_mla_gen": {"exact_match,strip": "high"}})),
                           "accuracy.json: runs.cpu-vllm.scores.tiny_mla_gen.exact_match,strip"),
    "a run a list": (lambda f: _edit_doc(f, lambda d: d["runs"].update({"cpu-vllm": []})),
                     "accuracy.json: runs.cpu-vllm: must be an object, not a list"),
    "the document a list": (lambda f: (f / "accuracy.json").write_text("[]"),
                            "accuracy.json: the whole: must be an object, not a list"),
    "accuracy.json nested deeply": (lambda f: (f / "accuracy.json").write_text("[" * 100000 + "]" * 100000),
                                    "accuracy.json: nested deeper than"),
    "a key twice": (lambda f: (f / "accuracy.json").write_text('{"runs": {}, "runs": {}, "settings": {}}'),
                    "accuracy.json: the key 'runs' appears twice"),
    "samples a list": (lambda f: _edit_samples(f, lambda d: [d]),
                       "lm-eval-samples-cpu-vllm.json: the whole: must be an object, not a list"),
    "rows a number": (lambda f: _edit_samples(f, lambda d: d.update(tiny_mla_gen=5)),
                      "lm-eval-samples-cpu-vllm.json: tiny_mla_gen: must be a list, not a number"),
    "a row a number": (lambda f: _edit_samples(f, lambda d: d["tiny_mla_gen"].insert(0, 7)),
                       "lm-eval-samples-cpu-vllm.json: tiny_mla_gen[0]: must be an object"),
    "a row without doc_id": (lambda f: _edit_samples(f, lambda d: d["tiny_mla_gen"][1].__delitem__("doc_id")),
                             "tiny_mla_gen[1].doc_id: is missing"),
    "filter a list": (lambda f: _edit_samples(f, lambda d: d["tiny_mla_gen"][0].update(filter=["strip"])),
                      "tiny_mla_gen[0].filter: must be a string"),
    "log-likelihood a string": (lambda f: _edit_samples(
        f, lambda d: d["tiny_mla_loglik"][2].update(filtered_resps=[["high", False]])),
        "tiny_mla_loglik[2].filtered_resps[0][0]: must be a number or true or false, not a string"),
    "no log-likelihood": (lambda f: _edit_samples(f, lambda d: d["tiny_mla_loglik"][0].update(filtered_resps=[[]])),
                          "tiny_mla_loglik[0].filtered_resps[0]: holds fewer than 1 entries"),
    "samples nested deeply": (lambda f: (f / "lm-eval-samples-cpu-vllm.json").write_text("[" * 5000 + "]" * 5000),
                              "lm-eval-samples-cpu-vllm.json: nested deeper than"),
}


@pytest.mark.parametrize("case", [*REFUSALS, *SHAPES])
def test_a_folder_that_cannot_be_a_reference_is_refused_before_any_server(case, earlier, serving, tmp_path):
    """One line naming the folder and what is wrong with it (for data of the wrong shape: the file
    and the field), before any server starts."""
    spoil, named = {**REFUSALS, **SHAPES}[case]
    spoil(earlier)
    with pytest.raises(accuracy.AccuracyError) as refused:
        accuracy.compare([OURS, REFERENCE], SERVE, replace(SETTINGS, reference=str(earlier)), 0, tmp_path / "now", 1)
    message = str(refused.value)
    assert message.startswith(f"ACCURACY_REFERENCE={earlier}: ") and named in message and "\n" not in message, message
    assert serving[0] == []


def test_a_reference_score_named_without_a_filter_is_shown(earlier, serving, tmp_path):
    _run(lambda r: r.update(scores={"tiny_mla_gen": {"exact_match": 0.5}}))(earlier)
    doc = accuracy.compare([OURS, REFERENCE], SERVE, replace(SETTINGS, reference=str(earlier)), 0, tmp_path / "now", 1)
    assert "tiny_mla_gen  0.500" in accuracy.render(doc)
