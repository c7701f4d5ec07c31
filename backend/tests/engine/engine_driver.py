"""Run the tiny MLA model in vLLM's CPU engine and record greedy tokens + logprobs.

    python engine_driver.py --backend ours|cpu_mla --plan plan.json --out result.json

The results so far are written to --out after each engine (the plan's engines in its order).

One process runs every configuration of one backend the tests ask for (``plan.json``: a list of
runs, each naming its model, dtype, schedule, fault and kernels), one engine after another: vLLM, torch and
the plugin are imported once, and the runs that share an engine's settings (model, dtype, prefix
caching, kernels) share one engine. ``ours``: this package's CPU development mode
(AITER_MLA_KERNELS=reference), ``cpu_mla``: vLLM's own CPU MLA backend. The engine core runs in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the decode-call counter and the fault
injection act on the engine that serves the requests; a fault or a recorder is installed for its
run (or engine) alone and removed after it. With the ``waves`` schedule requests arrive in two
waves: the second while the first is decoding.

``kernels`` (``engine_kernels.SETS``; none: the reference kernel, vLLM's Triton decode measured as it
loads): stand-ins for AITER's decode and the remedy, installed for that engine alone; its run records
this package's start-up lines (``startup_lines``) and how often the remedy stand-in was called while
serving; an engine whose start is refused records the error's text (``refused``) and serves nothing.

Both sides name their attention backend explicitly (``CPU_MLA``): vLLM's CPU platform
would pick ``AMX_MLA`` on CPUs with AMX tiles, and in CPU development mode the plugin
points the ``CPU_MLA`` entry at this package. Each run records the attention
implementation classes that really ran and what vLLM's CPU platform would have picked
with no backend named and with CPU_MLA named (``platform_choices``), so a test sees the
selection it relies on.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable

PROMPT_LENGTHS = [1, 7, 200, 33, 64, 2, 150, 90, 11, 128]
FIRST_WAVE = 5
STEPS_BEFORE_SECOND_WAVE = 6


def prompts(vocab: int = 1024, seed: int = 1234) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]


def install_fault() -> Callable[[], None]:
    """Replace the newest key of every request with the slot before it (in the plan the
    metadata builder gets from planning). Returns what removes it."""
    import vllm_aiter_mla.backend as backend

    real = backend.plan_decode_step

    def off_by_one(buffers, block_table, seq_lens, *args, **kwargs):
        step = real(buffers, block_table, seq_lens, *args, **kwargs)
        plan = step.plan
        last = plan.kv_indptr[1:].long() - 1
        idx = last[seq_lens > 1]
        plan.kv_indices[idx] = plan.kv_indices[idx - 1]
        return step

    backend.plan_decode_step = off_by_one
    return lambda: setattr(backend, "plan_decode_step", real)


# shared-prefix schedule: requests on one cached prompt prefix of SHARED_PREFIX_BLOCKS full
# blocks (block size 16) plus one token of their own, in a KV cache of SHARED_CACHE_BLOCKS
# blocks: their decode steps reference far more keys than the cache has slots.
SHARED_PREFIX_BLOCKS = 20
SHARED_CACHE_BLOCKS = 80
SHARED_REQUESTS = 16
MAX_NUM_SEQS = 16


def keep_prefix_caching() -> Callable[[], None]:
    """vLLM's CPU platform turns prefix caching off for MLA models (its CPU MLA prefill has no
    cached-context path). The shared-prefix schedule only ever prefills without context (the
    first request) and decodes the rest, so prefix caching is turned back on after the
    platform's check, in this process (the engine core runs in it). Returns what undoes it."""
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__

    def check_and_keep(cls, vllm_config):
        check(cls, vllm_config)
        vllm_config.cache_config.enable_prefix_caching = True

    CpuPlatform.check_and_update_config = classmethod(check_and_keep)
    return lambda: setattr(CpuPlatform, "check_and_update_config", classmethod(check))


