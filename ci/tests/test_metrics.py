"""Percentiles and aggregate serving metrics on known numbers."""
from __future__ import annotations

import math

import pytest

from rocm_vllm_runtime import metrics
from rocm_vllm_runtime.metrics import RequestResult


@pytest.mark.parametrize("values, q, expected", [
    ([1, 2, 3, 4], 50, 2.5),
    ([1, 2, 3, 4], 0, 1.0),
    ([1, 2, 3, 4], 100, 4.0),
    (list(range(1, 101)), 99, 99.01),
    ([5.0], 99, 5.0),
    ([], 50, 0.0),
    ([3, 1, 2], 50, 2.0),
])
def test_percentile_interpolates_linearly(values, q, expected) -> None:
    assert metrics.percentile(values, q) == pytest.approx(expected)


def test_summary_on_known_requests() -> None:
    results = [
        RequestResult(True, 10, output_tokens=3, ttft=0.1, latency=0.5, itl=[0.2, 0.2]),
        RequestResult(True, 10, output_tokens=5, ttft=0.3, latency=1.1, itl=[0.1, 0.3, 0.2, 0.2]),
        RequestResult(True, 10, output_tokens=1, ttft=0.2, latency=0.2, itl=[]),
        RequestResult(False, 10, error="HTTP 500"),
    ]
    s = metrics.summarize(results, duration=2.0)
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["total_input_tokens"] == 30 and s["total_output_tokens"] == 9
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_throughput"] == pytest.approx(4.5)
    assert s["total_token_throughput"] == pytest.approx(19.5)
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["p99_ttft_ms"] == pytest.approx(298.0)  # sorted 100, 200, 300 ms: rank 1.98
    # TPOT: (0.5-0.1)/2 = 0.2 and (1.1-0.3)/4 = 0.2; the one-token request has none
    assert s["mean_tpot_ms"] == pytest.approx(200.0)
    itl_ms = [200, 200, 100, 300, 200, 200]
    assert s["mean_itl_ms"] == pytest.approx(sum(itl_ms) / 6)
    assert s["median_itl_ms"] == pytest.approx(200.0)
    assert s["p99_itl_ms"] == pytest.approx(metrics.percentile(itl_ms, 99))
    assert s["p99_itl_ms"] == pytest.approx(295.0)


def test_speedups_are_oriented_so_more_is_better_for_the_reference() -> None:
    columns = {"plugin": {"total_token_throughput": 10171.83, "mean_tpot_ms": 20.0},
               "triton": {"total_token_throughput": 8777.14, "mean_tpot_ms": 25.0}}
    factors = metrics.speedups(columns, "plugin")["triton"]
    assert factors["total_token_throughput"] == pytest.approx(10171.83 / 8777.14)
    assert factors["mean_tpot_ms"] == pytest.approx(1.25)
    assert math.isnan(factors["mean_itl_ms"])


def test_table_has_every_metric_and_column() -> None:
    text = metrics.table({"a": {"completed": 3}, "b": {"completed": 4}})
    lines = text.splitlines()
    assert len(lines) == 1 + len(metrics.ROWS)
    assert lines[1].split()[-2:] == ["3", "4"]
