#!/usr/bin/env python3
"""What the crash-safe start-up measurement of DeepSeek-V3's call sets (16 and 128 heads, bf16 and
fp8 KV, query lengths 1-4) costs, and where the time goes.

    PYTHONPATH=backend/src:runtime/src:backend/tests:backend/bench python3 backend/bench/start_cost.py \
        [--triton-file <vLLM's vllm/v1/attention/ops/triton_decode_attention.py>] [--sets all|one] \
        [--profile FILE] [--load-s SECONDS] [--load-only]

Prints, in this order:

* **process**: what a measurement child pays before it measures anything: a Python that does nothing,
  one that imports torch, one that also initialises the GPU, and the child with no task (its imports
  and its device);
* **first start**: each call set as a server's first start measures it (``crash_safe.measure_layer``
  with an empty record folder: a child, its record, then this process), in this process (the GPU
  initialised first, as vLLM's is), with Triton's own cache empty; the whole, and this process's part;
* **begun ahead**: a first start again (records and Triton's cache empty), every call set's first
  measurement begun at once (``crash_safe.begin``, as a server begins its layer's at model
  construction) and then collected (``crash_safe.measure_layer``): when each was collected, and this
  process's part;
* **load beside**: a first start as a server makes it, with a model load simulated (``--load-s`` seconds
  of weight copies from host to GPU, one tensor at a time): without begin (the first measurement, then
  the load) and begun (``crash_safe.begin`` before the load, collected after it), each in a fresh process
  with records and Triton's cache empty; what each start takes beyond the load is what the measurement
  costs it (``--load-only``: this section alone);
* **later start**: the same in a fresh process reading the records (in-process checks only), Triton's
  cache as the first start left it, and once more in that process (its kernels warm);
* **breakdown**: one call set's in-process measurement cut into its steps (the probe's inputs and
  dense result, the reference kernel's band, each kernel's runs, the classification), each timed
  after a synchronisation, with the host synchronisations it makes;
* **child timeline**: one child for one call set, each line it reports stamped on arrival (start and
  imports, then each task), with Triton's cache empty and filled.

--triton-file: vLLM's Triton MLA decode, loaded alone (``remedy_interpreted.load``), serves as the
remedy (no vLLM needed); without it the remedy's pure-PyTorch stand-in (``remedy_standins``) does. The
reference kernel stands in for AITER. --profile: torch.profiler's table of one warm call set, written
to FILE.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from vllm_aiter_mla import crash_safe, measure, measure_child, measurement_record, remedy
from vllm_aiter_mla.kernels import load_kernels

TRITON_FILE_ENV = "AITER_MLA_BENCH_TRITON_FILE"
FACTORY = "start_cost:factory"
STANDIN_FACTORY = "child_standins:right"
BF16 = torch.bfloat16


def factory(kind: str, splits: int):
    """The bench's kernels, in the child and here: the reference kernel for AITER; vLLM's Triton decode
    loaded from ``$AITER_MLA_BENCH_TRITON_FILE`` for the remedy."""
    if kind == "aiter":
        return load_kernels("reference")
    from remedy_interpreted import load  # noqa: PLC0415  (backend/tests)

    ops = load(os.environ[TRITON_FILE_ENV])
    return remedy.TritonDecode(remedy.NAME, ops.decode_attention_fwd,
                               getattr(ops, "decode_attention_fwd_verify", None), splits)


def call_sets(which: str, fp8: torch.dtype) -> list[tuple[str, tuple[measure.DecodeCall, ...]]]:
    sets = [(f"{heads:3} heads {'fp8' if dtype.itemsize == 1 else 'bf16'}", measure.layer_calls(heads, 4, dtype, dtype,
                                                                                                  BF16))
            for heads in (16, 128) for dtype in (BF16, fp8)]
    return sets if which == "all" else sets[:1]


def fp8_of(device: torch.device) -> torch.dtype:
    arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "") if device.type == "cuda" else ""
    return torch.float8_e4m3fnuz if "gfx942" in arch else torch.float8_e4m3fn


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started, done.returncode


def process_costs(device: torch.device, factory_name: str, calls, splits: int) -> None:
    python = sys.executable
    init = f"import torch; torch.zeros(1, device='{device}'); torch.cuda.synchronize()"
    for label, argv in (("python, nothing", [python, "-c", "pass"]),
                        ("python, import torch", [python, "-c", "import torch"]),
                        ("python, import torch, GPU initialised", [python, "-c", init]),
                        ("the child with no task (imports, device)",
                         measure_child.command(factory_name, calls, [], splits, device))):
        times = [_seconds(argv) for _ in range(2)]
        print(f"process  {label:44} {times[0][0]:6.2f} s, again {times[1][0]:6.2f} s (exit {times[1][1]})",
              flush=True)


def first_and_later(sets, kernels, triton, splits, device, factory_name, folder: str) -> None:
    env = {**os.environ, crash_safe.RECORDS_ENV: folder}
    whole = here = 0.0
    for label, calls in sets:
        began = time.perf_counter()
        found = crash_safe.measure_layer(kernels, triton, calls, splits, device, factory_name, environ=env)
        took = time.perf_counter() - began
        whole, here = whole + took, here + found.seconds
        chosen = measure.serving(found.measured, found.remedy, found.flags)
        print(f"first    {label}: {took:5.2f} s in all, {found.seconds:5.2f} s in this process; "
              f"{found.first.split(',')[0]}; serving {sorted(set(chosen.values()), key=str)}", flush=True)
    print(f"first    whole ({len(sets)} call sets): {whole:.2f} s, {here:.2f} s of it in this process", flush=True)


def begun_ahead(sets, kernels, triton, splits, device, factory_name, folder: str) -> None:
    """A first start whose first measurements are begun ahead (``crash_safe.begin``, as a server does at
    model construction), every call set's at once, then collected by ``measure_layer``."""
    env = {**os.environ, crash_safe.RECORDS_ENV: folder}
    began = time.perf_counter()
    for _, calls in sets:
        crash_safe.begin(factory_name, calls, splits, device, environ=env)
    here = 0.0
    for label, calls in sets:
        found = crash_safe.measure_layer(kernels, triton, calls, splits, device, factory_name, environ=env)
        here += found.seconds
        chosen = measure.serving(found.measured, found.remedy, found.flags)
        print(f"ahead    {label}: collected {time.perf_counter() - began:5.2f} s after the begin, "
              f"{found.seconds:5.2f} s in this process; {found.first.split(',')[0]}; "
              f"serving {sorted(set(chosen.values()), key=str)}", flush=True)
    print(f"ahead    whole ({len(sets)} call sets begun together): {time.perf_counter() - began:.2f} s, "
          f"{here:.2f} s of it in this process", flush=True)