def record_step_keys(step_keys: list[int]) -> Callable[[], None]:
    """Σ max(seq_len, qlen) of every decode step this backend plans (what kv_indices holds), into
    ``step_keys``. Returns what stops recording."""
    import vllm_aiter_mla.backend as backend

    real = backend.plan_decode_step

    def recorded(buffers, block_table, seq_lens, qlen, *args, **kwargs):
        step_keys.append(int(seq_lens.clamp(min=qlen).sum()))
        return real(buffers, block_table, seq_lens, qlen, *args, **kwargs)

    backend.plan_decode_step = recorded
    return lambda: setattr(backend, "plan_decode_step", real)


def attention_impls(worker) -> list[str]:
    """Classes of the attention implementations of a worker's model (run in the worker)."""
    layers = worker.model_runner.vllm_config.compilation_config.static_forward_context.values()
    return sorted({f"{type(layer.impl).__module__}.{type(layer.impl).__qualname__}"
                   for layer in layers if getattr(layer, "impl", None) is not None})


def platform_choices(dtype: str) -> dict:
    """The MLA backend vLLM's CPU platform picks when none is named (``auto``: AMX_MLA on AMX
    CPUs) and when CPU_MLA is named (``named``), and whether torch's CPU kernels see AMX tiles."""
    import torch
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    config = AttentionSelectorConfig(head_size=576, dtype=getattr(torch, dtype), kv_cache_dtype="auto",
                                     block_size=16, use_mla=True)
    return {"auto": CpuPlatform.get_attn_backend_cls(None, config),
            "named": CpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CPU_MLA, config),
            "kernels_see_amx": bool(torch.cpu._is_amx_tile_supported())}


