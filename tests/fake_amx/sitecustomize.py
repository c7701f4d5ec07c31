"""Make vLLM's CPU platform believe this CPU has AMX tiles (tests only).

vLLM 0.32's CPU platform prefers AMX_MLA for MLA models when
`torch.cpu._is_amx_tile_supported()` is true, unless CPU_MLA is requested explicitly.
CI machines differ in CPU, so every engine the tests start runs with this hook on
PYTHONPATH: the platform's decisions (attention backend, block size, chunked prefill)
are those of an AMX machine everywhere, while kernels keep using the real CPU's
instruction set (only calls made from vllm/platforms/cpu.py see the fake answer).
Python imports `sitecustomize` at start-up, so spawned engine processes get it too.

Active when ROCM_VLLM_FAKE_AMX=1.
"""
import os
import sys

if os.environ.get("ROCM_VLLM_FAKE_AMX") == "1":
    import torch

    _real_is_amx = torch.cpu._is_amx_tile_supported
    _PLATFORM_FILE = os.path.join("vllm", "platforms", "cpu.py")

    def _is_amx_tile_supported() -> bool:
        caller = sys._getframe(1).f_code.co_filename
        return True if caller.endswith(_PLATFORM_FILE) else _real_is_amx()

    torch.cpu._is_amx_tile_supported = _is_amx_tile_supported
