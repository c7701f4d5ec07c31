"""First contact: with an installed AITER of the default track's version and of one that does not
exist yet, vLLM 0.32's real CPU engine starts with the plugin (development mode) and decodes what
vLLM's own CPU_MLA decodes. Nothing in the backend depends on AITER's version (its decode calls are
the built-in's and measured at start-up): backend/tests/test_measure.py routes and measures a layer
with every pinned AITER installed, and holds the backend to reading no AITER metadata."""

from __future__ import annotations

import pytest
from test_engine_cpu import MAX_TOKENS, compare

from engine_report import REPORT
from engine_setup import NOT_YET_RELEASED_AITER as NOT_YET_RELEASED
from engine_setup import default_track_aiter

pytestmark = pytest.mark.engine

VERSIONS = [default_track_aiter(), NOT_YET_RELEASED]


def test_the_default_tracks_aiter_and_an_unreleased_one_are_covered():
    assert VERSIONS[0] == "0.1.28.post1" and NOT_YET_RELEASED in VERSIONS


@pytest.mark.parametrize("aiter", VERSIONS)
def test_the_engine_serves_with_any_installed_aiter(engine_runs, aiter):
    ours = engine_runs.get("ours", aiter=aiter)
    assert ours["aiter_version"] == aiter  # the engine process saw that AITER installed
    assert ours["decode_calls"] >= 2 * (MAX_TOKENS - 1)
    agree, max_diff, n = compare(ours, engine_runs.get("cpu_mla"))
    REPORT.append(f"installed AITER {aiter}: {agree:.0%} of {n} requests identical to CPU_MLA, "
                  f"max logprob diff {max_diff:.2e}")
    assert agree == 1.0 and max_diff <= 1e-4
