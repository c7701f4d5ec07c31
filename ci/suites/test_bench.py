"""Bench suite (needs an AMD GPU): serving benchmark of this backend, vLLM's AITER MLA and TRITON_MLA.

Starts one server per backend in turn (the tiny dummy-weight MLA model unless
BENCH_SERVE_ARGS names another), sends the same load to each and records the
results as JSON in $SELFTEST_RESULTS_DIR/bench.json (printed as a table with
the speedups of this backend). With BENCH_BASE_URL set it loads that running
server only. Load settings: BENCH_NUM_PROMPTS (1000), BENCH_INPUT_LEN (1024),
BENCH_OUTPUT_LEN (128), BENCH_CONCURRENCY (64), BENCH_SEED (0), BENCH_BACKENDS
(plugin,vllm-aiter,triton), BENCH_START_TIMEOUT (1800 s).
"""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from rocm_vllm_runtime import bench, metrics
from rocm_vllm_runtime.serve import tiny_model

pytestmark = pytest.mark.gpu


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _spec() -> bench.LoadSpec:
    return bench.LoadSpec(num_requests=_env_int("BENCH_NUM_PROMPTS", 1000),
                          input_len=_env_int("BENCH_INPUT_LEN", 1024),
                          output_len=_env_int("BENCH_OUTPUT_LEN", 128),
                          concurrency=_env_int("BENCH_CONCURRENCY", 64),
                          seed=_env_int("BENCH_SEED", 0),
                          warmup=_env_int("BENCH_WARMUP", 4))


def _results_dir(tmp_path: Path) -> Path:
    path = Path(os.environ.get("SELFTEST_RESULTS_DIR") or tmp_path)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def gpu() -> None:
    kfd = os.environ.get("ROCM_VLLM_KFD_PATH") or "/dev/kfd"
    if not os.environ.get("BENCH_BASE_URL") and not os.path.exists(kfd):
        pytest.skip(f"no {kfd}: no AMD GPU in this container to start servers on "
                    "(or set BENCH_BASE_URL to load a running server)")


def test_serving_benchmark(gpu: None, tmp_path: Path) -> None:
    spec, out = _spec(), _results_dir(tmp_path)
    if os.environ.get("BENCH_BASE_URL"):
        doc = {"runs": {"server": bench.run_load(os.environ["BENCH_BASE_URL"], spec,
                                                 os.environ.get("VLLM_API_KEY", ""))}}
    else:
        serve_args = shlex.split(os.environ.get("BENCH_SERVE_ARGS", "")) or [
            "--model", tiny_model(os.environ), "--max-model-len",
            str(spec.input_len + spec.output_len + 64)]
        names = [n for n in os.environ.get("BENCH_BACKENDS", "plugin,vllm-aiter,triton").split(",") if n]
        doc = bench.compare(names, serve_args, spec, _env_int("BENCH_PORT", 8011), out,
                            float(os.environ.get("BENCH_START_TIMEOUT", "1800")))
    (out / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    print("\n" + bench.render_compare(doc))
    for name, run in doc["runs"].items():
        m = run["metrics"]
        assert m["failed"] == 0, f"{name}: {m['failed']} requests failed: {run['errors']}"
        assert m["completed"] == spec.num_requests
        assert m["total_output_tokens"] == spec.num_requests * spec.output_len, name
    assert set(metrics.SPEEDUP_KEYS) <= set(next(iter(doc["runs"].values()))["metrics"])
