"""Run the tiny MLA model in vLLM's CPU engine and record greedy tokens + logprobs.

    python engine_driver.py --model DIR --backend ours|cpu_mla --dtype float32 --out result.json
                            [--fault none|last-slot-off-by-one]

``ours``: this package's CPU development mode (AITER_MLA_KERNELS=reference),
``cpu_mla``: vLLM's own CPU MLA backend. The engine core runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so the decode-call counter and the fault
injection act on the engine that serves the requests. Requests arrive in two waves:
the second while the first is decoding.

Both sides name their attention backend explicitly (``CPU_MLA``): vLLM's CPU platform
would pick ``AMX_MLA`` on CPUs with AMX tiles, and in CPU development mode the plugin
points the ``CPU_MLA`` entry at this package. The result records the attention
implementation classes that really ran and what vLLM's CPU platform would have picked
with no backend named (``auto_choice``), so a test sees the selection it relies on.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

PROMPT_LENGTHS = [1, 7, 200, 33, 64, 2, 150, 90, 11, 128]
FIRST_WAVE = 5
STEPS_BEFORE_SECOND_WAVE = 6


def prompts(vocab: int = 1024, seed: int = 1234) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]


def install_fault() -> None:
    """Replace the newest key of every request with the slot before it (in the plan the
    metadata builder gets from planning)."""
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


# shared-prefix schedule: requests on one cached prompt prefix of SHARED_PREFIX_BLOCKS full
# blocks (block size 16) plus one token of their own, in a KV cache of SHARED_CACHE_BLOCKS
# blocks: their decode steps reference far more keys than the cache has slots.
SHARED_PREFIX_BLOCKS = 20
SHARED_CACHE_BLOCKS = 80
SHARED_REQUESTS = 16
MAX_NUM_SEQS = 16


def keep_prefix_caching() -> None:
    """vLLM's CPU platform turns prefix caching off for MLA models (its CPU MLA prefill has no
    cached-context path). The shared-prefix schedule only ever prefills without context (the
    first request) and decodes the rest, so prefix caching is turned back on after the
    platform's check, in this process (the engine core runs in it)."""
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__

    def check_and_keep(cls, vllm_config):
        check(cls, vllm_config)
        vllm_config.cache_config.enable_prefix_caching = True

    CpuPlatform.check_and_update_config = classmethod(check_and_keep)


STEP_KEYS: list[int] = []


def record_step_keys() -> None:
    """Σ max(seq_len, qlen) of every decode step this backend plans (what kv_indices holds)."""
    import vllm_aiter_mla.backend as backend

    real = backend.plan_decode_step

    def recorded(buffers, block_table, seq_lens, qlen, *args, **kwargs):
        STEP_KEYS.append(int(seq_lens.clamp(min=qlen).sum()))
        return real(buffers, block_table, seq_lens, qlen, *args, **kwargs)

    backend.plan_decode_step = recorded


def attention_impls(worker) -> list[str]:
    """Classes of the attention implementations of a worker's model (run in the worker)."""
    layers = worker.model_runner.vllm_config.compilation_config.static_forward_context.values()
    return sorted({f"{type(layer.impl).__module__}.{type(layer.impl).__qualname__}"
                   for layer in layers if getattr(layer, "impl", None) is not None})


def platform_auto_choice(dtype: str) -> str:
    """The MLA backend vLLM's CPU platform picks when none is named (AMX_MLA on AMX CPUs)."""
    import torch
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    config = AttentionSelectorConfig(head_size=576, dtype=getattr(torch, dtype), kv_cache_dtype="auto",
                                     block_size=16, use_mla=True)
    return CpuPlatform.get_attn_backend_cls(None, config)


