"""vLLM's extensible KV cache kept off where the plugin measures decode calls on the real KV cache.

Releases with an extensible KV cache (``cache_config.enable_extensible_kv_cache``, the CLI flag
``--enable-extensible-kv-cache``; vLLM 0.34 turns it on by default on CUDA and ROCm) reserve the
cache as address space and map its blocks only after CUDA-graph capture. The own path measures its
decode calls in the highest rows of each layer's real cache before capture, which are not mapped
then. So where the user left the flag unset and the release turned it on, for an MLA model on ROCm,
the plugin turns it off while vLLM settles its config (``VllmConfig._resolve_extensible_kv_cache``),
before any process sizes or allocates the cache, in one start-up line naming the flag that keeps
it. Where the user asked for it, it stays on, and the adapters warn that the real cache went
unmeasured. The resolver is looked up with ``getattr``: releases without one are left alone.
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger("vllm.aiter_mla")

FLAG = "enable_extensible_kv_cache"
RESOLVER = "_resolve_extensible_kv_cache"
BACKEND_NAME = "ROCM_AITER_MLA"


def turned_off(requested: bool | None, enabled: bool, on_rocm: bool, mla: bool, other_backend: bool,
               connector: bool) -> bool:
    """Whether the plugin turns the extensible KV cache off: the user left the flag unset (``requested``
    None) and the release turned it on, for an MLA model on ROCm whose attention backend is not set to
    another one, with no KV connector (some need the extensible cache)."""
    return requested is None and enabled and on_rocm and mla and not other_backend and not connector


def _facts(vllm_config) -> tuple[bool, bool, bool, bool]:
    """(on ROCm, an MLA model, another --attention-backend set, a KV connector set), read from the config."""
    from vllm.platforms import current_platform  # noqa: PLC0415

    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    chosen = getattr(backend, "name", backend)
    model_config = getattr(vllm_config, "model_config", None)  # None in a config built without a model
    return (bool(current_platform.is_rocm()), bool(getattr(model_config, "use_mla", False)),
            chosen is not None and str(chosen) != BACKEND_NAME,
            getattr(vllm_config, "kv_transfer_config", None) is not None)


def keep_cache_mapped(config_cls: type) -> bool:
    """Wrap the release's resolver of the flag on ``config_cls`` (vLLM's ``VllmConfig``), once per class;
    False where the release has no such resolver or it is wrapped already."""
    resolve = getattr(config_cls, RESOLVER, None)
    if not callable(resolve) or getattr(resolve, "keeps_cache_mapped", False):
        return False

    @functools.wraps(resolve)
    def resolved(self) -> None:
        cache_config = self.cache_config
        requested = getattr(cache_config, FLAG, None)  # None until settled: the user left it unset
        resolve(self)
        enabled = bool(getattr(cache_config, FLAG, False))
        if requested is None and enabled and turned_off(requested, enabled, *_facts(self)):
            setattr(cache_config, FLAG, False)
            logger.info("%s (vllm-aiter-mla): the extensible KV cache is off: it maps the cache's blocks only "
                        "after CUDA-graph capture, and each decode call is measured in the highest rows of its "
                        "layer's real KV cache before then; pass --enable-extensible-kv-cache to keep it (the "
                        "real cache then goes unmeasured)", BACKEND_NAME)

    resolved.keeps_cache_mapped = True
    setattr(config_cls, RESOLVER, resolved)
    return True


def install() -> bool:
    """``keep_cache_mapped`` on the running vLLM's ``VllmConfig``."""
    from vllm.config import VllmConfig  # noqa: PLC0415

    return keep_cache_mapped(VllmConfig)
