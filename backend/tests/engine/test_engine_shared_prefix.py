"""Requests sharing a cached prefix in vLLM's real CPU engine (prefix caching on, a KV cache of
80 blocks): a decode step references several times more keys than the cache has slots, since
every request reads the shared blocks. The backend plans every such step whole and gives the
same greedy tokens as vLLM's own CPU MLA backend (sizing kv_indices by the cache's slot count
failed here: index out of bounds in the planner; on a GPU, AITER would read past the plan)."""

from __future__ import annotations

import pytest

from engine_driver import MAX_NUM_SEQS, SHARED_REQUESTS
from engine_report import REPORT
from test_engine_cpu import MAX_TOKENS, compare

pytestmark = pytest.mark.engine


def test_shared_prefix_steps_exceed_the_cache_and_decode_exactly(engine_runs):
    ours = engine_runs.get("ours", schedule="shared-prefix")
    theirs = engine_runs.get("cpu_mla", schedule="shared-prefix")
    for run in (ours, theirs):
        assert run["prefix_caching"], "prefix caching was not on in the engine"
        assert sorted(run["results"], key=int) == [str(i) for i in range(SHARED_REQUESTS)]
        assert all(len(r["token_ids"]) == MAX_TOKENS for r in run["results"].values())
    slot_bound = ours["kv_cache_slots"] + MAX_NUM_SEQS  # the capacity kv_indices used to have
    REPORT.append(f"shared prefix: largest decode step {ours['max_step_keys']} keys, KV cache "
                  f"{ours['kv_cache_slots']} slots")
    assert ours["max_step_keys"] > 3 * slot_bound
    agree, max_diff, n = compare(ours, theirs)
    REPORT.append(f"shared prefix: {agree:.0%} of {n} requests identical, max logprob diff {max_diff:.2e}")
    assert agree == 1.0 and max_diff <= 1e-4