def installed_aiter() -> str | None:
    """The version of the AITER distribution this process sees installed (None: none)."""
    from importlib import metadata

    for name in ("amd-aiter", "aiter"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", choices=["ours", "cpu_mla"], required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--fault", choices=["none", "last-slot-off-by-one"], default="none")
    ap.add_argument("--load-format", default="safetensors")
    ap.add_argument("--schedule", choices=["waves", "sequential", "shared-prefix"], default="waves",
                    help="waves: the second half arrives while the first decodes; "
                    "sequential: one request at a time (what a client sending one request after another sees); "
                    "shared-prefix: requests on one cached prefix, prefix caching on, a small KV cache")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.backend == "ours":
        os.environ["AITER_MLA_KERNELS"] = "reference"
    else:
        os.environ.pop("AITER_MLA_KERNELS", None)

    from vllm import LLM, SamplingParams

    if args.fault != "none":
        install_fault()
    shared = args.schedule == "shared-prefix"
    extra = {}
    if shared:
        keep_prefix_caching()
        extra = {"enable_prefix_caching": True, "num_gpu_blocks_override": SHARED_CACHE_BLOCKS, "block_size": 16}
        if args.backend == "ours":
            record_step_keys()

    t0 = time.monotonic()
    llm = LLM(
        model=args.model,
        load_format=args.load_format,
        skip_tokenizer_init=True,
        dtype=args.dtype,
        max_model_len=512,
        max_num_seqs=MAX_NUM_SEQS,
        gpu_memory_utilization=0.5,
        seed=0,
        enforce_eager=True,
        attention_config={"backend": "CPU_MLA"},
        **extra,
    )
    start_s = time.monotonic() - t0
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=0, ignore_eos=True, detokenize=False)
    all_prompts = prompts()
    results: dict[str, dict] = {}

    def collect(outputs) -> None:
        for out in outputs:
            if out.finished:
                comp = out.outputs[0]
                results[out.request_id] = {
                    "token_ids": list(comp.token_ids),
                    "logprobs": [lp[tok].logprob for lp, tok in zip(comp.logprobs, comp.token_ids)],
                }

    if shared:
        rng = random.Random(99)
        prefix = [rng.randrange(2, 1024) for _ in range(SHARED_PREFIX_BLOCKS * 16)]
        engine.add_request("0", {"prompt_token_ids": prefix + [5]}, params)
        collect(engine.step())  # its prefill: the prefix's blocks are cached from here on
        for i in range(1, SHARED_REQUESTS):
            engine.add_request(str(i), {"prompt_token_ids": prefix + [6 + i]}, params)
        while engine.has_unfinished_requests():
            collect(engine.step())
    elif args.schedule == "sequential":
        for i, prompt in enumerate(all_prompts):
            engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
            while engine.has_unfinished_requests():
                collect(engine.step())
    else:
        for i in range(FIRST_WAVE):
            engine.add_request(str(i), {"prompt_token_ids": all_prompts[i]}, params)
        for _ in range(STEPS_BEFORE_SECOND_WAVE):
            collect(engine.step())
        for i in range(FIRST_WAVE, len(all_prompts)):
            engine.add_request(str(i), {"prompt_token_ids": all_prompts[i]}, params)
        while engine.has_unfinished_requests():
            collect(engine.step())

    decode_calls = None
    if args.backend == "ours":
        from vllm_aiter_mla import cpu_dev

        decode_calls = cpu_dev._decode_calls
    with open(args.out, "w", encoding="utf-8") as f:
        cache = llm.llm_engine.vllm_config.cache_config
        json.dump({"results": results, "decode_calls": decode_calls, "engine_start_s": start_s,
                   "max_step_keys": max(STEP_KEYS, default=0), "kv_cache_slots": (cache.num_gpu_blocks or 0) * 16,
                   "prefix_caching": cache.enable_prefix_caching,
                   "attention_impls": sorted({c for w in llm.collective_rpc(attention_impls) for c in w}),
                   "auto_choice": platform_auto_choice(args.dtype), "aiter_version": installed_aiter()}, f)


if __name__ == "__main__":
    main()
