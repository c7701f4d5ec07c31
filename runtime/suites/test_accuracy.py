"""Accuracy suite: the attention backends side by side on the same questions, scored by lm-eval
(`rocm_vllm_runtime.accuracy`).

One server per backend of ACCURACY_BACKENDS (default plugin,vllm-aiter,triton, as the bench suite),
one after the other, each evaluated by lm-eval on the same tasks with the same settings (default
gsm8k 5-shot on ACCURACY_LIMIT questions, and the log-likelihoods of gsm8k_loglik) against
ACCURACY_SERVE_ARGS (default DeepSeek-V2-Lite). The data is local (ACCURACY_DATA). Writes
$SELFTEST_RESULTS_DIR/accuracy.json, the server logs and lm-eval's samples next to it.

Checks: per backend, its server selected what it asks and lm-eval ran; per other backend, this
backend (the first) answers no significantly fewer questions right (exact one-sided McNemar test,
ACCURACY_ALPHA), and the log-likelihoods agree within the dtype's tolerance.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rocm_vllm_runtime import accuracy, bench, files, numeric

ENV = os.environ
NAMES = [n.strip() for n in (ENV.get("ACCURACY_BACKENDS") or accuracy.ENV_DEFAULTS["ACCURACY_BACKENDS"]).split(",")
         if n.strip()]
_KNOWN = bench.backends([])


def _marks(name: str) -> list:
    # GPU backends carry the gpu mark: where there is no AMD GPU they skip (also under CI).
    return [pytest.mark.gpu] if name in _KNOWN and _KNOWN[name].needs_gpu else []


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    chosen = bench.choose(NAMES, bench.backends(bench.plugin_names()))
    if kfd := bench.missing_device(chosen, ENV):
        pytest.skip(f"no {kfd}: no AMD GPU in this container to start servers on "
                    "(ACCURACY_BACKENDS=cpu-plugin,cpu-vllm runs on CPU)")
    settings = accuracy.Settings.from_env(ENV)
    serve_args = accuracy.split_serve_args(ENV)
    out = Path(ENV.get("SELFTEST_RESULTS_DIR") or tmp_path_factory.mktemp("accuracy"))
    port = numeric.port("ACCURACY_PORT", ENV.get("ACCURACY_PORT") or accuracy.ENV_DEFAULTS["ACCURACY_PORT"])
    start_timeout = numeric.duration("ACCURACY_START_TIMEOUT", ENV.get("ACCURACY_START_TIMEOUT")
                                     or accuracy.ENV_DEFAULTS["ACCURACY_START_TIMEOUT"])
    result = accuracy.compare(chosen, serve_args, settings, port, out, start_timeout)
    files.write_text(out / "accuracy.json", json.dumps(result, indent=2) + "\n")
    print("\n" + accuracy.render(result))
    return result


@pytest.mark.parametrize("name", [pytest.param(n, id=n, marks=_marks(n)) for n in NAMES])
def test_backend_served_and_evaluated(doc: dict, name: str) -> None:
    run = doc["runs"][name]
    assert run["ok"], "; ".join(run["problems"])
    assert run["selected"]["attention_backends"] == [run["asked"]["attention_backend"]]
    assert run["selected"]["implementation"] == run["asked"]["implementation"]


@pytest.mark.parametrize("other", [pytest.param(n, id=n, marks=_marks(n)) for n in NAMES[1:]])
def test_not_significantly_fewer_right(doc: dict, other: str) -> None:
    entry = doc["comparisons"][other]
    assert doc["runs"][doc["ours"]]["ok"] and doc["runs"][other]["ok"], "a run failed: nothing to compare"
    failed = [f"{task} {flt}: {'; '.join(r['problems'])}; differing: "
              + ", ".join(f"{q['doc_id']} (ours {q['ours']!r}, reference {q['reference']!r}, target {q['target']!r})"
                          for q in r["differing"])
              for task, filters in entry["tasks"].items() for flt, r in filters.items() if not r["ok"]]
    assert not failed, f"{doc['ours']} vs {other}: " + " | ".join(failed)


@pytest.mark.parametrize("other", [pytest.param(n, id=n, marks=_marks(n)) for n in NAMES[1:]])
def test_loglikelihoods_agree(doc: dict, other: str) -> None:
    entry = doc["comparisons"][other]
    assert doc["runs"][doc["ours"]]["ok"] and doc["runs"][other]["ok"], "a run failed: nothing to compare"
    failed = [f"{task}: {'; '.join(r['problems'])}" for task, r in entry["loglik"].items() if not r["ok"]]
    assert not failed, f"{doc['ours']} vs {other}: " + " | ".join(failed)
