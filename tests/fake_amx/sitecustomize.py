"""Make vLLM's CPU platform believe this CPU has AMX tiles (tests only).

vLLM 0.32's CPU platform prefers AMX_MLA for MLA models when
`torch.cpu._is_amx_tile_supported()` is true, unless CPU_MLA is requested explicitly.
CI machines differ in CPU, so every engine the tests start runs with this hook on
PYTHONPATH: the platform's decisions (attention backend, block size, chunked prefill)
are those of an AMX machine everywhere, while kernels keep using the real CPU's
instruction set (only calls made from vllm/platforms/cpu.py see the fake answer).
Python imports `sitecustomize` at start-up, so spawned engine processes get it too.

Active when ROCM_VLLM_FAKE_AMX=1. torch is patched as vllm/platforms/cpu.py is loaded (it imports
torch itself), not at start-up: the many processes of a server's environment that never load vLLM's
platform (the entrypoint guard, health probes, the self-test and bench command lines, their pytest)
do not pay for importing torch (about 1.4 s of CPU each).
"""
import importlib.abc
import importlib.util
import os
import sys


def _on_import(target: str, before=None, after=None) -> None:
    """Run ``before()`` as module ``target`` starts to execute and ``after()`` once it has, in this
    process, the first time it is imported."""

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target_=None):
            if name != target:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None:  # not installed here: the import fails as it would without the hook
                return None
            real_exec = spec.loader.exec_module

            def exec_module(module):
                if before:
                    before()
                real_exec(module)
                if after:
                    after()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())


def _fake_amx() -> None:
    import torch

    real_is_amx = torch.cpu._is_amx_tile_supported
    platform_file = os.path.join("vllm", "platforms", "cpu.py")

    def _is_amx_tile_supported() -> bool:
        caller = sys._getframe(1).f_code.co_filename
        return True if caller.endswith(platform_file) else real_is_amx()

    torch.cpu._is_amx_tile_supported = _is_amx_tile_supported


if os.environ.get("ROCM_VLLM_FAKE_AMX") == "1":
    _on_import("vllm.platforms.cpu", before=_fake_amx)

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


def _install() -> None:
    if _FAULT:
        from engine_driver import install_fault

        install_fault()
        print(f"ROCM_VLLM_TEST_FAULT: {_FAULT} installed in pid {os.getpid()}", file=sys.stderr, flush=True)
    if _KERNELS:
        from engine_kernels import install_by_rank

        install_by_rank(_KERNELS)


if _FAULT or _KERNELS:
    _on_import("vllm_aiter_mla.backend", after=_install)