def installed_aiter() -> str | None:
    """The version of the AITER distribution this process sees installed (None: none)."""
    from importlib import metadata

    for name in ("amd-aiter", "aiter"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


MAX_TOKENS = 32
SCHEDULES = ("waves", "sequential", "shared-prefix", "brief")
BRIEF_PROMPTS = (0, 2)  # brief: two requests (1 and 200 prompt tokens) together, BRIEF_TOKENS each
BRIEF_TOKENS = 8
# sequential: the first prompts one at a time (1 to 200 tokens long), as a client sending one request after
# another; each request decodes alone, so every request costs a whole run of decode steps
SEQUENTIAL_PROMPTS = 4
FAULTS = ("none", "last-slot-off-by-one")


def read_plan(path: str) -> list[dict]:
    """The runs of ``path``: each a dict with name, model, dtype, schedule, fault, kernels."""
    from engine_kernels import SETS

    with open(path, encoding="utf-8") as f:
        runs = json.load(f)
    for run in runs:
        kernels = run["kernels"].split("|") if run["kernels"] else []
        if run["schedule"] not in SCHEDULES or run["fault"] not in FAULTS or not set(kernels) <= set(SETS):
            raise SystemExit(f"run {run['name']}: schedule must be one of {SCHEDULES}, fault one of {FAULTS}, "
                             f"kernels one of {SETS} (or one per tensor-parallel rank, | between them)")
    return runs


def engine_settings(run: dict) -> tuple[str, str, bool, str | None]:
    """What one engine serves a run with: model, dtype, whether prefix caching is on, kernel set."""
    return run["model"], run["dtype"], run["schedule"] == "shared-prefix", run["kernels"]


class StartupLines:
    """This package's log records (logger ``vllm.aiter_mla``) of level INFO and above while installed.
    Recorded where the logger hands a record on, not by a handler: vLLM configures logging again as an
    engine starts, which drops its child loggers' handlers."""

    def __init__(self):
        import logging

        self.lines: list[str] = []
        self.logger = logging.getLogger("vllm.aiter_mla")
        real = self.logger.handle

        def handle(record):
            if record.levelno >= logging.INFO:
                self.lines.append(record.getMessage())
            return real(record)

        self.logger.handle = handle

    def remove(self) -> None:
        del self.logger.handle


# A tensor-parallel engine (a kernel set per rank, ``a|b``): its measurement children's time limit,
# long enough for a child to start and measure the remedy on a busy 2-core machine before AITER's call
# hangs (20 s was not, once in two runs of the whole suite: the aborting rank's child passed it too).
TP_MEASURE_TIMEOUT_S = "40"


def make_engine(model: str, dtype: str, shared: bool, tensor_parallel: int = 1):
    from vllm import LLM

    extra = {}
    if shared:
        extra = {"enable_prefix_caching": True, "num_gpu_blocks_override": SHARED_CACHE_BLOCKS, "block_size": 16}
    if tensor_parallel > 1:
        extra.update(tensor_parallel_size=tensor_parallel, distributed_executor_backend="mp")
    return LLM(
        model=model,
        load_format="safetensors",
        skip_tokenizer_init=True,
        dtype=dtype,
        max_model_len=512,
        max_num_seqs=MAX_NUM_SEQS,
        gpu_memory_utilization=0.5,
        seed=0,
        enforce_eager=True,
        attention_config={"backend": "CPU_MLA"},
        **extra,
    )


def serve_schedule(engine, schedule: str) -> dict[str, dict]:
    """Greedy tokens and their logprobs of every request of ``schedule``, by request id."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=BRIEF_TOKENS if schedule == "brief" else MAX_TOKENS,
                            logprobs=0, ignore_eos=True, detokenize=False)
    results: dict[str, dict] = {}

    def collect(outputs) -> None:
        for out in outputs:
            if out.finished:
                comp = out.outputs[0]
                results[out.request_id] = {
                    "token_ids": list(comp.token_ids),
                    "logprobs": [lp[tok].logprob for lp, tok in zip(comp.logprobs, comp.token_ids)],
                }

    def drain() -> None:
        while engine.has_unfinished_requests():
            collect(engine.step())

    all_prompts = prompts()
    if schedule == "shared-prefix":
        rng = random.Random(99)
        prefix = [rng.randrange(2, 1024) for _ in range(SHARED_PREFIX_BLOCKS * 16)]
        engine.add_request("0", {"prompt_token_ids": prefix + [5]}, params)
        collect(engine.step())  # its prefill: the prefix's blocks are cached from here on
        for i in range(1, SHARED_REQUESTS):
            engine.add_request(str(i), {"prompt_token_ids": prefix + [6 + i]}, params)
        drain()
    elif schedule == "brief":
        for i in BRIEF_PROMPTS:
            engine.add_request(str(i), {"prompt_token_ids": all_prompts[i]}, params)
        drain()
    elif schedule == "sequential":
        for i, prompt in enumerate(all_prompts[:SEQUENTIAL_PROMPTS]):
            engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
            drain()
    else:
        for i in range(FIRST_WAVE):
            engine.add_request(str(i), {"prompt_token_ids": all_prompts[i]}, params)
        for _ in range(STEPS_BEFORE_SECOND_WAVE):
            collect(engine.step())
        for i in range(FIRST_WAVE, len(all_prompts)):
            engine.add_request(str(i), {"prompt_token_ids": all_prompts[i]}, params)
        drain()
    return results


def decode_calls(backend: str) -> int | None:
    if backend != "ours":
        return None
    from vllm_aiter_mla import cpu_dev

    return cpu_dev._decode_calls


def set_environ(**values: str) -> Callable[[], None]:
    """Set these variables of this process (its engine's workers and their children inherit them).
    Returns what restores them."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)

    def restore() -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return restore


def remedy_calls() -> int:
    """Calls of the remedy's stand-in in this process (0 where no kernel set was installed)."""
    module = sys.modules.get("engine_kernels")
    return module.remedy_calls() if module else 0


def run_engine(backend: str, runs: list[dict]) -> dict[str, dict]:
    """Every run of ``runs`` (one engine's settings) on one engine, each with its own fault."""
    model, dtype, shared, kernels = engine_settings(runs[0])
    undo = [keep_prefix_caching()] if shared else []
    step_keys: list[int] = []
    if shared and backend == "ours":
        undo.append(record_step_keys(step_keys))
    lines = StartupLines()
    undo.append(lines.remove)
    ranks = len(kernels.split("|")) if kernels else 1
    if ranks > 1:  # the workers install their rank's set (tests/fake_amx/sitecustomize.py)
        records = tempfile.TemporaryDirectory(prefix="aiter-mla-measured-")  # every start measures in children
        undo.append(records.cleanup)
        undo.append(set_environ(ROCM_VLLM_TEST_KERNELS=kernels, AITER_MLA_MEASURE_TIMEOUT_S=TP_MEASURE_TIMEOUT_S,
                                AITER_MLA_MEASURED_DIR=records.name,
                                VLLM_CPU_OMP_THREADS_BIND="|".join(map(str, range(ranks)))))
    elif kernels:
        import engine_kernels

        undo.append(engine_kernels.install(kernels))
    llm = None
    try:
        t0 = time.monotonic()
        try:
            llm = make_engine(model, dtype, shared, ranks)
        except Exception as exc:  # noqa: BLE001  (a refused start is the run's result)
            if not kernels:
                raise
            refused = {"refused": f"{type(exc).__name__}: {exc}", "engine_start_s": time.monotonic() - t0,
                       "startup_lines": lines.lines}
            return {run["name"]: refused for run in runs}
        start_s = time.monotonic() - t0
        cache = llm.llm_engine.vllm_config.cache_config
        common = {"engine_start_s": start_s, "kv_cache_slots": (cache.num_gpu_blocks or 0) * 16,
                  "prefix_caching": cache.enable_prefix_caching,
                  "attention_impls": sorted({c for w in llm.collective_rpc(attention_impls) for c in w}),
                  "platform_choices": platform_choices(dtype), "aiter_version": installed_aiter(),
                  "startup_lines": list(lines.lines)}
        if ranks > 1:
            import engine_kernels

            common["ranks"] = sorted(llm.collective_rpc(engine_kernels.rank_report), key=lambda r: r["rank"])
        found = {}
        for run in runs:
            calls_before = decode_calls(backend)
            remedy_before = remedy_calls()
            remove_fault = install_fault() if run["fault"] != "none" else None
            try:
                t1 = time.monotonic()
                results = serve_schedule(llm.llm_engine, run["schedule"])
            finally:
                if remove_fault:
                    remove_fault()
            calls = decode_calls(backend)
            found[run["name"]] = {**common, "results": results, "serve_s": time.monotonic() - t1,
                                  "decode_calls": None if calls is None else calls - calls_before,
                                  "remedy_calls": remedy_calls() - remedy_before,
                                  "max_step_keys": max(step_keys, default=0)}
            if ranks > 1:
                import engine_kernels

                found[run["name"]]["ranks_served"] = sorted(llm.collective_rpc(engine_kernels.rank_report),
                                                            key=lambda r: r["rank"])
        return found
    finally:
        for step in reversed(undo):
            step()
        llm = None
        gc.collect()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["ours", "cpu_mla"], required=True)
    ap.add_argument("--plan", required=True, help="JSON list of runs: name, model, dtype, schedule "
                    f"({'|'.join(SCHEDULES)}), fault ({'|'.join(FAULTS)}); waves: the second half arrives "
                    "while the first decodes; sequential: the first prompts, one request at a time (what a client "
                    "sending one request after another sees); shared-prefix: requests on one cached prefix, prefix "
                    "caching on, a small KV cache; brief: two requests together, a few tokens each")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # this folder's modules where a tensor-parallel engine's workers and measurement children import them
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.backend == "ours":
        os.environ["AITER_MLA_KERNELS"] = "reference"
    else:
        os.environ.pop("AITER_MLA_KERNELS", None)

    engines: dict[tuple, list[dict]] = {}
    for run in read_plan(args.plan):
        engines.setdefault(engine_settings(run), []).append(run)
    found: dict[str, dict] = {}
    for runs in engines.values():  # in the plan's order: the run a test waits for first, first
        found.update(run_engine(args.backend, runs))
        # after each engine, whole (a reader never sees half a file): a test reads its run as soon as it is here
        partial = f"{args.out}.part"
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(found, f)
        os.replace(partial, args.out)


if __name__ == "__main__":
    main()