MAX_LOAD_S = 3600.0


def simulated_load(device: torch.device, seconds: float) -> int:
    """A model's weights loaded for ``seconds``: tensors of 64 MiB copied from host memory to the device
    one at a time, as a loader does (its Python between copies included). Returns the bytes copied."""
    chunk = (64 << 20) // 2
    host = torch.randn(chunk).to(BF16)
    if device.type == "cuda":
        host = host.pin_memory()
    slots = [torch.empty(chunk, dtype=BF16, device=device) for _ in range(16)]
    copied, index = 0, 0
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        slots[index % len(slots)].copy_(host)
        _sync(device)
        copied += host.numel() * host.element_size()
        index += 1
    return copied


def load_beside(sets, kernels, triton, splits, device, factory_name, folder: str, mode: str,
                load_s: float) -> None:
    """One first start with a simulated model load (``simulated_load``): ``serial``, the first measurement
    of every call set and then the load (no begin); ``begun``, every set begun before the load and
    collected after it, as a server begins at the model's construction and collects once its weights are
    loaded."""
    env = {**os.environ, crash_safe.RECORDS_ENV: folder}
    began = time.perf_counter()
    here = 0.0
    if mode == "begun":
        for _, calls in sets:
            crash_safe.begin(factory_name, calls, splits, device, environ=env)
    loading = time.perf_counter()
    if mode == "begun":
        copied = simulated_load(device, load_s)
    loaded = time.perf_counter() - loading
    collecting = time.perf_counter()
    for _, calls in sets:
        found = crash_safe.measure_layer(kernels, triton, calls, splits, device, factory_name, environ=env)
        here += found.seconds
        if ("begun ahead" in found.first) != (mode == "begun"):
            print(f"load     {mode}: the first measurement was not as intended ({found.first})", flush=True)
    measuring = time.perf_counter() - collecting
    if mode == "serial":
        loading = time.perf_counter()
        copied = simulated_load(device, load_s)
        loaded = time.perf_counter() - loading
    whole = time.perf_counter() - began
    what = ("the first measurement, then the load" if mode == "serial"
            else "begun, the load beside it, then collected")
    print(f"load     {mode:6} ({len(sets)} call sets; {what}): load {loaded:.2f} s ({copied / 2**30:.1f} GiB), "
          f"measurement {'collected in ' if mode == 'begun' else ''}{measuring:.2f} s ({here:.2f} s in this "
          f"process): {whole:.2f} s in all, {whole - loaded:.2f} s beyond the load", flush=True)


