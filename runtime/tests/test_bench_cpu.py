"""The serving benchmark against real vLLM API servers on CPU (the tiny model with its tokenizer).

The bench suite runs through the selftest CLI with the two CPU backends (this project's CPU
development mode and vLLM's own CPU_MLA) on a load of a few short requests; the benchmark CLI
asks a CPU server for TRITON_MLA, which vLLM's CPU platform does not select, and must fail that
run. Servers get the engine tests' environment (tests/fake_amx: the platform believes the CPU has
AMX tiles, so a backend not named explicitly becomes AMX_MLA on every machine). No timing is
asserted.
"""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from processes import running

from engine_setup import engine_env  # backend/tests/engine, on pytest.ini's pythonpath

pytestmark = pytest.mark.engine

RUNTIME_DIR = Path(__file__).resolve().parents[1]
TINY = RUNTIME_DIR / "models" / "tiny-mla"
CPU_SERVER = (f"--model {TINY} --dtype float32 --max-model-len 256 --max-num-seqs 4 "
              "--gpu-memory-utilization 0.5 --enforce-eager --seed 0")
LOAD = {"BENCH_NUM_PROMPTS": "4", "BENCH_INPUT_LEN": "32", "BENCH_OUTPUT_LEN": "8",
        "BENCH_CONCURRENCY": "2", "BENCH_WARMUPS": "1", "BENCH_START_TIMEOUT": "600"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_env(**extra: str) -> dict[str, str]:
    env = engine_env(VLLM_CPU_KVCACHE_SPACE="1", TINY_MLA_MODEL=str(TINY), BENCH_PORT=str(free_port()),
                     **LOAD, **extra)
    env.pop("VLLM_PLUGINS", None)
    return env


def test_bench_suite_compares_the_cpu_backends_through_the_selftest_cli(tmp_path: Path) -> None:
    results = tmp_path / "results"
    env = bench_env(SELFTEST_SUITES=str(RUNTIME_DIR / "suites"), BENCH_BACKENDS="cpu-plugin,cpu-vllm",
                    BENCH_SERVE_ARGS=CPU_SERVER, SELFTEST_RESULTS_DIR=str(results))
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime", "bench", "--json", str(results / "selftest.json"),
                           "--junit", str(results / "selftest.xml")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

    report = json.loads((results / "selftest.json").read_text())
    assert [(s["name"], s["status"], s["counts"]) for s in report["suites"]] == [("bench", "passed", {"passed": 2})]
    doc = report["bench"]
    assert doc == json.loads((results / "bench.json").read_text())
    assert doc["ok"] and list(doc["runs"]) == ["cpu-plugin", "cpu-vllm"] and doc["reference"] == "cpu-plugin"
    for name, implementation in (("cpu-plugin", "vllm-aiter-mla"), ("cpu-vllm", "vllm")):
        run = doc["runs"][name]
        assert run["selected"] == {"attention_backends": ["CPU_MLA"], "implementation": implementation}, name
        assert run["problems"] == [] and run["errors"] == [], name
        m = run["metrics"]
        assert (m["completed"], m["failed"], m["total_input_tokens"], m["total_output_tokens"]) == (4, 0, 4 * 32, 4 * 8)
        assert m["total_token_throughput"] > 0 and m["mean_tpot_ms"] > 0
        vllm_result = json.loads(Path(run["result_file"]).read_text())  # vLLM's own result file
        assert vllm_result["completed"] == 4 and vllm_result["max_concurrency"] == 2
        assert Path(run["server_log"]).parent == results
    assert set(doc["ratios"]) == {"cpu-vllm"} and doc["ratios"]["cpu-vllm"]["total_token_throughput"] > 0
    cases = [c.get("name") for c in ET.parse(results / "selftest.xml").getroot().iter("testcase")]
    assert cases == ["test_serving_benchmark[cpu-plugin]", "test_serving_benchmark[cpu-vllm]"]


def test_a_server_that_selects_another_backend_fails_its_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.bench", "--backends", "triton",
                           "--out-dir", str(out), "--json", str(out / "bench.json"), "--", *CPU_SERVER.split()],
                          env=bench_env(), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    doc = json.loads((out / "bench.json").read_text())
    run = doc["runs"]["triton"]
    assert not doc["ok"] and not run["ok"]
    # vLLM's CPU platform ignores TRITON_MLA; on an AMX CPU it selects AMX_MLA
    assert run["problems"] == ["triton: the server selected AMX_MLA, not TRITON_MLA"]
    assert run["metrics"] == {} and not Path(run["result_file"]).exists()  # no load was sent
    assert "problem: triton: the server selected AMX_MLA, not TRITON_MLA" in proc.stdout
    log = Path(run["server_log"]).read_text()
    assert "Using AMX_MLA backend" in log and "--attention-backend TRITON_MLA" in proc.stdout
    pids = {int(p) for p in re.findall(r"pid=(\d+)", log)}
    assert pids and not [p for p in pids if alive(p)], "the benchmark left server processes behind"


alive = running  # tests/processes.py: a zombie has ended
