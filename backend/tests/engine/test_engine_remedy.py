"""The start-up measurement's outcomes inside vLLM 0.32's real CPU engine (CPU development mode), with
stand-ins for AITER's decode and for vLLM's Triton MLA decode (``engine_kernels``):

* AITER's call wrong (a uniform x0.97, caught by the least-squares scale bound), the remedy right: the
  remedy serves every decode call, the greedy tokens are vLLM's own CPU_MLA's, and the start-up line
  names the call, the kernel serving it and both deviations;
* both wrong: the engine does not start, and says why in one line naming the call, both measurements
  and the setting that avoids it.

Both engines run in the process of this package's other engine runs (``engine_setup.RUNS``): each adds
one engine start to it, not a process; so does the third: two tensor-parallel ranks whose AITER stand-ins
abort and hang in the measurement child both start on the remedy."""

from __future__ import annotations

import re

import engine_driver
import pytest

from engine_report import REPORT
from engine_setup import TP_RUN
from test_engine_cpu import compare

pytestmark = pytest.mark.engine

NUMBER = r"(\d+\.\d+)"
CALL = r"MLA decode with 16 heads, q float32 / KV float32"
WRONG = rf"wrong \({NUMBER}% off, band {NUMBER}%; output scale {NUMBER}, offset [-+]\d+\.\d+%, bound {NUMBER}%\)"
SERVED_BY_REMEDY = re.compile(
    rf"ROCM_AITER_MLA: {CALL}, measured on cpu in {NUMBER} s \(AITER's reference x0\.97 \(a wrong stand-in\) "
    rf"kernels, persistent, and vLLM's Triton MLA decode; the first measurement [^)]*\)\): query length 1: "
    rf"Triton decode_attention_fwd \({NUMBER}% off; AITER {WRONG}; AITER {NUMBER} ms, Triton "
    rf"decode_attention_fwd {NUMBER} ms a call\)")
REFUSAL = re.compile(
    r"ValueError: ROCM_AITER_MLA: no decode kernel was measured right for the call with 16 heads at query "
    rf"length 1: AITER {WRONG}, vLLM's Triton decode {WRONG}; avoid the call with another "
    r"--tensor-parallel-size \(another head count\)")


def startup_line(run: dict) -> str:
    """The start-up line of the first measurement (a rank's, or the engine's)."""
    found = [line for line in run.get("lines", run.get("startup_lines")) if CALL in line and "measured on" in line]
    assert len(found) == 1, run["startup_lines"]
    return found[0]


def test_a_call_measured_wrong_is_served_by_the_remedy_with_cpu_mla_tokens(engine_runs):
    run = engine_runs.get("ours", kernels="aiter-x0.97")
    line = startup_line(run)
    m = SERVED_BY_REMEDY.fullmatch(line)
    assert m, line
    remedy_off, aiter_off, aiter_scale = float(m[2]), float(m[3]), float(m[5])
    assert remedy_off < 0.01 and 2.9 < aiter_off < 3.1 and aiter_scale == pytest.approx(0.97, abs=1e-4)
    # every decode call of the engine went through the remedy stand-in (AITER's x0.97 would move logprobs)
    assert run["decode_calls"] >= 2 * 31 and run["remedy_calls"] >= run["decode_calls"]
    agree, max_diff, n = compare(run, engine_runs.get("cpu_mla"))
    REPORT.append(f"AITER x0.97, served by the remedy: {agree:.0%} of {n} requests identical to CPU_MLA, "
                  f"max logprob diff {max_diff:.2e}, engine start {run['engine_start_s']:.1f}s")
    assert agree == 1.0 and max_diff <= 1e-4


def test_nothing_measured_right_refuses_the_start_in_one_line(engine_runs):
    run = engine_runs.get("ours", kernels="both-x0.97")
    refused = run["refused"]
    assert "\n" not in refused
    assert REFUSAL.fullmatch(refused), refused
    assert "query length 1: none (AITER wrong" in startup_line(run)
    REPORT.append(f"AITER and the remedy x0.97: start refused after {run['engine_start_s']:.1f}s: {refused}")


TP_SERVED = re.compile(
    rf"ROCM_AITER_MLA: {CALL}, measured on cpu in {NUMBER} s \(AITER's reference that (abort|hang) \(a stand-in\) "
    rf"kernels, persistent, and vLLM's Triton MLA decode; the first measurement measured in a child process in "
    rf"{NUMBER} s[^)]*\): query length 1: Triton decode_attention_fwd \({NUMBER}% off; AITER (.*); AITER -, Triton "
    rf"decode_attention_fwd {NUMBER} ms a call\)")
TP_ENDS = ("ended the process (the measurement child was killed by SIGABRT)",
           f"passed the time limit (the measurement child passed AITER_MLA_MEASURE_TIMEOUT_S="
           f"{engine_driver.TP_MEASURE_TIMEOUT_S} s and was killed)")


def test_two_ranks_whose_aiter_call_aborts_and_hangs_both_start_on_the_remedy(engine_runs):
    run = engine_runs.get("ours", kernels=TP_RUN.kernels, schedule=TP_RUN.schedule)
    assert "refused" not in run, run.get("refused")
    for rank, end in zip(run["ranks"], TP_ENDS):
        line = startup_line(rank)
        m = TP_SERVED.fullmatch(line)
        assert m, line
        assert m[2] == ("abort", "hang")[rank["rank"]] and m[5] == end and float(m[4]) < 0.01, line
    # each rank served the decode steps with the remedy after it started
    served = [after["remedy_calls"] - before["remedy_calls"]
              for before, after in zip(run["ranks"], run["ranks_served"])]
    assert all(n >= 2 * (engine_driver.BRIEF_TOKENS - 1) for n in served), served
    assert all(len(r["token_ids"]) == engine_driver.BRIEF_TOKENS for r in run["results"].values())
    REPORT.append(f"two ranks, AITER aborting and hanging: both on the remedy, engine start "
                  f"{run['engine_start_s']:.1f}s, requests {run['serve_s']:.1f}s, remedy calls per rank {served}")
