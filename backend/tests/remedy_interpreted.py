"""vLLM's Triton MLA decode (``triton_decode_attention.py`` of an installed or unpacked vLLM), called as
``remedy.triton_mla_decode`` calls it, run in Triton's interpreter on the CPU and compared with a dense
computation; used by test_remedy_interpreted.py, in a process of its own (TRITON_INTERPRET must be set
before Triton is imported). The file is loaded alone, its two vLLM imports (``current_platform.is_rocm``,
``vllm.triton_utils``) answered by a shim, so vLLM itself is not imported.

    TRITON_INTERPRET=1 python remedy_interpreted.py FILE [FILE...]

float32 (Triton 3.9's interpreter reads bf16 and fp8 tensors wrong: the GPU test covers those). Prints
one line per file and query length; status 1 at the first deviation over 1e-4.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import torch

from vllm_aiter_mla.planning import DecodePlan
from vllm_aiter_mla.remedy import TritonDecode, triton_mla_decode

HEADS, LATENT, V = 16, 576, 512


def load(path: str) -> types.ModuleType:
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

    vllm = types.ModuleType("vllm")
    vllm.__path__ = []
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_rocm=lambda: False)
    utils = types.ModuleType("vllm.triton_utils")
    utils.triton, utils.tl = triton, tl
    sys.modules.update({"vllm": vllm, "vllm.platforms": platforms, "vllm.triton_utils": utils})
    spec = importlib.util.spec_from_file_location(f"triton_decode_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("vllm", "vllm.platforms", "vllm.triton_utils"):
        del sys.modules[name]
    return module


def case(qlen: int, lens=(5, 40, 17), seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rows = sum(lens) + 23
    cache = torch.randn(rows, 1, LATENT, generator=gen)
    slots = torch.randperm(rows, generator=gen)[:sum(lens)].to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    plan = DecodePlan(torch.arange(len(lens) + 1, dtype=torch.int32) * qlen, indptr, slots,
                      torch.ones(len(lens), dtype=torch.int32))
    q = torch.randn(len(lens) * qlen, HEADS, LATENT, generator=gen)
    want = torch.empty(len(lens) * qlen, HEADS, V)
    for r, n in enumerate(lens):
        keys = cache.view(-1, LATENT)[slots[indptr[r]:indptr[r + 1]].long()]
        for t in range(qlen):
            seen = keys[:n - qlen + 1 + t]
            want[r * qlen + t] = (q[r * qlen + t] @ seen.T * 0.1).softmax(-1) @ seen[:, :V]
    return q, cache, plan, want


def main(paths: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("set TRITON_INTERPRET=1: this runs the kernels in Triton's interpreter", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for path in paths:
        ops = load(path)
        kernels = TritonDecode("vLLM's Triton MLA decode", ops.decode_attention_fwd,
                               getattr(ops, "decode_attention_fwd_verify", None), kv_splits=2)
        for qlen in (1, 3):
            q, cache, plan, want = case(qlen)
            out = triton_mla_decode(q, cache, plan, kernels=kernels, kv_lora_rank=V, scale=0.1, max_seqlen_q=qlen,
                                    decode_heads=HEADS, out_dtype=torch.float32)
            worst = float((out - want).abs().max() / want.abs().max())
            print(f"{'ok' if worst < 1e-4 else 'DIFFERENT'}: {kernels.function(qlen)} at query length {qlen}: "
                  f"{worst:.2e} off the dense result ({Path(path).parents[4].name})",
                  flush=True)
            if worst >= 1e-4:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
