"""A model with 8 attention heads per GPU (DeepSeek-V2-Lite at TP 2, Kimi-K2 at TP 8) runs
through the backend inside vLLM 0.32's real CPU engine: its decode pads the queries to 16
heads (AITER has no kernel below 16) and the greedy tokens equal vLLM's own CPU_MLA (fp32)."""

from __future__ import annotations

import pytest
from test_engine_cpu import MAX_TOKENS, compare

from engine_report import REPORT

pytestmark = pytest.mark.engine


def test_8_heads_fp32_tokens_identical_to_cpu_mla(engine_runs):
    ours, theirs = engine_runs.get("ours", heads=8), engine_runs.get("cpu_mla", heads=8)
    assert ours["decode_calls"] >= 2 * (MAX_TOKENS - 1)
    agree, max_diff, n = compare(ours, theirs)
    REPORT.append(f"8 heads, fp32: {agree:.0%} of {n} requests identical, max logprob diff {max_diff:.2e}")
    assert agree == 1.0
    assert max_diff <= 1e-4
