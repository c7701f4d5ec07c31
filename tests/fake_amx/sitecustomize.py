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

# The engine tests' decode fault (backend/tests/engine/engine_driver.py: install_fault, one slot
# index off in the decode plan) in every process of a server, for tests that must see a wrong
# decode fail (the accuracy gate). Active when ROCM_VLLM_TEST_FAULT=last-slot-off-by-one and
# backend/tests/engine is on PYTHONPATH; installed once vllm_aiter_mla.backend is imported.
_FAULT = os.environ.get("ROCM_VLLM_TEST_FAULT")
if _FAULT:
    import importlib.abc
    import importlib.util

    if _FAULT != "last-slot-off-by-one":
        raise SystemExit(f"ROCM_VLLM_TEST_FAULT={_FAULT!r}: the one fault is last-slot-off-by-one")

    class _FaultAfterImport(importlib.abc.MetaPathFinder):
        TARGET = "vllm_aiter_mla.backend"

        def find_spec(self, name, path, target=None):
            if name != self.TARGET:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                from engine_driver import install_fault

                install_fault()
                print(f"ROCM_VLLM_TEST_FAULT: {_FAULT} installed in pid {os.getpid()}", file=sys.stderr, flush=True)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _FaultAfterImport())
