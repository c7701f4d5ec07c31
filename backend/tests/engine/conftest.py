"""Engine tests: tiny MLA model in vLLM's real CPU engine. Reports land in the summary
(engine_report.REPORT, printed by the repository's conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
# helper modules next to this file (on pytest.ini's pythonpath)
from engine_report import REPORT
from engine_setup import AMX_MLA_BACKEND, CPU_MLA_IMPL, OUR_CPU_DEV_IMPL, engine_env

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "engine_driver.py"


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    from tiny_mla_weights import write_tiny_mla  # runtime/models, on pytest.ini's pythonpath

    return write_tiny_mla(tmp_path_factory.mktemp("tiny-mla-seeded"), seed=0)


class EngineRuns:
    """Runs engine_driver.py once per configuration and caches the result."""

    def __init__(self, model: Path, workdir: Path):
        self.model, self.workdir, self.cache = model, workdir, {}

    def get(self, backend: str, dtype: str = "float32", fault: str = "none", schedule: str = "waves",
            aiter: str | None = None) -> dict:
        """``aiter``: an installed AITER distribution (amd-aiter) of this version is on the engine's
        path (its package metadata only: the CPU development mode imports no AITER)."""
        key = (backend, dtype, fault, schedule) + ((f"aiter-{aiter}",) if aiter else ())
        if key not in self.cache:
            name = "-".join(key)
            out, log = self.workdir / f"{name}.json", self.workdir / f"{name}.log"
            cmd = [sys.executable, str(DRIVER), "--model", str(self.model), "--backend", backend,
                   "--dtype", dtype, "--fault", fault, "--schedule", schedule, "--out", str(out)]
            env = engine_env()
            if aiter:
                site = self.workdir / f"site-aiter-{aiter}"
                dist = site / f"amd_aiter-{aiter}.dist-info"
                dist.mkdir(parents=True, exist_ok=True)
                (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: amd-aiter\nVersion: {aiter}\n")
                env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
            with open(log, "w") as f:
                proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=900)
            if proc.returncode != 0:
                tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
                pytest.fail(f"engine run {key} failed (exit {proc.returncode}):\n{tail}")
            run = json.loads(out.read_text())
            # The backend that really ran, on a platform that would have picked AMX_MLA.
            expected = OUR_CPU_DEV_IMPL if backend == "ours" else CPU_MLA_IMPL
            assert run["auto_choice"] == AMX_MLA_BACKEND, f"AMX not faked: {run['auto_choice']}"
            assert run["attention_impls"] == [expected], f"{key}: ran {run['attention_impls']}, expected {expected}"
            self.cache[key] = run
            REPORT.append(f"{key}: engine start {run['engine_start_s']:.1f}s, attention "
                          f"{run['attention_impls'][0].rsplit('.', 1)[-1]} (auto would be AMX_MLA), "
                          f"decode calls {run['decode_calls']}")
        return self.cache[key]


@pytest.fixture(scope="session")
def engine_runs(tiny_weights, tmp_path_factory) -> EngineRuns:
    return EngineRuns(tiny_weights, tmp_path_factory.mktemp("engine-runs"))
