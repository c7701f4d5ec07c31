"""A model with 8 attention heads per GPU (DeepSeek-V2-Lite at TP 2, Kimi-K2 at TP 8) runs
through the backend inside vLLM 0.32's real CPU engine: its decode pads the queries to 16
heads (AITER has no kernel below 16) and the greedy tokens equal vLLM's own CPU_MLA (fp32)."""

from __future__ import annotations

import json

import pytest
from test_engine_cpu import MAX_TOKENS, compare

from engine_report import REPORT

# docker_lane: evens out the two lanes (pytest.ini); it needs no Docker engine
pytestmark = [pytest.mark.engine, pytest.mark.docker_lane]


@pytest.fixture(scope="session")
def engine_runs_8_heads(engine_runs, tmp_path_factory):
    from tiny_mla_weights import CONFIG_DIR, tiny_mla_weights  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415

    out = tmp_path_factory.mktemp("tiny-mla-8-heads")
    cfg = json.loads((CONFIG_DIR / "config.json").read_text())
    cfg["num_attention_heads"] = cfg["num_key_value_heads"] = 8
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(tiny_mla_weights(cfg, seed=0), str(out / "model.safetensors"), metadata={"format": "pt"})
    return type(engine_runs)(out, tmp_path_factory.mktemp("engine-runs-8-heads"))


def test_8_heads_fp32_tokens_identical_to_cpu_mla(engine_runs_8_heads):
    ours, theirs = engine_runs_8_heads.get("ours"), engine_runs_8_heads.get("cpu_mla")
    assert ours["decode_calls"] >= 2 * (MAX_TOKENS - 1)
    agree, max_diff, n = compare(ours, theirs)
    REPORT.append(f"8 heads, fp32: {agree:.0%} of {n} requests identical, max logprob diff {max_diff:.2e}")
    assert agree == 1.0
    assert max_diff <= 1e-4
