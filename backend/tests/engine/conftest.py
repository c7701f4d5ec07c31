"""Engine tests: tiny MLA model in vLLM's real CPU engine. Reports land in the summary
(engine_report.REPORT, printed by the repository's conftest.py).

Every engine run a test reads is declared once, in ``engine_setup.RUNS``. The first test that asks for a run
starts one process (engine_driver.py) for that run's backend and installed AITER, which serves
every declared run of that backend one engine after another: vLLM is imported once per backend,
not once per configuration, and runs that share an engine's settings share one engine. The run asked
for comes first and each engine's results are read as soon as they are written: a test waits for its
own run while the driver goes on with the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
# helper modules next to this file (on pytest.ini's pythonpath)
from engine_report import REPORT
from engine_setup import AMX_MLA_BACKEND, CPU_MLA_IMPL, OUR_CPU_DEV_IMPL, RUNS, Run, default_track_aiter, engine_env

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "engine_driver.py"
def write_models(folder: Path) -> dict[int, Path]:
    """The tiny model's seeded weights, with 16 attention heads and with 8 (DeepSeek-V2-Lite at
    TP 2, Kimi-K2 at TP 8: the backend pads the queries to 16 heads)."""
    from safetensors.torch import save_file  # noqa: PLC0415
    from tiny_mla_weights import CONFIG_DIR, tiny_mla_weights, write_tiny_mla  # runtime/models (pythonpath)

    models = {16: write_tiny_mla(folder / "tiny-mla-seeded", seed=0)}
    cfg = json.loads((CONFIG_DIR / "config.json").read_text())
    cfg["num_attention_heads"] = cfg["num_key_value_heads"] = 8
    models[8] = folder / "tiny-mla-8-heads"
    models[8].mkdir()
    (models[8] / "config.json").write_text(json.dumps(cfg))
    save_file(tiny_mla_weights(cfg, seed=0), str(models[8] / "model.safetensors"), metadata={"format": "pt"})
    return models


class EngineRuns:
    """The results of ``RUNS``, one driver process per backend and installed AITER, started on demand.

    A driver serves its runs one engine after another, the run asked for first, and writes the results
    so far after each engine: a test waits for its own run, not for every run of its driver."""

    TIMEOUT_S = 1200  # one driver, every engine of it

    def __init__(self, models: dict[int, Path], workdir: Path, runs: tuple[Run, ...] = RUNS):
        self.models, self.workdir, self.runs, self.cache = models, workdir, runs, {}
        self.drivers: dict[tuple, Driver] = {}

    def get(self, backend: str, dtype: str = "float32", fault: str = "none", schedule: str = "waves",
            aiter: str | None = None, heads: int = 16, kernels: str | None = None) -> dict:
        """The run of these settings; ``backend="ours"`` without ``aiter``: the default track's AITER installed."""
        if backend == "ours" and aiter is None:
            aiter = default_track_aiter()
        run = Run(backend, dtype, fault, schedule, heads, aiter, kernels)
        if run not in self.runs:
            pytest.fail(f"engine run {run.name} is not declared in backend/tests/engine/engine_setup.py's RUNS")
        key = (run.backend, run.aiter)
        if run not in self.cache and key not in self.drivers:
            same = [r for r in self.runs if (r.backend, r.aiter) == key]
            self.drivers[key] = self._start(sorted(same, key=lambda r: r != run))  # the one asked for first
        while run not in self.cache:
            self._take(self.drivers[key])
        return self.cache[run]

    def _start(self, runs: list[Run]) -> "Driver":
        first = runs[0]
        name = "-".join(str(v) for v in (first.backend, first.aiter) if v)
        plan, out, log = (self.workdir / f"{name}.{ext}" for ext in ("plan.json", "json", "log"))
        plan.write_text(json.dumps([{"name": r.name, "model": str(self.models[r.heads]), "dtype": r.dtype,
                                     "schedule": r.schedule, "fault": r.fault, "kernels": r.kernels} for r in runs]))
        env = engine_env()
        if first.aiter:
            site = self.workdir / f"site-aiter-{first.aiter}"
            dist = site / f"amd_aiter-{first.aiter}.dist-info"
            dist.mkdir(parents=True, exist_ok=True)
            (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: amd-aiter\nVersion: {first.aiter}\n")
            env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
        cmd = [sys.executable, str(DRIVER), "--backend", first.backend, "--plan", str(plan), "--out", str(out)]
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        return Driver(proc, runs, out, log, time.monotonic() + self.TIMEOUT_S)

    def _take(self, driver: "Driver") -> None:
        """Waits for the driver's next results (or its end) and keeps the runs found so far."""
        while True:
            ended = driver.proc.poll() is not None
            found = json.loads(driver.out.read_text()) if driver.out.is_file() else {}
            new = [r for r in driver.runs if r.name in found and r not in self.cache]
            if new or ended or time.monotonic() > driver.deadline:
                break
            time.sleep(0.5)
        for run in new:
            self._keep(run, found[run.name])
        missing = [r.name for r in driver.runs if r not in self.cache]
        if new or not missing:
            return
        if not ended:
            driver.stop()
            pytest.fail(f"engine runs {missing} not done within {self.TIMEOUT_S}s:\n{driver.tail()}")
        pytest.fail(f"engine runs {missing} failed (exit {driver.proc.returncode}):\n{driver.tail()}")

    def _keep(self, run: Run, result: dict) -> None:
        if "refused" in result:  # an engine whose start was refused (its test reads why)
            self.cache[run] = result
            REPORT.append(f"{run.name}: engine start refused after {result['engine_start_s']:.1f}s")
            return
        # The backend that really ran, on a platform that would have picked AMX_MLA.
        expected = OUR_CPU_DEV_IMPL if run.backend == "ours" else CPU_MLA_IMPL
        auto = result["platform_choices"]["auto"]
        assert auto == AMX_MLA_BACKEND, f"AMX not faked: {auto}"
        ran = result["attention_impls"]
        assert ran == [expected], f"{run.name}: ran {ran}, expected {expected}"
        self.cache[run] = result
        REPORT.append(f"{run.name}: engine start {result['engine_start_s']:.1f}s, requests "
                      f"{result['serve_s']:.1f}s, attention {result['attention_impls'][0].rsplit('.', 1)[-1]} "
                      f"(auto would be AMX_MLA), decode calls {result['decode_calls']}")

    def close(self) -> None:
        """Drivers still running at the session's end (runs no test asked for) are stopped."""
        for driver in self.drivers.values():
            driver.stop()


@dataclass
class Driver:
    proc: subprocess.Popen
    runs: list[Run]
    out: Path
    log: Path
    deadline: float

    def tail(self) -> str:
        return "".join(self.log.read_text().splitlines(keepends=True)[-40:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory):
    runs = EngineRuns(write_models(tmp_path_factory.mktemp("tiny-mla-models")), tmp_path_factory.mktemp("engine-runs"))
    yield runs
    runs.close()


@pytest.fixture(scope="session")
def tiny_weights(engine_runs) -> Path:
    """The 16-head tiny model's seeded weights, the ones the engine runs serve."""
    return engine_runs.models[16]
