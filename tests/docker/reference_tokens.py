"""Greedy tokens of vLLM's own CPU MLA backend for token-id prompts (the integration test's
reference). Runs inside the serve image with AITER_MLA_KERNELS unset, so the backend plugin
leaves CPU_MLA alone:

    python3 reference_tokens.py MODEL_DIR PROMPTS_JSON MAX_TOKENS

Prints one line: {"cpu_mla_path": ..., "attention_impls": [...], "tokens": [[...], ...]}. The engine settings match the
CPU override of compose.yaml (dummy weights, float32, eager, max length 512).
"""
import json
import os
import sys


def attention_impls(worker) -> list[str]:
    """Classes of the attention implementations that ran (called in the worker)."""
    layers = worker.model_runner.vllm_config.compilation_config.static_forward_context.values()
    return sorted({f"{type(layer.impl).__module__}.{type(layer.impl).__qualname__}"
                   for layer in layers if getattr(layer, "impl", None) is not None})


def main() -> None:
    model, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    if os.environ.get("AITER_MLA_KERNELS"):
        sys.exit("reference_tokens: unset AITER_MLA_KERNELS (the reference is vLLM's own CPU_MLA)")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    # CPU_MLA named: on CPUs with AMX tiles vLLM would pick AMX_MLA.
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="float32",
              max_model_len=512, gpu_memory_utilization=0.5, enforce_eager=True, seed=0,
              attention_config={"backend": "CPU_MLA"})
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    impls = sorted({c for worker in llm.collective_rpc(attention_impls) for c in worker})
    print(json.dumps({"cpu_mla_path": AttentionBackendEnum.CPU_MLA.get_path(), "attention_impls": impls,
                      "tokens": [list(o.outputs[0].token_ids) for o in outputs]}), flush=True)


if __name__ == "__main__":
    main()
