"""Serving benchmark metrics from per-request timings (pure functions).

Definitions (as in vLLM's own serving benchmark):
  TTFT  time from sending a request to its first streamed token
  ITL   time between consecutive streamed chunks of one request
  TPOT  (latency - TTFT) / (output tokens - 1), per request with > 1 output token
Throughputs divide by the wall time of the whole run.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int
    output_tokens: int = 0
    ttft: float = 0.0  # seconds
    latency: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)  # seconds between chunks
    error: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _stats(prefix: str, seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000.0 for s in seconds]
    mean = sum(ms) / len(ms) if ms else 0.0
    return {
        f"mean_{prefix}_ms": mean,
        f"median_{prefix}_ms": percentile(ms, 50),
        f"p99_{prefix}_ms": percentile(ms, 99),
    }


def tpot(result: RequestResult) -> float | None:
    if not result.ok or result.output_tokens <= 1:
        return None
    return (result.latency - result.ttft) / (result.output_tokens - 1)


def summarize(results: Sequence[RequestResult], duration: float) -> dict[str, float]:
    done = [r for r in results if r.ok]
    input_tokens = sum(r.prompt_tokens for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    duration = max(duration, 1e-9)
    summary: dict[str, float] = {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
    }
    summary.update(_stats("ttft", [r.ttft for r in done]))
    summary.update(_stats("tpot", [t for r in done if (t := tpot(r)) is not None]))
    summary.update(_stats("itl", [d for r in done for d in r.itl]))
    return summary


ROWS: tuple[tuple[str, str], ...] = (
    ("completed", "Successful requests"),
    ("failed", "Failed requests"),
    ("duration_s", "Benchmark duration (s)"),
    ("total_input_tokens", "Total input tokens"),
    ("total_output_tokens", "Total output tokens"),
    ("request_throughput", "Request throughput (req/s)"),
    ("output_throughput", "Output token throughput (tok/s)"),
    ("total_token_throughput", "Total token throughput (tok/s)"),
    ("mean_ttft_ms", "Mean TTFT (ms)"),
    ("median_ttft_ms", "Median TTFT (ms)"),
    ("p99_ttft_ms", "P99 TTFT (ms)"),
    ("mean_tpot_ms", "Mean TPOT (ms)"),
    ("median_tpot_ms", "Median TPOT (ms)"),
    ("p99_tpot_ms", "P99 TPOT (ms)"),
    ("mean_itl_ms", "Mean ITL (ms)"),
    ("median_itl_ms", "Median ITL (ms)"),
    ("p99_itl_ms", "P99 ITL (ms)"),
)

# metrics where larger is better (the others: smaller is better)
HIGHER_IS_BETTER = {"completed", "request_throughput", "output_throughput",
                    "total_token_throughput"}


def _fmt(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def table(columns: Mapping[str, Mapping[str, float]]) -> str:
    """Printed table: one row per metric, one column per run (e.g. per backend)."""
    names = list(columns)
    width = max(len(label) for _, label in ROWS)
    col = max([12, *(len(n) for n in names)])
    lines = [f"{'':{width}}  " + "  ".join(f"{n:>{col}}" for n in names)]
    for key, label in ROWS:
        cells = [_fmt(columns[n].get(key, 0.0)) for n in names]
        lines.append(f"{label:{width}}  " + "  ".join(f"{c:>{col}}" for c in cells))
    return "\n".join(lines)


SPEEDUP_KEYS = ("request_throughput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")


def speedups(columns: Mapping[str, Mapping[str, float]],
             reference: str) -> dict[str, dict[str, float]]:
    """How much better `reference` is than each other run, per metric (>1: reference better).

    Throughputs: reference / other. Latencies: other / reference.
    """
    base = columns[reference]
    out: dict[str, dict[str, float]] = {}
    for name, values in columns.items():
        if name == reference:
            continue
        row: dict[str, float] = {}
        for key in SPEEDUP_KEYS:
            num, den = ((base.get(key, 0.0), values.get(key, 0.0)) if key in HIGHER_IS_BETTER
                        else (values.get(key, 0.0), base.get(key, 0.0)))
            row[key] = num / den if den else float("nan")
        out[name] = row
    return out


def speedup_table(factors: Mapping[str, Mapping[str, float]], reference: str) -> str:
    lines = []
    for other, row in factors.items():
        cells = ", ".join(f"{k} {v:.2f}x" for k, v in row.items())
        lines.append(f"{reference} vs {other}: {cells}")
    return "\n".join(lines)
