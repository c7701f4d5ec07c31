"""The accuracy gate's task index (rocm_vllm_runtime.accuracy.task_manager): every task resolves to the
file lm-eval's whole index gives it, while the index read for the gate's own settings is a few
folders, not the ~14,000 task files lm-eval ships (seconds of CPU once per preflight and per backend).
Runs against the lm-eval the test environment installs (tests/requirements.lock)."""
from __future__ import annotations

from pathlib import Path

import pytest

from rocm_vllm_runtime import accuracy

accuracy._offline()  # as the gate does before lm-eval imports datasets, which reads it at import
lm_eval_tasks = pytest.importorskip("lm_eval.tasks", reason="lm-eval is not installed (tests/requirements.lock)")

TASKS_DIR = str(Path(__file__).resolve().parents[2] / "runtime/suites/accuracy_tasks")
REAL_MANAGER = lm_eval_tasks.TaskManager


@pytest.fixture(scope="module")
def whole():
    """lm-eval's whole index with the repository's tasks folder, built once (the old way)."""
    return REAL_MANAGER(include_path=TASKS_DIR)


@pytest.fixture()
def builds(monkeypatch, whole) -> list[str]:
    """The indexes task_manager builds: a narrowed one for real, the whole one answered by the fixture."""
    made: list[str] = []

    def manager(include_path=None, include_defaults=True, **kw):
        if include_defaults:
            assert include_path == TASKS_DIR, include_path
            made.append("whole")
            return whole
        made.append("narrowed")
        return REAL_MANAGER(include_path=include_path, include_defaults=False, **kw)

    monkeypatch.setattr(lm_eval_tasks, "TaskManager", manager)
    return made


@pytest.mark.parametrize(("tasks", "loglik", "expected"), [
    (("gsm8k",), ("gsm8k_loglik",), ["narrowed"]),  # the defaults: lm-eval's gsm8k and ours
    (("tiny_mla_gen",), ("tiny_mla_loglik",), ["narrowed"]),  # the CPU tests' tasks, ours alone
    (("arc_easy",), (), ["narrowed", "whole"]),  # in lm-eval's folder arc: not found by its name
    (("gsm8k", "gsm8k_cot"), (), ["narrowed"]),  # gsm8k_cot is in the folder gsm8k
])
def test_each_task_resolves_to_the_file_of_the_whole_index(builds, whole, tasks, loglik, expected):
    manager = accuracy.task_manager(accuracy.Settings(tasks=tasks, loglik_tasks=loglik, tasks_dir=TASKS_DIR))
    assert builds == expected
    for name in (*tasks, *loglik):
        assert manager.task_index[name].yaml_path == whole.task_index[name].yaml_path, name
    if builds == ["narrowed"]:
        assert len(manager.task_index) < 100 < len(whole.task_index), len(manager.task_index)


@pytest.mark.parametrize("name", ["../gsm8k", "gsm8k/gsm8k", "no_such_task", "..", "x" * 5000])
def test_a_name_that_is_no_task_is_refused_as_before(builds, name, tmp_path):
    settings = accuracy.Settings(tasks=(name,), loglik_tasks=(), tasks_dir=TASKS_DIR, data=str(tmp_path))
    with pytest.raises(accuracy.AccuracyError, match=r"is not a single lm-eval task"):
        accuracy.task_configs(settings)
    assert builds[-1] == "whole", builds


def test_a_task_of_the_tasks_folder_takes_precedence_over_lm_evals_as_in_the_whole_index(tmp_path):
    ours = tmp_path / "tasks"
    ours.mkdir()
    (ours / "gsm8k.yaml").write_text("task: gsm8k\ndataset_path: mine\noutput_type: generate_until\n"
                                     "test_split: test\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n")
    settings = accuracy.Settings(tasks=("gsm8k",), loglik_tasks=(), tasks_dir=str(ours))
    narrowed = accuracy.task_manager(settings)
    assert Path(narrowed.task_index["gsm8k"].yaml_path) == ours / "gsm8k.yaml"
    assert Path(REAL_MANAGER(include_path=str(ours)).task_index["gsm8k"].yaml_path) == ours / "gsm8k.yaml"
