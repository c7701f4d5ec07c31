"""Bench suite: serving benchmark of attention backends side by side (`rocm_vllm_runtime.bench`,
each run measured by vLLM's own `vllm bench serve`).

One server per backend of BENCH_BACKENDS (default plugin,vllm-aiter,triton: this project's
AITER MLA, vLLM's built-in AITER MLA, TRITON_MLA), one after the other, serving the tiny model
with its tokenizer and dummy weights unless BENCH_SERVE_ARGS gives the server arguments. Writes
$SELFTEST_RESULTS_DIR/bench.json (every run: the attention backend asked and the one its server
selected, vLLM's metrics, the ratios of the first backend to each other one), the server logs
and vLLM's result files next to it. One check per backend: its server selected the attention
backend and implementation asked, and every request completed with all its output tokens.

The GPU backends need an AMD GPU; the cpu-plugin and cpu-vllm backends run anywhere. Load
settings: BENCH_NUM_PROMPTS (1000), BENCH_INPUT_LEN (1024), BENCH_OUTPUT_LEN (128),
BENCH_CONCURRENCY (64), BENCH_SEED (0), BENCH_WARMUPS (4), BENCH_ARGS (further `vllm bench
serve` arguments); BENCH_PORT (8011), BENCH_START_TIMEOUT (1800 s).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rocm_vllm_runtime import bench, numeric
from rocm_vllm_runtime.serve import tiny_model

NAMES = [n.strip() for n in (os.environ.get("BENCH_BACKENDS") or bench.ENV_DEFAULTS["BENCH_BACKENDS"]).split(",")
         if n.strip()]
_KNOWN = bench.backends([])
# GPU backends carry the gpu mark: where there is no AMD GPU they skip (also under CI).
CASES = [pytest.param(n, id=n, marks=[pytest.mark.gpu] if n in _KNOWN and _KNOWN[n].needs_gpu else [])
         for n in NAMES]


def _results_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = Path(os.environ.get("SELFTEST_RESULTS_DIR") or tmp_path_factory.mktemp("bench"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    env = os.environ
    chosen = bench.choose(NAMES, bench.backends(bench.plugin_names()))
    if kfd := bench.missing_device(chosen, env):
        pytest.skip(f"no {kfd}: no AMD GPU in this container to start servers on "
                    "(BENCH_BACKENDS=cpu-plugin,cpu-vllm runs on CPU)")
    load = bench.Load.from_env(env)
    serve_args = bench.split_setting(env, "BENCH_SERVE_ARGS") or [
        "--model", tiny_model(env), "--max-model-len", str(load.input_len + load.output_len + 64)]
    out = _results_dir(tmp_path_factory)
    result = bench.compare(chosen, serve_args, load,
                           numeric.port("BENCH_PORT", env.get("BENCH_PORT") or bench.ENV_DEFAULTS["BENCH_PORT"]),
                           out, numeric.duration("BENCH_START_TIMEOUT", env.get("BENCH_START_TIMEOUT")
                                                 or bench.ENV_DEFAULTS["BENCH_START_TIMEOUT"]))
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + bench.render(result))
    return result


@pytest.mark.parametrize("name", CASES)
def test_serving_benchmark(doc: dict, name: str) -> None:
    run = doc["runs"][name]
    assert run["ok"], "; ".join(run["problems"] + [f"request error: {e}" for e in run["errors"]])
    selected = run["selected"]
    assert selected["attention_backends"] == [run["asked"]["attention_backend"]]
    assert selected["implementation"] == run["asked"]["implementation"]
