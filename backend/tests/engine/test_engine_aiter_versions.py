"""First contact: with an installed AITER of every version a track pins, and of one that does not
exist yet, vLLM 0.32's real CPU engine starts with the plugin (development mode) and decodes what
vLLM's own CPU_MLA decodes. Nothing in the backend depends on AITER's version: its decode calls are
the built-in's and measured at start-up, so a new AITER release needs no change here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_engine_cpu import MAX_TOKENS, compare

from engine_report import REPORT

pytestmark = pytest.mark.engine

VERSIONS_JSON = Path(__file__).resolve().parents[3] / "versions.json"
NOT_YET_RELEASED = "0.1.99"


def pinned_aiter_versions() -> list[str]:
    pins = json.loads(VERSIONS_JSON.read_text())["aiter"]["pins"]
    return sorted({pin["tag"].removeprefix("v") for pin in pins.values()})


VERSIONS = [*pinned_aiter_versions(), NOT_YET_RELEASED]


def test_every_tracked_aiter_and_an_unreleased_one_are_covered():
    assert {"0.1.24.post1", "0.1.26", "0.1.28.post1"} <= set(VERSIONS) and NOT_YET_RELEASED in VERSIONS


# half of the engine runs in the Docker lane, which needs no Docker engine for them (pytest.ini)
@pytest.mark.parametrize("aiter", [pytest.param(v, marks=[pytest.mark.docker_lane] if i % 2 else [])
                                   for i, v in enumerate(VERSIONS)])
def test_the_engine_serves_with_any_installed_aiter(engine_runs, aiter):
    ours = engine_runs.get("ours", aiter=aiter)
    assert ours["aiter_version"] == aiter  # the engine process saw that AITER installed
    assert ours["decode_calls"] >= 2 * (MAX_TOKENS - 1)
    agree, max_diff, n = compare(ours, engine_runs.get("cpu_mla"))
    REPORT.append(f"installed AITER {aiter}: {agree:.0%} of {n} requests identical to CPU_MLA, "
                  f"max logprob diff {max_diff:.2e}")
    assert agree == 1.0 and max_diff <= 1e-4
