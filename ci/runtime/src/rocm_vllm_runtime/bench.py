"""Serving benchmark client for an OpenAI-compatible vLLM server (stdlib only).

`run`: N streaming /v1/completions requests with token-id prompts (random,
seeded) at a fixed concurrency against a running server; prints a table and
writes JSON (request/output/total token throughput, TTFT/TPOT/ITL mean,
median, p99).

`compare`: the same load against several attention backends, starting one
server after the other (`python3 -m rocm_vllm_runtime.serve`, so the serve defaults
apply), and prints how much faster this backend is than each other one:
  plugin      this project's backend (the vllm_aiter_mla plugin, ROCM_AITER_MLA)
  vllm-aiter  vLLM's built-in AITER MLA (the plugin left out of VLLM_PLUGINS)
  triton      TRITON_MLA (--attention-backend TRITON_MLA)

  python3 -m rocm_vllm_runtime.bench run --base-url http://127.0.0.1:8000 --num-prompts 1000
  python3 -m rocm_vllm_runtime.bench compare --json bench.json -- --model /models/DeepSeek-R1 -tp 8
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from rocm_vllm_runtime import metrics
from rocm_vllm_runtime.metrics import RequestResult

PLUGIN_PACKAGE = "vllm_aiter_mla"
VLLM_PLUGIN_GROUPS = ("vllm.general_plugins", "vllm.platform_plugins",
                      "vllm.io_processor_plugins", "vllm.stat_logger_plugins")


@dataclass(frozen=True)
class LoadSpec:
    num_requests: int = 1000
    input_len: int = 1024
    output_len: int = 128
    concurrency: int = 64
    seed: int = 0
    token_id_low: int = 10
    token_id_high: int = 1000  # exclusive; stays inside small vocabularies
    warmup: int = 4
    timeout_s: float = 600.0
    model: str = ""  # served model name; '' asks /v1/models


def make_prompts(spec: LoadSpec) -> list[list[int]]:
    rng = random.Random(spec.seed)
    return [[rng.randrange(spec.token_id_low, spec.token_id_high) for _ in range(spec.input_len)]
            for _ in range(spec.num_requests)]


def request_body(model: str, prompt: Sequence[int], output_len: int) -> dict[str, object]:
    return {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,  # vLLM extension: always output_len tokens
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,  # vLLM extension: exact token counts per chunk
    }


@dataclass
class StreamTally:
    """Accumulates one streamed response; `clock` values are seconds."""

    start: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    usage_tokens: int | None = None
    itl: list[float] = field(default_factory=list)

    def event(self, data: Mapping[str, object], now: float) -> None:
        usage = data.get("usage")
        if isinstance(usage, Mapping) and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])  # type: ignore[arg-type]
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        choice = choices[0]
        ids = choice.get("token_ids") if isinstance(choice, Mapping) else None
        count = len(ids) if isinstance(ids, list) else 1
        if count == 0:
            return
        if self.first is None:
            self.first = now
        else:
            assert self.last is not None
            self.itl.append(now - self.last)
        self.last = now
        self.tokens += count

    def result(self, prompt_tokens: int) -> RequestResult:
        if self.first is None or self.last is None:
            return RequestResult(False, prompt_tokens, error="no token streamed")
        return RequestResult(True, prompt_tokens,
                             output_tokens=self.usage_tokens if self.usage_tokens is not None
                             else self.tokens,
                             ttft=self.first - self.start, latency=self.last - self.start,
                             itl=list(self.itl))


def _connection(base_url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    url = urllib.parse.urlsplit(base_url)
    cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    return cls(url.hostname or "127.0.0.1", url.port, timeout=timeout), url.path.rstrip("/")


def _headers(api_key: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def stream_completion(base_url: str, body: Mapping[str, object], timeout: float,
                      api_key: str = "",
                      clock: Callable[[], float] = time.perf_counter) -> RequestResult:
    prompt_tokens = len(body.get("prompt", []))  # type: ignore[arg-type]
    conn, prefix = _connection(base_url, timeout)
    tally = StreamTally(start=clock())
    try:
        conn.request("POST", f"{prefix}/v1/completions", json.dumps(body), _headers(api_key))
        response = conn.getresponse()
        if response.status != 200:
            detail = response.read(300).decode(errors="replace")
            return RequestResult(False, prompt_tokens, error=f"HTTP {response.status} {detail}")
        while True:
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            now = clock()
            data = json.loads(payload)
            if isinstance(data, Mapping) and data.get("error"):
                return RequestResult(False, prompt_tokens, error=str(data["error"])[:300])
            tally.event(data, now)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return RequestResult(False, prompt_tokens, error=f"{exc.__class__.__name__}: {exc}")
    finally:
        conn.close()
    return tally.result(prompt_tokens)


def get_json(base_url: str, path: str, timeout: float = 10.0, api_key: str = "") -> object:
    conn, prefix = _connection(base_url, timeout)
    try:
        conn.request("GET", prefix + path, headers=_headers(api_key))
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise OSError(f"GET {path}: HTTP {response.status}")
        return json.loads(body) if body else None
    finally:
        conn.close()


def served_model(base_url: str, api_key: str = "") -> str:
    data = get_json(base_url, "/v1/models", api_key=api_key)
    models = data.get("data", []) if isinstance(data, Mapping) else []
    if not models:
        raise OSError(f"{base_url}/v1/models lists no model")
    return str(models[0]["id"])


def run_load(base_url: str, spec: LoadSpec, api_key: str = "") -> dict[str, object]:
    """Run the load; returns {"spec", "metrics", "errors"} (errors: up to 10 distinct)."""
    model = spec.model or served_model(base_url, api_key)
    prompts = make_prompts(spec)
    send = lambda prompt: stream_completion(  # noqa: E731
        base_url, request_body(model, prompt, spec.output_len), spec.timeout_s, api_key)
    for prompt in prompts[: spec.warmup]:
        send(prompt)
    with ThreadPoolExecutor(max_workers=max(1, spec.concurrency)) as pool:
        start = time.perf_counter()
        results = list(pool.map(send, prompts))
        duration = time.perf_counter() - start
    errors = sorted({r.error for r in results if not r.ok})[:10]
    return {"spec": asdict(spec) | {"model": model}, "metrics": metrics.summarize(results, duration),
            "errors": errors}


# ---------------------------------------------------------------- side by side

@dataclass(frozen=True)
class Backend:
    name: str
    env: Mapping[str, str]
    args: tuple[str, ...]


def plugin_names(exclude_package: str = PLUGIN_PACKAGE) -> list[str]:
    """Names of installed vLLM plugins, except those provided by `exclude_package`."""
    names: set[str] = set()
    for group in VLLM_PLUGIN_GROUPS:
        for ep in metadata.entry_points(group=group):
            if not ep.value.split(":", 1)[0].split(".", 1)[0] == exclude_package:
                names.add(ep.name)
    return sorted(names)


def backends(other_plugins: Sequence[str]) -> dict[str, Backend]:
    return {
        "plugin": Backend("plugin", {}, ()),
        "vllm-aiter": Backend("vllm-aiter", {"VLLM_PLUGINS": ",".join(other_plugins)}, ()),
        "triton": Backend("triton", {}, ("--attention-backend", "TRITON_MLA")),
    }


def server_command(serve_args: Sequence[str], backend: Backend, port: int) -> list[str]:
    return [sys.executable, "-m", "rocm_vllm_runtime.serve", *serve_args, *backend.args,
            "--host", "127.0.0.1", "--port", str(port)]


def wait_healthy(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} before it was healthy")
        try:
            get_json(base_url, "/health", timeout=5.0)
            return
        except (OSError, ValueError, http.client.HTTPException):
            time.sleep(2.0)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f}s (raise --start-timeout)")


def stop(proc: subprocess.Popen[bytes], grace_s: float = 60.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_backend(backend: Backend, serve_args: Sequence[str], spec: LoadSpec, port: int,
                log_dir: Path, start_timeout_s: float) -> dict[str, object]:
    env = dict(os.environ) | dict(backend.env)
    log_path = log_dir / f"server-{backend.name}.log"
    command = server_command(serve_args, backend, port)
    print(f"== {backend.name}: {shlex.join(command[1:])} (log {log_path})", flush=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_healthy(base_url, proc, start_timeout_s)
            outcome = run_load(base_url, spec)
        finally:
            stop(proc)
    outcome["server_log"] = str(log_path)
    return outcome


def compare(names: Sequence[str], serve_args: Sequence[str], spec: LoadSpec, port: int,
            log_dir: Path, start_timeout_s: float) -> dict[str, object]:
    known = backends(plugin_names())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}: choose from {sorted(known)}")
    runs = {n: run_backend(known[n], serve_args, spec, port, log_dir, start_timeout_s)
            for n in names}
    columns = {n: run["metrics"] for n, run in runs.items()}
    doc: dict[str, object] = {"runs": runs}
    if len(names) > 1:
        doc["speedups"] = metrics.speedups(columns, names[0])  # type: ignore[arg-type]
    return doc


def render_compare(doc: Mapping[str, object]) -> str:
    runs = doc["runs"]
    assert isinstance(runs, Mapping)
    text = metrics.table({n: r["metrics"] for n, r in runs.items()})
    if doc.get("speedups"):
        text += "\n\n" + metrics.speedup_table(doc["speedups"], next(iter(runs)))  # type: ignore[arg-type]
    return text


# ---------------------------------------------------------------- CLI

def _spec_args(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--num-prompts", type=int, default=int(env("BENCH_NUM_PROMPTS", "1000")))
    parser.add_argument("--input-len", type=int, default=int(env("BENCH_INPUT_LEN", "1024")))
    parser.add_argument("--output-len", type=int, default=int(env("BENCH_OUTPUT_LEN", "128")))
    parser.add_argument("--concurrency", type=int, default=int(env("BENCH_CONCURRENCY", "64")))
    parser.add_argument("--seed", type=int, default=int(env("BENCH_SEED", "0")))
    parser.add_argument("--warmup", type=int, default=int(env("BENCH_WARMUP", "4")))
    parser.add_argument("--model", default=env("BENCH_MODEL_NAME", ""),
                        help="served model name (default: asked from /v1/models)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")


def spec_from(args: argparse.Namespace) -> LoadSpec:
    return LoadSpec(num_requests=args.num_prompts, input_len=args.input_len,
                    output_len=args.output_len, concurrency=args.concurrency, seed=args.seed,
                    warmup=args.warmup, model=args.model)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rocm_vllm_runtime.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="load a running server")
    run_p.add_argument("--base-url", default=os.environ.get("BENCH_BASE_URL", "http://127.0.0.1:8000"))
    _spec_args(run_p)
    cmp_p = sub.add_parser("compare", help="start one server per backend and compare")
    cmp_p.add_argument("--backends", default=os.environ.get("BENCH_BACKENDS", "plugin,vllm-aiter,triton"))
    cmp_p.add_argument("--port", type=int, default=int(os.environ.get("BENCH_PORT", "8011")))
    cmp_p.add_argument("--start-timeout", type=float,
                       default=float(os.environ.get("BENCH_START_TIMEOUT", "1800")))
    cmp_p.add_argument("--log-dir", default=os.environ.get("BENCH_LOG_DIR", "."))
    cmp_p.add_argument("serve_args", nargs="*", help="after --: arguments for every server")
    _spec_args(cmp_p)
    args = parser.parse_args(argv)

    spec = spec_from(args)
    if args.command == "run":
        doc: dict[str, object] = run_load(args.base_url, spec,
                                          os.environ.get("VLLM_API_KEY", ""))
        print(metrics.table({"result": doc["metrics"]}))  # type: ignore[dict-item]
        failed = int(doc["metrics"]["failed"])  # type: ignore[index]
    else:
        names = [n.strip() for n in args.backends.split(",") if n.strip()]
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        doc = compare(names, args.serve_args, spec, args.port, Path(args.log_dir),
                      args.start_timeout)
        print(render_compare(doc))
        failed = sum(int(r["metrics"]["failed"]) for r in doc["runs"].values())  # type: ignore[union-attr,index]
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    for error in doc.get("errors", []) or []:  # type: ignore[union-attr]
        print(f"error: {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
