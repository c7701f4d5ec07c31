"""The benchmark client against a fake streaming OpenAI server on 127.0.0.1 (CPU only).

Timing checks use a scripted clock, so the expected TTFT/ITL/TPOT values are
exact and no assertion depends on how fast this machine is.
"""
from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import pytest

from rocm_vllm_runtime import bench, metrics


@pytest.fixture
def server(fake_openai):
    srv = fake_openai.FakeServer(max_requests=200)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(10)


class ScriptedClock:
    def __init__(self, times: list[float]) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_stream_counts_tokens_and_times_chunks(server) -> None:
    # clock: request start, then one reading per data event (5 tokens + the usage event)
    clock = ScriptedClock([10.0, 10.5, 10.6, 10.8, 11.1, 11.5, 11.5])
    body = bench.request_body("tiny-mla", [11, 12, 13], output_len=5)
    result = bench.stream_completion(server.url, body, timeout=30, clock=clock)
    assert result.ok, result.error
    assert result.prompt_tokens == 3 and result.output_tokens == 5
    assert result.ttft == pytest.approx(0.5)
    assert result.latency == pytest.approx(1.5)
    assert result.itl == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert metrics.tpot(result) == pytest.approx((1.5 - 0.5) / 4)
    assert clock.times == []  # every event was read
    sent = server.bodies[-1]
    assert sent["stream"] is True and sent["ignore_eos"] is True and sent["max_tokens"] == 5
    assert sent["prompt"] == [11, 12, 13] and sent["stream_options"] == {"include_usage": True}


def test_usage_overrides_chunk_count() -> None:
    tally = bench.StreamTally(start=0.0)
    tally.event({"choices": [{"text": "", "token_ids": [1, 2]}]}, 1.0)
    tally.event({"choices": [{"text": "x"}]}, 2.0)
    assert tally.tokens == 3
    tally.event({"choices": [], "usage": {"completion_tokens": 7}}, 3.0)
    result = tally.result(4)
    assert result.output_tokens == 7 and result.latency == 2.0 and result.itl == [1.0]


def test_run_load_completes_every_request_once(server) -> None:
    spec = bench.LoadSpec(num_requests=40, input_len=16, output_len=6, concurrency=8, warmup=2)
    doc = bench.run_load(server.url, spec)
    m = doc["metrics"]
    assert m["completed"] == 40 and m["failed"] == 0 and doc["errors"] == []
    assert m["total_input_tokens"] == 40 * 16 and m["total_output_tokens"] == 40 * 6
    assert len(server.bodies) == 42  # 40 measured + 2 warm-up requests
    prompts = [tuple(b["prompt"]) for b in server.bodies[2:]]
    assert sorted(prompts) == sorted(tuple(p) for p in bench.make_prompts(spec))
    assert m["request_throughput"] == pytest.approx(40 / m["duration_s"])
    assert m["total_token_throughput"] == pytest.approx(40 * 22 / m["duration_s"])
    assert doc["spec"]["model"] == "tiny-mla"  # asked from /v1/models


def test_failed_requests_are_counted_not_lost(fake_openai) -> None:
    srv = fake_openai.FakeServer(max_requests=100, fail_every=4)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        spec = bench.LoadSpec(num_requests=20, input_len=4, output_len=3, concurrency=4, warmup=0)
        doc = bench.run_load(srv.url, spec)
    finally:
        srv.shutdown()
        srv.server_close()
    assert doc["metrics"]["completed"] == 15 and doc["metrics"]["failed"] == 5
    assert any("HTTP 500" in e for e in doc["errors"])


def test_unreachable_server_is_an_error_result() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = bench.stream_completion(f"http://127.0.0.1:{port}",
                                     bench.request_body("m", [1], 2), timeout=5)
    assert not result.ok and result.error


def test_prompts_are_seeded_and_sized() -> None:
    spec = bench.LoadSpec(num_requests=3, input_len=1024, seed=7)
    a, b = bench.make_prompts(spec), bench.make_prompts(spec)
    assert a == b and [len(p) for p in a] == [1024] * 3
    assert a != bench.make_prompts(bench.LoadSpec(num_requests=3, input_len=1024, seed=8))
    assert all(spec.token_id_low <= t < spec.token_id_high for p in a for t in p)


def test_backends_leave_the_plugin_out_for_vllm_aiter() -> None:
    known = bench.backends(["other_plugin"])
    assert known["plugin"].env == {} and known["plugin"].args == ()
    assert known["vllm-aiter"].env == {"VLLM_PLUGINS": "other_plugin"}
    assert known["triton"].args == ("--attention-backend", "TRITON_MLA")
    assert "aiter_mla" not in bench.plugin_names()  # the backend's own entry point is excluded


def test_compare_starts_each_server_in_turn(monkeypatch, tmp_path: Path, ci_dir: Path) -> None:
    script = Path(__file__).parent / "fake_openai_server.py"

    def fake_command(serve_args, backend, port):
        return [sys.executable, str(script), "--port", str(port), "--max-requests", "50"]

    monkeypatch.setattr(bench, "server_command", fake_command)
    spec = bench.LoadSpec(num_requests=10, input_len=8, output_len=4, concurrency=4, warmup=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    doc = bench.compare(["plugin", "triton"], [], spec, port, tmp_path, start_timeout_s=60)
    assert list(doc["runs"]) == ["plugin", "triton"]
    assert all(r["metrics"]["completed"] == 10 for r in doc["runs"].values())
    assert set(doc["speedups"]) == {"triton"}
    text = bench.render_compare(doc)
    assert "plugin vs triton" in text and "Total token throughput" in text
    json.dumps(doc)


def test_server_that_dies_is_reported(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bench, "server_command",
                        lambda a, b, p: [sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match="exited with status 3"):
        bench.compare(["plugin"], [], bench.LoadSpec(num_requests=1), 1, tmp_path, 60)


def test_unknown_backend_is_named() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        bench.compare(["nope"], [], bench.LoadSpec(), 1, Path("."), 1)
