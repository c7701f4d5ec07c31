"""Serving benchmark of attention backends side by side, each measured by vLLM's `vllm bench serve`.

For each backend in turn: start a server with the serve launcher (`python3 -m
rocm_vllm_runtime.serve`, so its defaults apply) on 127.0.0.1, read from its log which
attention backend it selected and whether this project's implementation runs, load it with
`vllm bench serve` (random dataset, fixed input and output lengths, greedy, EOS ignored), stop
it. Then print the runs side by side with the ratios of the first backend to each other one,
and write them as JSON.

Backends (NAME: what its server must select):
  plugin      ROCM_AITER_MLA, this project's implementation (vLLM's own selection)
  vllm-aiter  ROCM_AITER_MLA, vLLM's built-in one (the plugin left out of VLLM_PLUGINS)
  triton      TRITON_MLA (--attention-backend TRITON_MLA)
  cpu-plugin  CPU_MLA with this project's CPU development mode (reference kernels; no GPU)
  cpu-vllm    CPU_MLA, vLLM's own (the plugin left out; no GPU)

A run fails when its server selects another attention backend or implementation than its
name asks (checked in the log while the server starts, and again before the load), exits or
is not healthy in time, or when a request fails. The servers need the model's tokenizer
(`--no-skip-tokenizer-init` is passed; the tiny model ships one).

    python3 -m rocm_vllm_runtime.bench --json bench.json -- --model /models/DeepSeek-R1 -tp 8
    python3 -m rocm_vllm_runtime.bench --backends cpu-plugin,cpu-vllm --num-prompts 4 \\
        --input-len 32 --output-len 8 -- --dtype float32 --max-model-len 512
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import children, files, health, numeric, web
from .distributions import MetadataError, entry_points_of
from .guard import kfd_path
from .selection import OURS, VLLMS, Selection, selection
from .secret_values import shown

PLUGIN_PACKAGE = "vllm_aiter_mla"
VLLM_PLUGIN_GROUPS = ("vllm.general_plugins", "vllm.platform_plugins",
                      "vllm.io_processor_plugins", "vllm.stat_logger_plugins")
ENV_DEFAULTS = {  # setting: default, shared by the CLI and the bench suite
    "BENCH_BACKENDS": "plugin,vllm-aiter,triton", "BENCH_NUM_PROMPTS": "1000", "BENCH_INPUT_LEN": "1024",
    "BENCH_OUTPUT_LEN": "128", "BENCH_CONCURRENCY": "64", "BENCH_SEED": "0", "BENCH_WARMUPS": "4",
    "BENCH_ARGS": "", "BENCH_PORT": "8011", "BENCH_START_TIMEOUT": "1800",
}
# (least, most) of each count setting
COUNT_RANGES = {"BENCH_NUM_PROMPTS": (1, 1_000_000), "BENCH_INPUT_LEN": (1, 1_048_576),
                "BENCH_OUTPUT_LEN": (1, 1_048_576), "BENCH_CONCURRENCY": (1, 65_536),
                "BENCH_SEED": (0, 2**32 - 1), "BENCH_WARMUPS": (0, 1000)}
RATIO_KEYS = ("request_throughput", "output_throughput", "total_token_throughput",
              "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")
HIGHER_IS_BETTER = {"request_throughput", "output_throughput", "total_token_throughput"}
TABLE_ROWS: tuple[tuple[str, str], ...] = (
    ("completed", "Successful requests"), ("failed", "Failed requests"), ("duration", "Benchmark duration (s)"),
    ("total_input_tokens", "Total input tokens"), ("total_output_tokens", "Total output tokens"),
    ("request_throughput", "Request throughput (req/s)"), ("output_throughput", "Output token throughput (tok/s)"),
    ("total_token_throughput", "Total token throughput (tok/s)"),
    ("mean_ttft_ms", "Mean TTFT (ms)"), ("p99_ttft_ms", "P99 TTFT (ms)"),
    ("mean_tpot_ms", "Mean TPOT (ms)"), ("p99_tpot_ms", "P99 TPOT (ms)"),
    ("mean_itl_ms", "Mean ITL (ms)"), ("p99_itl_ms", "P99 ITL (ms)"),
)
# What a CPU backend's server gets unless the environment sets it (compose.cpu.yaml's default): GiB
# for its KV cache. Unset, vLLM's CPU worker asks for --gpu-memory-utilization (0.9) of the machine's
# memory and stops when less is free, as it is with a second process on the machine.
CPU_SERVER_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1"}


class BenchError(Exception):
    """A setting the benchmark cannot work with; the message names it."""


# ---------------------------------------------------------------- backends

@dataclass(frozen=True)
class Backend:
    name: str
    attention_backend: str  # what vLLM must log as selected
    implementation: str  # OURS or VLLMS
    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    needs_gpu: bool = True


def plugin_names(exclude_package: str = PLUGIN_PACKAGE) -> list[str]:
    """Names of installed vLLM plugins, except those provided by `exclude_package`."""
    names: set[str] = set()
    for group in VLLM_PLUGIN_GROUPS:
        for name, value in entry_points_of(group):
            if value.split(":", 1)[0].split(".", 1)[0] != exclude_package:
                names.add(name)
    return sorted(names)


def backends(other_plugins: Sequence[str]) -> dict[str, Backend]:
    without_plugin = {"VLLM_PLUGINS": ",".join(other_plugins)}
    cpu_mla = ("--attention-backend", "CPU_MLA")
    return {b.name: b for b in (
        Backend("plugin", "ROCM_AITER_MLA", OURS),
        Backend("vllm-aiter", "ROCM_AITER_MLA", VLLMS, without_plugin),
        Backend("triton", "TRITON_MLA", VLLMS, {}, ("--attention-backend", "TRITON_MLA")),
        Backend("cpu-plugin", "CPU_MLA", OURS, {"AITER_MLA_KERNELS": "reference"}, cpu_mla, needs_gpu=False),
        Backend("cpu-vllm", "CPU_MLA", VLLMS, without_plugin, cpu_mla, needs_gpu=False),
    )}


def choose(names: Sequence[str], known: Mapping[str, Backend], setting: str = "BENCH_BACKENDS") -> list[Backend]:
    """The backends ``names`` asks for; the error names ``setting``, the variable they came from."""
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise BenchError(f"{setting} / --backends: unknown or no backend {unknown or ''}: "
                         f"choose from {', '.join(known)}")
    if len(set(names)) != len(names):
        raise BenchError(f"{setting} / --backends names a backend twice: {', '.join(names)}")
    return [known[n] for n in names]


def missing_device(chosen: Sequence[Backend], env: Mapping[str, str] = os.environ) -> str | None:
    """The compute device node (guard.kfd_path) that a chosen backend needs and this container lacks;
    None when every chosen backend runs on the CPU or the node is there."""
    kfd = kfd_path(env)
    return kfd if any(b.needs_gpu for b in chosen) and not os.path.exists(kfd) else None


def mismatch(backend: Backend, selected: Selection, complete: bool) -> str:
    """Why `selected` is not what `backend` asks ('' when it is, or may still become so).

    `complete`: the server is up, so every selection it makes has been logged."""
    others = [n for n in selected.attention_backends if n != backend.attention_backend]
    if others:
        return (f"{backend.name}: the server selected {', '.join(selected.attention_backends)}, "
                f"not {backend.attention_backend}")
    if not complete:
        return ""
    if not selected.attention_backends:
        return f"{backend.name}: the server logged no attention backend selection (asked {backend.attention_backend})"
    if selected.implementation != backend.implementation:
        return (f"{backend.name}: {backend.attention_backend} ran {selected.implementation}'s implementation, "
                f"not {backend.implementation}'s")
    return ""


# ---------------------------------------------------------------- load (vllm bench serve)

@dataclass(frozen=True)
class Load:
    num_prompts: int = 1000
    input_len: int = 1024
    output_len: int = 128
    concurrency: int = 64
    seed: int = 0
    warmups: int = 4
    extra: tuple[str, ...] = ()  # further `vllm bench serve` arguments

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Load:
        def number(name: str) -> int:
            try:
                return numeric.whole(name, env.get(name) or ENV_DEFAULTS[name], *COUNT_RANGES[name])
            except numeric.SettingError as exc:
                raise BenchError(str(exc)) from None

        extra = tuple(split_setting(env, "BENCH_ARGS"))
        return cls(number("BENCH_NUM_PROMPTS"), number("BENCH_INPUT_LEN"), number("BENCH_OUTPUT_LEN"),
                   number("BENCH_CONCURRENCY"), number("BENCH_SEED"), number("BENCH_WARMUPS"), extra)


def split_setting(env: Mapping[str, str], name: str) -> list[str]:
    try:
        return shlex.split(env.get(name, ""))
    except ValueError as exc:
        raise BenchError(f"{name} cannot be split as shell words ({exc}): fix its quoting") from None


def bench_argv(load: Load, base_url: str, result_dir: Path, result_name: str) -> list[str]:
    """Arguments of `vllm bench serve` for `load` against the server at `base_url`."""
    return [
        "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--dataset-name", "random", "--random-input-len", str(load.input_len),
        "--random-output-len", str(load.output_len), "--num-prompts", str(load.num_prompts),
        "--max-concurrency", str(load.concurrency), "--seed", str(load.seed),
        "--num-warmups", str(load.warmups), "--temperature", "0", "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(result_dir), "--result-filename", result_name,
        *load.extra,
    ]


def vllm_bench_serve(argv: Sequence[str]) -> None:
    """`vllm bench serve ARGV`, run in this process through vLLM's own subcommand (the `vllm`
    console script needs package metadata named vllm, which CPU builds of vLLM lack)."""
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand  # noqa: PLC0415
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    BenchmarkServingSubcommand.add_cli_args(parser)
    BenchmarkServingSubcommand.cmd(parser.parse_args(list(argv)))


def summarize(result: Mapping[str, object]) -> tuple[dict[str, float], list[str]]:
    """The scalar metrics of a `vllm bench serve` result file and its distinct errors (up to 10)."""
    metrics = {k: float(v) for k, v in result.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    errors = sorted({str(e) for e in result.get("errors") or [] if e})[:10]  # type: ignore[union-attr]
    return metrics, errors


# ---------------------------------------------------------------- one server

def server_command(serve_args: Sequence[str], backend: Backend, port: int) -> list[str]:
    return [sys.executable, "-m", "rocm_vllm_runtime.serve", *serve_args, *backend.args,
            "--no-skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port)]


def server_env(backend: Backend, base: Mapping[str, str]) -> dict[str, str]:
    # The server listens on 127.0.0.1 for this benchmark only: no API key (vllm bench serve sends none).
    env = {k: v for k, v in base.items() if k != "VLLM_API_KEY"}
    defaults = {} if backend.needs_gpu else {k: v for k, v in CPU_SERVER_DEFAULTS.items() if not env.get(k)}
    return env | defaults | dict(backend.env)


def healthy(base_url: str, timeout_s: float = 5.0) -> bool:
    """Whether the server answers /health within timeout_s, all of it (a server that trickles
    bytes cannot hold the caller past it)."""
    return not health.within(timeout_s, health.problem, base_url, False, "", timeout_s)


def grace(finished: bool, base_url: str) -> float:
    """Seconds a server may take to stop: a minute once it served (``finished``) or while it is
    healthy, 5 s when it never came up (asked by children.stop with signals held; once this process is
    told to stop it gives 5 s without asking)."""
    return 60.0 if finished or healthy(base_url) else 5.0


def start_problem(backend: Backend, proc: subprocess.Popen[bytes], base_url: str, log: Path,
                  timeout_s: float) -> str:
    """Wait until the server is healthy; '' then, else why it is not (wrong selection included)."""
    deadline = time.monotonic() + timeout_s
    while True:
        problem = mismatch(backend, selection(log.read_text(errors="replace")), complete=False)
        if problem:
            return problem
        if proc.poll() is not None:
            return f"{backend.name}: the server exited with status {proc.returncode} before it was healthy (see {log})"
        if healthy(base_url, max(0.1, min(5.0, deadline - time.monotonic()))):
            return mismatch(backend, selection(log.read_text(errors="replace")), complete=True)
        if time.monotonic() > deadline:
            return (f"{backend.name}: the server was not healthy after {timeout_s:.0f}s "
                    "(raise BENCH_START_TIMEOUT / --start-timeout)")
        time.sleep(1.0)


def run_backend(backend: Backend, serve_args: Sequence[str], load: Load, port: int, out_dir: Path,
                start_timeout_s: float) -> dict[str, object]:
    log = files.inside(out_dir, f"server-{backend.name}.log", "a backend's name")
    result_file = files.inside(out_dir, f"vllm-bench-{backend.name}.json", "a backend's name")
    before = files.stamp(result_file)  # a file of that name already there is not this run's (nor removed)
    command = server_command(serve_args, backend, port)
    base_url = f"http://127.0.0.1:{port}"
    print(f"== {backend.name}: {shown(command[1:])} (log {log})", flush=True)
    run: dict[str, object] = {"asked": {"attention_backend": backend.attention_backend,
                                        "implementation": backend.implementation},
                              "server_log": str(log), "result_file": str(result_file)}
    problems: list[str] = []
    errors: list[str] = []
    metrics: dict[str, float] = {}
    # A server that never came up has nothing to finish: no grace period for it.
    with children.started(command, log, server_env(backend, os.environ),
                          grace_s=lambda: grace(bool(metrics), base_url)) as proc:
        problem = start_problem(backend, proc, base_url, log, start_timeout_s)
        if problem:
            problems.append(problem)
        else:
            try:
                with web.direct():  # its aiohttp client reads proxies from the environment
                    vllm_bench_serve(bench_argv(load, base_url, out_dir, result_file.name))
            except Exception as exc:  # noqa: BLE001 -- reported as this run's failure, the next runs go on
                problems.append(f"{backend.name}: vllm bench serve failed: {exc.__class__.__name__}: {exc}")
            if result_file.is_file() and files.stamp(result_file) != before:
                metrics, errors = summarize(files.read_json(result_file))
            elif not problems:
                problems.append(f"{backend.name}: vllm bench serve wrote no {result_file.name}")
    selected = selection(log.read_text(errors="replace"))
    run["selected"] = {"attention_backends": list(selected.attention_backends),
                       "implementation": selected.implementation}
    problems += load_problems(backend.name, metrics, load) if metrics else []
    run.update(ok=not problems, problems=problems, errors=errors, metrics=metrics)
    return run


def load_problems(name: str, metrics: Mapping[str, float], load: Load) -> list[str]:
    """What makes a finished load a failed run: failed requests, fewer requests or tokens than sent."""
    out = []
    if metrics.get("failed", 0):
        out.append(f"{name}: {metrics['failed']:.0f} of {load.num_prompts} requests failed")
    if metrics.get("completed") != load.num_prompts:
        out.append(f"{name}: {metrics.get('completed', 0):.0f} of {load.num_prompts} requests completed")
    elif metrics.get("total_output_tokens") != load.num_prompts * load.output_len:
        out.append(f"{name}: {metrics.get('total_output_tokens', 0):.0f} output tokens, "
                   f"expected {load.num_prompts} x {load.output_len}")
    return out


# ---------------------------------------------------------------- side by side

def ratios(columns: Mapping[str, Mapping[str, float]], reference: str) -> dict[str, dict[str, float]]:
    """How much better `reference` is than each other run, per metric (>1: reference better).

    Throughputs: reference / other. Latencies: other / reference. NaN where a value is missing or 0."""
    base = columns[reference]

    def ratio(key: str, values: Mapping[str, float]) -> float:
        ours, theirs = base.get(key, 0.0), values.get(key, 0.0)
        num, den = (ours, theirs) if key in HIGHER_IS_BETTER else (theirs, ours)
        return num / den if num and den else math.nan

    return {name: {key: ratio(key, values) for key in RATIO_KEYS}
            for name, values in columns.items() if name != reference}


def compare(chosen: Sequence[Backend], serve_args: Sequence[str], load: Load, port: int, out_dir: Path,
            start_timeout_s: float) -> dict[str, object]:
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {b.name: run_backend(b, serve_args, load, port, out_dir, start_timeout_s) for b in chosen}
    return document(runs, load)


def document(runs: Mapping[str, Mapping[str, object]], load: Load) -> dict[str, object]:
    names = list(runs)
    doc: dict[str, object] = {"load": asdict(load), "reference": names[0], "runs": dict(runs),
                              "ok": all(r.get("ok") for r in runs.values())}
    if len(names) > 1:
        doc["ratios"] = ratios({n: r.get("metrics") or {} for n, r in runs.items()}, names[0])  # type: ignore[misc]
    return doc


def _cell(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def render(doc: Mapping[str, object]) -> str:
    """Printed comparison: selections, one column per run, ratios, problems."""
    runs: Mapping[str, Mapping] = doc["runs"]  # type: ignore[assignment]
    names = list(runs)
    lines = []
    for name, run in runs.items():
        asked, selected = run.get("asked", {}), run.get("selected", {})
        chosen = ", ".join(selected.get("attention_backends") or []) or "(none logged)"
        lines.append(f"{name}: asked {asked.get('attention_backend')} ({asked.get('implementation')}), "
                     f"selected {chosen} ({selected.get('implementation', '?')})"
                     f" -> {'ok' if run.get('ok') else 'FAILED'}")
    width = max(len(label) for _, label in TABLE_ROWS)
    col = max([12, *(len(n) for n in names)])
    lines += ["", f"{'':{width}}  " + "  ".join(f"{n:>{col}}" for n in names)]
    for key, label in TABLE_ROWS:
        cells = [_cell((runs[n].get("metrics") or {}).get(key)) for n in names]
        lines.append(f"{label:{width}}  " + "  ".join(f"{c:>{col}}" for c in cells))
    for other, row in (doc.get("ratios") or {}).items():  # type: ignore[union-attr]
        cells = ", ".join(f"{k} {v:.2f}x" for k, v in row.items())
        lines.append(f"{doc['reference']} vs {other}: {cells}")
    for run in runs.values():
        lines += [f"problem: {p}" for p in run.get("problems") or []]
        lines += [f"  request error: {e}" for e in run.get("errors") or []]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    env = os.environ
    parser = argparse.ArgumentParser(prog="python3 -m rocm_vllm_runtime.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=env.get("BENCH_BACKENDS") or ENV_DEFAULTS["BENCH_BACKENDS"],
                        help="comma-separated, the first is the reference of the ratios (BENCH_BACKENDS)")
    for option, name in (("--num-prompts", "BENCH_NUM_PROMPTS"), ("--input-len", "BENCH_INPUT_LEN"),
                         ("--output-len", "BENCH_OUTPUT_LEN"), ("--concurrency", "BENCH_CONCURRENCY"),
                         ("--seed", "BENCH_SEED"), ("--warmups", "BENCH_WARMUPS")):
        parser.add_argument(option, dest=name, default=None, help=f"default ${name} or {ENV_DEFAULTS[name]}")
    parser.add_argument("--bench-args", dest="BENCH_ARGS", default=None,
                        help="further `vllm bench serve` arguments, shell-quoted (BENCH_ARGS)")
    parser.add_argument("--port", dest="BENCH_PORT", default=None, help="default $BENCH_PORT or 8011")
    parser.add_argument("--start-timeout", dest="BENCH_START_TIMEOUT", default=None,
                        help="seconds for a server to become healthy (default $BENCH_START_TIMEOUT or 1800)")
    parser.add_argument("--out-dir", default=env.get("BENCH_OUT_DIR") or ".",
                        help="server logs and vLLM's result files (BENCH_OUT_DIR, default .)")
    parser.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    parser.add_argument("serve_args", nargs="*", help="after --: arguments for every server")
    args = parser.parse_args(argv)

    problem = files.outputs_problem({"--json": args.json}, {"--out-dir": args.out_dir})
    if problem:
        print(f"bench: error: {problem}", file=sys.stderr)
        return 2
    merged = {**env, **{k: v for k, v in vars(args).items() if k.startswith("BENCH_") and v is not None}}
    children.forward_signals()
    try:
        load = Load.from_env(merged)
        chosen = choose([n.strip() for n in args.backends.split(",") if n.strip()], backends(plugin_names()))
        port = numeric.port("BENCH_PORT / --port", merged.get("BENCH_PORT") or ENV_DEFAULTS["BENCH_PORT"])
        start_timeout = numeric.duration("BENCH_START_TIMEOUT / --start-timeout",
                                         merged.get("BENCH_START_TIMEOUT") or ENV_DEFAULTS["BENCH_START_TIMEOUT"])
    except (BenchError, numeric.SettingError, MetadataError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    doc = compare(chosen, args.serve_args, load, port, Path(args.out_dir), start_timeout)
    print(render(doc), flush=True)
    if args.json and not files.write_result("bench", "--json", args.json, json.dumps(doc, indent=2) + "\n"):
        return 2
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