def _load_seconds(raw: str) -> float:
    """--load-s through the project's one reading of numbers (a duration: no nan, inf, sign or exponent)."""
    from rocm_vllm_runtime import numeric  # noqa: PLC0415 - on PYTHONPATH with the backend (see the usage)

    try:
        return numeric.duration("--load-s", raw, MAX_LOAD_S)
    except numeric.SettingError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def later(sets, kernels, triton, splits, device, factory_name, folder: str, runs: int = 2) -> None:
    env = {**os.environ, crash_safe.RECORDS_ENV: folder}
    for run in range(runs):
        whole = 0.0
        for label, calls in sets:
            began = time.perf_counter()
            found = crash_safe.measure_layer(kernels, triton, calls, splits, device, factory_name, environ=env)
            took = time.perf_counter() - began
            whole += took
            if not found.first.startswith("read from its record"):
                print(f"later    {label}: the record was not read ({found.first})", flush=True)
            print(f"later{run + 1}   {label}: {took:5.2f} s", flush=True)
        what = "a fresh process" if run == 0 else "the same process again"
        print(f"later{run + 1}   whole ({len(sets)} call sets, {what}): {whole:.2f} s", flush=True)


class Steps:
    """Seconds and host synchronisations per step, each step timed after a synchronisation."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self.syncs: dict[str, int] = {}

    def run(self, name: str, function, *args, **kwargs):
        _sync(self.device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            began = time.perf_counter()
            result = function(*args, **kwargs)
            _sync(self.device)
            took = time.perf_counter() - began
        self.seconds[name] = self.seconds.get(name, 0.0) + took
        self.syncs[name] = self.syncs.get(name, 0) + sum("synchroniz" in str(w.message) for w in caught)
        return result


def breakdown(label: str, calls, kernels, triton, device: torch.device) -> Steps:
    """``measure.measure_both``'s work for ``calls``, step by step (the same functions, in the same order)."""
    steps = Steps(device)
    reference = load_kernels("reference")
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
    try:
        for call in calls:
            _, count = measure.key_ids(call.qlen)
            gen = torch.Generator(device).manual_seed(measure.PROBE_SEED)
            cache = torch.zeros((count, 1, measure.HEAD_DIM), dtype=call.kv_dtype, device=device)
            slots = steps.run("probe: slots", torch.randperm, count, generator=gen, device=device)
            batches = steps.run("probe: inputs and dense result", measure.probe_batches, call, device, slots)
            unjudged = measure.Probe(call, batches, cache, slots, math.nan, math.nan)
            ran = steps.run("probe: reference kernel's runs (band)", measure.run_probe, reference, unjudged,
                            range(len(batches)))
            own = steps.run("probe: fit of the reference (band)", measure.worst_fit, ran)
            probe = measure.Probe(call, batches, cache, slots, measure.band(own.deviation, call.out_dtype),
                                  measure.bound(own.systematic, call.out_dtype))
            for name, chosen in (("AITER (reference)", kernels), ("Triton", triton)):
                found = steps.run(f"{name}: runs", measure.run_probe, chosen, probe)
                steps.run(f"{name}: classify", measure.classify, found, probe.band, probe.bound)
    finally:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    total = sum(steps.seconds.values())
    print(f"breakdown {label} (warm, in this process): {total * 1000:.1f} ms", flush=True)
    for name, took in steps.seconds.items():
        print(f"breakdown   {name:42} {took * 1000:8.1f} ms  {steps.syncs[name]:4d} host syncs", flush=True)
    return steps


def child_timeline(device: torch.device, factory_name: str, calls, splits: int, triton_cache: str, label: str) -> None:
    """One child measuring ``calls`` (both kernels), each line it reports stamped on arrival."""
    tasks = [(kind, call.qlen) for kind in reversed(measure_child.KINDS) for call in calls]
    argv = measure_child.command(factory_name, calls, tasks, splits, device)
    env = {**os.environ, "TRITON_CACHE_DIR": triton_cache}
    began = time.perf_counter()
    stamps = []
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        for line in proc.stdout:
            if line.startswith(measure_child.LINE):
                stamps.append((time.perf_counter() - began, json.loads(line[len(measure_child.LINE):])))
    end = time.perf_counter() - began
    parts, last = [], 0.0
    for at, data in stamps:
        if ("begin" in data or "warm" in data) and not parts:
            parts.append(f"start, imports, device {at:.2f} s")
        elif "warmed" in data:
            parts.append(f"the remedy's kernels compiled side by side {at - last:.2f}")
        elif "done" in data:
            kind, qlen = data["done"]
            parts.append(f"{kind}@{qlen} {at - last:.2f}")
        last = at
    print(f"child    {label}: {end:.2f} s in all (exit {proc.returncode}): {'; '.join(parts)}; "
          f"exit {end - last:.2f} s", flush=True)


