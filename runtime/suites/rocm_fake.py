"""vLLM's real ROCm platform code, running on a machine without an AMD GPU.

``vllm.platforms.rocm`` reads the GPU arch at import time through
``torch.cuda.get_device_properties``; we answer with the arch under test, re-import
the module, and make its ``RocmPlatform`` vLLM's current platform. Everything else
(selection order, validation, AITER switches) is vLLM's own code.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from collections.abc import Iterator
from unittest import mock

# (major, minor) compute capability vLLM derives from each arch.
ARCH_CAPABILITY = {"gfx90a": (9, 0), "gfx942": (9, 4), "gfx950": (9, 5)}
AITER_SWITCHES = ("VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MLA")


def _device_properties(arch: str) -> types.SimpleNamespace:
    major, minor = ARCH_CAPABILITY[arch]
    return types.SimpleNamespace(gcnArchName=f"{arch}:sramecc+:xnack-", name=f"fake {arch}", total_memory=192 << 30,
                                 multi_processor_count=304, major=major, minor=minor)


def _stand_in_for_cpu_kernels() -> None:
    """Where vLLM runs on its CPU platform (no AMD GPU), the library holding its kernels depends
    on the CPU: `_C` (AVX-512 with bf16), `_C_AVX512` or `_C_AVX2`. The ROCm platform module (and
    `vllm._aiter_ops`, lazily) imports `vllm._C` unconditionally: on a CPU without AVX-512 that
    library dies of an illegal instruction, and after another one it registers the same
    operators twice. Selection needs no kernels: for the rest of this process an empty module
    stands in for `vllm._C` when it is not loaded yet (CPU platform only)."""
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        sys.modules.setdefault("vllm._C", types.ModuleType("vllm._C"))


@contextlib.contextmanager
def rocm_platform(arch: str, env: dict[str, str], aiter_found: bool) -> Iterator[object]:
    """vLLM with a RocmPlatform for ``arch`` as current platform, the AITER switches
    of ``env`` (others unset) and AITER reported importable or not."""
    import torch

    _stand_in_for_cpu_kernels()
    with mock.patch.object(torch.cuda, "get_device_properties", return_value=_device_properties(arch)):
        if "vllm.platforms.rocm" in sys.modules:
            rocm = importlib.reload(sys.modules["vllm.platforms.rocm"])
        else:
            rocm = importlib.import_module("vllm.platforms.rocm")
    import vllm._aiter_ops as aiter_ops
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability

    platform = rocm.RocmPlatform()
    capability = DeviceCapability(*ARCH_CAPABILITY[arch])
    clean_env = {**{k: v for k, v in os.environ.items() if k not in AITER_SWITCHES}, **env}
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, clean_env, clear=True))
        stack.enter_context(mock.patch.object(rocm.RocmPlatform, "get_device_capability",
                                              classmethod(lambda cls, device_id=0: capability)))
        stack.enter_context(mock.patch.object(platforms, "_current_platform", platform))
        stack.enter_context(mock.patch.object(aiter_ops, "current_platform", platform))
        # VllmConfig's checks run the current platform's check_and_update_config, through the name
        # its module bound at import (vLLM 0.34's CPU platform refuses an x86 host without Triton).
        config_module = importlib.import_module("vllm.config.vllm")
        if hasattr(config_module, "current_platform"):
            stack.enter_context(mock.patch.object(config_module, "current_platform", platform))
        stack.enter_context(mock.patch.object(aiter_ops, "IS_AITER_FOUND", aiter_found))
        aiter_ops.rocm_aiter_ops.refresh_env_variables()
        _clear_arch_caches()
        try:
            yield platform
        finally:
            stack.close()
            aiter_ops.rocm_aiter_ops.refresh_env_variables()
            _clear_arch_caches()


def _clear_arch_caches() -> None:
    """vLLM's built-in AITER MLA memoises what it reads of the GPU arch (e.g. whether its Gluon
    decode has a build for it): forget it whenever the arch under test changes."""
    builtin = sys.modules.get("vllm.v1.attention.backends.mla.rocm_aiter_mla")
    for name in dir(builtin) if builtin is not None else ():
        cache_clear = getattr(getattr(builtin, name), "cache_clear", None)
        if name.startswith("_") and callable(cache_clear):
            cache_clear()


def select_mla_backend(block_size: int | None, backend: str | None) -> str:
    """Run vLLM's selection for a DeepSeek-style MLA layer; return the class path."""
    import torch
    from vllm.config import AttentionConfig, CacheConfig, VllmConfig, set_current_vllm_config
    from vllm.v1.attention.selector import _cached_get_attn_backend, get_attn_backend

    cache_config = CacheConfig(block_size=block_size) if block_size is not None else CacheConfig()
    attention_config = AttentionConfig(backend=backend) if backend else AttentionConfig()
    config = VllmConfig(cache_config=cache_config, attention_config=attention_config)
    _cached_get_attn_backend.cache_clear()
    try:
        with set_current_vllm_config(config):
            cls = get_attn_backend(576, torch.bfloat16, "auto", use_mla=True)
    finally:
        _cached_get_attn_backend.cache_clear()
    return f"{cls.__module__}.{cls.__qualname__}"


def select_for(selector_fields: dict, backend: str | None = None) -> str:
    """vLLM's current platform's choice for an MLA layer of ``selector_fields`` (any field of
    vLLM's AttentionSelectorConfig: dtype, kv_cache_dtype, head_size, use_dcp, ...): the class
    path, or ``error: ...`` where no backend fits."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    fields = {"head_size": 576, "dtype": torch.bfloat16, "kv_cache_dtype": "auto", "block_size": None,
              "use_mla": True, **selector_fields}
    try:
        with set_current_vllm_config(VllmConfig()):
            return current_platform.get_attn_backend_cls(
                AttentionBackendEnum[backend] if backend else None, AttentionSelectorConfig(**fields))
    except ValueError as exc:
        return f"error: {exc}"
