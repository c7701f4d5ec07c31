"""CPU development mode: this backend's decode path inside vLLM's CPU engine.

Selected explicitly with ``AITER_MLA_KERNELS=reference`` on vLLM's CPU platform
(the plugin then points vLLM's ``CPU_MLA`` entry here). The metadata builder is the
ROCm backend's own (same decode planning on persistent buffers), the decode call is
the same ``mla_decode`` with the reference kernel standing in for AITER. KV-cache
writes and prefill stay vLLM's CPU ones.

``AITER_MLA_STATS`` (a file path) makes every process that decodes append
``PID decode_calls=N`` lines (at 1, 2, 4, 8, ... calls and at exit; the largest N per PID
is the count), so tests can prove the backend really ran in the engine process, even
when that process is stopped by a signal.
"""

from __future__ import annotations

import atexit
import os

from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionLayer
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend, CPUMLAImpl

from .backend import AiterMLAMetadata, AiterMLAMetadataBuilder, DecodeKernelsMixin

logger = init_logger("vllm.aiter_mla")

STATS_ENV = "AITER_MLA_STATS"
_decode_calls = 0


def _write_stats() -> None:
    path = os.environ.get(STATS_ENV)
    if path and _decode_calls:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} decode_calls={_decode_calls}\n")


atexit.register(_write_stats)


class CPUDevMLAImpl(DecodeKernelsMixin, CPUMLAImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, alibi_slopes, sliding_window,
                 kv_cache_dtype: str, logits_soft_cap, attn_type: str, kv_sharing_target_layer_name,
                 **mla_args) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                         logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args)
        self._init_decode(num_heads, kv_cache_dtype)
        logger.info_once("vllm-aiter-mla CPU development mode: %s kernels in place of CPU_MLA decode",
                         self._kernels.name)

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata: AiterMLAMetadata, layer: AttentionLayer):
        global _decode_calls
        _decode_calls += 1
        if _decode_calls & (_decode_calls - 1) == 0:
            _write_stats()
        return super().forward_mqa(q, kv_c_and_k_pe_cache, attn_metadata, layer)


class CPUDevMLABackend(CPUMLABackend):
    @staticmethod
    def get_impl_cls() -> type[CPUDevMLAImpl]:
        return CPUDevMLAImpl

    @staticmethod
    def get_builder_cls() -> type[AiterMLAMetadataBuilder]:
        return AiterMLAMetadataBuilder