def profile(calls, kernels, triton, device: torch.device, path: str) -> None:
    from torch.profiler import ProfilerActivity  # noqa: PLC0415

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        measure.measure_both(kernels, triton, calls, device)
        _sync(device)
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=40)
    Path(path).write_text(table)
    print(f"profile  written to {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--triton-file", default="")
    parser.add_argument("--sets", choices=("all", "one"), default="all")
    parser.add_argument("--profile", default="")
    parser.add_argument("--later-only", default="", help=argparse.SUPPRESS)  # the records' folder
    parser.add_argument("--cold-steps", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load-s", type=_load_seconds, default=20.0,
                        help="seconds of the simulated model load (more than 0, at most an hour)")
    parser.add_argument("--load-only", action="store_true", help="only the load-beside section")
    parser.add_argument("--load-run", choices=("serial", "begun"), default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    began = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
    initialised = time.perf_counter() - began
    if args.triton_file:
        os.environ[TRITON_FILE_ENV] = str(Path(args.triton_file).resolve())
    factory_name = FACTORY if args.triton_file else STANDIN_FACTORY
    make = measure_child.factory_of(factory_name)
    splits = remedy.kv_splits(4096, torch.cuda.get_device_properties(device).multi_processor_count
                              if device.type == "cuda" else 1)
    sets = call_sets(args.sets, fp8_of(device))
    loading = time.perf_counter()
    kernels, triton = make("aiter", splits), make("triton", splits)
    loaded = time.perf_counter() - loading
    if args.cold_steps:  # what a later start pays once per process, before its measurement
        loading = time.perf_counter()
        measurement_record.builds()
        read = time.perf_counter() - loading
        print(f"fresh    GPU initialised {initialised:.2f} s, kernels loaded {loaded:.2f} s, installed builds read "
              f"{read:.2f} s (once per process)", flush=True)
        breakdown(f"{sets[0][0]}, a fresh process's first", sets[0][1], kernels, triton, device)
        return 0
    if args.later_only:
        later(sets, kernels, triton, splits, device, factory_name, args.later_only)
        return 0
    if args.load_run:  # one fresh process: records and Triton's cache empty (the caller's scratch folder)
        load_beside(sets, kernels, triton, splits, device, factory_name, os.environ[crash_safe.RECORDS_ENV],
                    args.load_run, args.load_s)
        return 0

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device   {device} ({name}), initialised in {initialised:.2f} s; torch {torch.__version__}; "
          f"remedy {'vLLM Triton file' if args.triton_file else 'PyTorch stand-in'}, {splits} splits", flush=True)

    def me(*options: str) -> list[str]:  # this bench in a fresh process, with these options
        return [sys.executable, *([] if __spec__ is None else ["-m", __spec__.name]),
                *([os.path.abspath(__file__)] if __spec__ is None else []), "--device", str(device),
                "--sets", args.sets, *options, *(["--triton-file", args.triton_file] if args.triton_file else [])]

    with tempfile.TemporaryDirectory(prefix="start-cost-") as scratch:
        for mode in ("serial", "begun"):  # each a fresh process, its records and Triton's cache empty
            env = {**os.environ, "TRITON_CACHE_DIR": os.path.join(scratch, f"triton-load-{mode}"),
                   crash_safe.RECORDS_ENV: os.path.join(scratch, f"records-load-{mode}")}
            subprocess.run(me("--load-s", f"{args.load_s:g}", "--load-run", mode), env=env, check=False)
        if args.load_only:
            return 0
        triton_cold = os.path.join(scratch, "triton-first")
        os.environ["TRITON_CACHE_DIR"] = triton_cold  # this process and its children: nothing compiled yet
        folder = os.path.join(scratch, "records")
        process_costs(device, factory_name, sets[0][1], splits)
        first_and_later(sets, kernels, triton, splits, device, factory_name, folder)
        os.environ["TRITON_CACHE_DIR"] = os.path.join(scratch, "triton-ahead")  # nothing compiled yet
        begun_ahead(sets, kernels, triton, splits, device, factory_name, os.path.join(scratch, "records-ahead"))
        os.environ["TRITON_CACHE_DIR"] = triton_cold
        subprocess.run(me("--later-only", folder), check=False)
        subprocess.run(me("--cold-steps"), check=False)
        for label, calls in sets:
            breakdown(label, calls, kernels, triton, device)
        label, calls = sets[0]
        child_timeline(device, factory_name, calls, splits, os.path.join(scratch, "triton-empty"),
                       f"{label}, Triton's cache empty")
        child_timeline(device, factory_name, calls, splits, triton_cold, f"{label}, Triton's cache filled")
        if args.profile:
            profile(sets[-1][1], kernels, triton, device, args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
