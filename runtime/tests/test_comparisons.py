"""Comparisons of measured numbers (rocm_vllm_runtime.numeric.agree, the one comparison within a
tolerance): a non-finite value never agrees with anything. The accuracy gate's log-likelihood
comparison goes through it: a backend whose log-likelihood is nan or -inf fails the gate, whatever
the tolerance, and says which question."""
from __future__ import annotations

import math

import pytest

from rocm_vllm_runtime import accuracy


def questions(values: list[float]) -> dict:
    return {str(i): {"loglik": [v], "prompt": f"q{i}"} for i, v in enumerate(values)}


@pytest.mark.parametrize("bad", [math.nan, -math.inf, math.inf])
@pytest.mark.parametrize("tolerance", [(0.5, 0.02), (1e-3, 1e-5), (0.0, 0.0)])
def test_a_non_finite_log_likelihood_fails_the_comparison(bad, tolerance):
    result = accuracy.loglik_agreement(questions([-10.0, bad, -3.0]), questions([-10.0, -7.5, -3.0]), tolerance)
    assert result["ok"] is False and len(result["problems"]) == 1, result
    assert [r["doc_id"] for r in result["beyond"]] == ["1"]
    assert math.isinf(result["max_abs_diff"])
    # the reference side too
    result = accuracy.loglik_agreement(questions([-10.0, -7.5]), questions([-10.0, bad]), tolerance)
    assert result["ok"] is False, result


def test_finite_log_likelihoods_within_the_tolerance_agree():
    result = accuracy.loglik_agreement(questions([-10.0, -7.5]), questions([-10.1, -7.4]), (0.5, 0.02))
    assert result["ok"] is True and result["beyond"] == [] and result["max_abs_diff"] == pytest.approx(0.1)


def run(lls: list[float]) -> dict:
    return {"asked": {"attention_backend": "ROCM_AITER_MLA", "implementation": "x"}, "ok": True, "problems": [],
            "selected": {"attention_backends": ["ROCM_AITER_MLA"], "implementation": "x"}, "scores": {},
            "questions": {"gsm8k_loglik": {"loglik": questions(lls)}}}


def test_the_gate_fails_on_a_nan_log_likelihood():
    doc = accuracy.document({"plugin": run([-10.0, math.nan]), "vllm-aiter": run([-10.0, -4.0])},
                            accuracy.Settings(tasks=(), loglik_tasks=("gsm8k_loglik",)), "bfloat16", (0.5, 0.02))
    assert doc["ok"] is False
    assert doc["comparisons"]["vllm-aiter"]["loglik"]["gsm8k_loglik"]["ok"] is False
