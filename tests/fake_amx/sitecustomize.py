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

# Test-only changes to this package's adapter in every process of a server (the processes a test
# cannot reach otherwise: a tensor-parallel engine's workers, a server's engine core), installed once
# vllm_aiter_mla.backend is imported, from modules of backend/tests/engine (on PYTHONPATH):
# * ROCM_VLLM_TEST_FAULT=last-slot-off-by-one: the engine tests' decode fault (engine_driver.install_fault,
#   one slot index off in the decode plan), for tests that must see a wrong decode fail (the accuracy gate);
# * ROCM_VLLM_TEST_KERNELS=SET[|SET...]: stand-ins for AITER's decode and vLLM's Triton decode
#   (engine_kernels.SETS), one set per tensor-parallel rank.
_FAULT = os.environ.get("ROCM_VLLM_TEST_FAULT")
_KERNELS = os.environ.get("ROCM_VLLM_TEST_KERNELS")
if _FAULT and _FAULT != "last-slot-off-by-one":
    raise SystemExit(f"ROCM_VLLM_TEST_FAULT={_FAULT!r}: the one fault is last-slot-off-by-one")
if _FAULT or _KERNELS:
    import importlib.abc
    import importlib.util

    def _install() -> None:
        if _FAULT:
            from engine_driver import install_fault

            install_fault()
            print(f"ROCM_VLLM_TEST_FAULT: {_FAULT} installed in pid {os.getpid()}", file=sys.stderr, flush=True)
        if _KERNELS:
            from engine_kernels import install_by_rank

            install_by_rank(_KERNELS)

    class _AfterImport(importlib.abc.MetaPathFinder):
        TARGET = "vllm_aiter_mla.backend"

        def find_spec(self, name, path, target=None):
            if name != self.TARGET:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                _install()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterImport())
