"""vLLM 0.32 adapters: the ROCM_AITER_MLA backend, its metadata, builder and impl.

Thin classes over vLLM's MLA common classes. The work is done by plain functions:
``planning.plan_decode_step`` (block table -> AITER's index tensors, on persistent
buffers) and ``decode.mla_decode`` (the kernel call). Prefill uses vLLM's MLA
prefill-backend mechanism, which on ROCm with AITER enabled routes to
``aiter.flash_attn_varlen_func`` (ROCM_AITER_FA); the chosen path is logged.
"""

from __future__ import annotations

import time

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.config import get_current_vllm_config
from vllm.logger import init_logger
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
    QueryLenSupport,
)
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionLayer,
    AttentionType,
    MultipleOf,
    max_decode_query_len,
)

from . import __version__, contract
from .config import (
    SUPPORTED_KV_CACHE_DTYPES,
    SUPPORTED_LATENT_SIZES,
    DecodeShape,
    check_kv_cache_dtype,
    check_unsupported_features,
    compile_threads_setting,
    decode_head_count,
    decode_mode,
    kernel_family,
)
from .decode import mla_decode
from .kernels import MLAKernels, load_kernels
from .persistent import PersistentWork, plan_work, reserve_work, take_work
from .planning import DecodePlan, DecodePlanBuffers, decode_query_len, plan_decode_step

logger = init_logger("vllm.aiter_mla")

BACKEND_NAME = "ROCM_AITER_MLA"
# vLLM's MLA prefill backend that calls aiter.flash_attn_varlen_func.
AITER_PREFILL_BACKEND = "ROCM_AITER_FA"


@dataclass
class AiterMLADecodeMetadata(MLACommonDecodeMetadata):
    plan: DecodePlan | None = None
    max_query_len: int = 1  # the decode rows' own (uniform) query length = max_seqlen_q
    work: PersistentWork | None = None  # persistent mode's get_mla_metadata_v1 buffers
    attn_out_dtype: torch.dtype = torch.bfloat16


@dataclass
class AiterMLAMetadata(MLACommonMetadata[AiterMLADecodeMetadata]):
    pass


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _is_fp8_cache(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype.startswith("fp8")


def _gpu_archs() -> tuple[str, ...]:
    """The ROCm GPU's arch (e.g. gfx942); every supported arch where there is none (CPU
    development mode checks the rules of all of them)."""
    if not _on_rocm():
        return contract.ARCHS
    return (torch.cuda.get_device_properties(0).gcnArchName.split(":")[0],)


def decode_shape(vllm_config, kv_cache_dtype: str) -> DecodeShape:
    dtype = contract.FP8 if _is_fp8_cache(kv_cache_dtype) else contract.BF16
    return DecodeShape(max_qlen=max_decode_query_len(vllm_config), q_dtype=dtype, kv_dtype=dtype,
                       mode=decode_mode(), archs=_gpu_archs())


def work_dtype(vllm_config, kv_cache_dtype: str) -> torch.dtype:
    """The q/KV dtype of the persistent-mode work buffers."""
    return _platform_fp8_dtype() if _is_fp8_cache(kv_cache_dtype) else vllm_config.model_config.dtype


def _total_heads(vllm_config) -> int | None:
    model_config = vllm_config.model_config
    return model_config.model_arch_config.total_num_attention_heads if model_config is not None else None


def prefill_backend_name(vllm_config, layer_names: list[str]) -> str:
    layer = vllm_config.compilation_config.static_forward_context[layer_names[0]]
    backend = getattr(layer, "prefill_backend", None)
    return backend.get_name() if backend is not None else "none"


class AiterMLAMetadataBuilder(MLACommonMetadataBuilder[AiterMLAMetadata]):
    """Plans every decode step into persistent buffers (fixed addresses, so a
    captured decode graph reads each step's plan), and in persistent mode fills AITER's
    work buffers for it."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    # Speculative / MTP decode with uniform query lengths (2-4) runs as decode.
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.UNIFORM

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device, AiterMLAMetadata)
        if self.dcp_world_size > 1:
            raise ValueError(
                f"{BACKEND_NAME} (vllm-aiter-mla) does not support decode context parallelism; "
                "remove --decode-context-parallel-size."
            )
        kv_cache_dtype = vllm_config.cache_config.cache_dtype
        shape = decode_shape(vllm_config, kv_cache_dtype)
        self._decode_heads = decode_head_count(self.num_heads, _total_heads(vllm_config), shape)
        self._kernels = load_kernels()
        self._work: PersistentWork | None = None
        if shape.mode == contract.PERSISTENT:
            dtype = work_dtype(vllm_config, kv_cache_dtype)
            self._work = take_work(self._kernels, vllm_config.scheduler_config.max_num_seqs, shape.max_qlen,
                                   self._decode_heads, dtype, dtype, device)
        max_reqs = vllm_config.scheduler_config.max_num_seqs
        num_gpu_blocks = vllm_config.cache_config.num_gpu_blocks
        self._plan_buffers = DecodePlanBuffers.allocate(
            max_reqs=max_reqs,
            max_blocks=_cdiv(vllm_config.model_config.max_model_len, self.page_size),
            block_size=self.page_size,
            device=device,
            # A step references at most every slot of the KV cache, plus padding rows.
            max_keys=None if not num_gpu_blocks else num_gpu_blocks * self.page_size + max_reqs * shape.max_qlen,
        )
        # GPUs plan with one fused Triton kernel; the CPU development mode with PyTorch.
        self._plan_triton = None
        threads_setting = compile_threads_setting()  # checked everywhere, used where Triton plans
        if torch.device(device).type == "cuda":
            from .planning_triton import compile_in_threads, compile_threads, plan_decode_triton, warm_up  # noqa: PLC0415

            self._plan_triton = plan_decode_triton
            # Triton compiles a kernel at its first launch: every launch shape the planner can
            # pick is compiled here, before the first request (cached by Triton afterwards).
            started = time.monotonic()
            threads = compile_threads(threads_setting)
            shapes = warm_up(self._plan_buffers, vllm_config.model_config.max_model_len + shape.max_qlen, threads)
            logger.info_once("%s: decode planner compiled for its %d launch shapes in %.1f s, %d at a time%s",
                             BACKEND_NAME, shapes, time.monotonic() - started, threads,
                             "" if compile_in_threads() else " (this Triton has no triton.runtime._async_compile)")
        prefill = prefill_backend_name(vllm_config, layer_names)
        logger.info_once(
            "%s (vllm-aiter-mla %s): decode=%s mla_decode_fwd %s, %d heads per GPU run as %d, query length "
            "<= %d (KV as pages of 1 slot, block size %d), kernels: %s, prefill=%s",
            BACKEND_NAME,
            __version__,
            self._kernels.name,
            shape.mode,
            self.num_heads,
            self._decode_heads,
            shape.max_qlen,
            self.page_size,
            kernel_family(self._decode_heads, shape),
            prefill,
        )
        if _on_rocm() and prefill != AITER_PREFILL_BACKEND:
            logger.warning_once(
                "%s: MLA prefill runs on %s, not AITER's flash_attn_varlen_func (%s). Set "
                "VLLM_ROCM_USE_AITER=1 (and leave --attention-config.mla_prefill_backend unset) "
                "to prefill with AITER.",
                BACKEND_NAME,
                prefill,
                AITER_PREFILL_BACKEND,
            )

    def _build_decode(
        self,
        block_table_tensor: torch.Tensor,
        seq_lens_device: torch.Tensor,
        max_seq_len: int,
        query_start_loc_cpu: torch.Tensor,
        query_start_loc_device: torch.Tensor,
        num_decode_tokens: int,
        max_query_len: int,
        dcp_tot_seq_lens_device: torch.Tensor | None,
    ) -> AiterMLADecodeMetadata:
        # max_query_len is min(longest query of the whole batch, reorder threshold): prefill
        # rows count too. AITER needs the decode rows' own uniform length.
        qlen = decode_query_len(query_start_loc_cpu, num_decode_tokens)
        if self._plan_triton is not None:
            plan = self._plan_triton(self._plan_buffers, block_table_tensor, seq_lens_device, qlen, max_seq_len)
        else:
            plan = plan_decode_step(self._plan_buffers, block_table_tensor, seq_lens_device, qlen, max_seq_len).plan
        if self._work is not None:
            plan_work(self._kernels, self._work, plan, qlen)
        return AiterMLADecodeMetadata(
            block_table=block_table_tensor,
            seq_lens=seq_lens_device,
            dcp_tot_seq_lens=dcp_tot_seq_lens_device,
            plan=plan,
            max_query_len=qlen,
            work=self._work,
            attn_out_dtype=self.model_config.dtype,
        )


class AiterMLABackend(MLACommonBackend):
    # No float16: AITER's MLA decode rejects fp16 queries (vLLM then picks another backend).
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = list(SUPPORTED_KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_LATENT_SIZES)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        # The KV cache is read as pages of one slot: every block size works.
        return [MultipleOf(1)]

    @staticmethod
    def get_impl_cls() -> type["AiterMLAImpl"]:
        return AiterMLAImpl

    @staticmethod
    def get_builder_cls() -> type["AiterMLAMetadataBuilder"]:
        return AiterMLAMetadataBuilder


def _fp8_view(kv_cache: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    return kv_cache.view(fp8_dtype) if kv_cache.dtype == torch.uint8 else kv_cache


def _is_fp8(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point and t.element_size() == 1


class DecodeKernelsMixin:
    """Decode entry shared by the ROCm impl and the CPU development impl."""

    _kernels: MLAKernels
    _decode_heads: int
    kv_lora_rank: int
    scale: float

    def _init_decode(self, num_heads: int, kv_cache_dtype: str) -> None:
        check_kv_cache_dtype(kv_cache_dtype)
        vllm_config = get_current_vllm_config()
        self._decode_heads = decode_head_count(num_heads, _total_heads(vllm_config),
                                               decode_shape(vllm_config, kv_cache_dtype))
        self._kernels = load_kernels()
        self._vllm_config = vllm_config
        self._decode_kv_cache_dtype = kv_cache_dtype

    def reserve_workspace(self) -> None:
        """Called by vLLM (0.33 and later) in its memory-profiling run, before the KV cache is
        sized: the persistent-mode work buffers are allocated here, so that memory is counted; the
        metadata builder takes them over. Non-persistent mode needs none."""
        vllm_config = self._vllm_config
        shape = decode_shape(vllm_config, self._decode_kv_cache_dtype)
        if shape.mode != contract.PERSISTENT:
            return
        dtype = work_dtype(vllm_config, self._decode_kv_cache_dtype)
        reserve_work(self._kernels, vllm_config.scheduler_config.max_num_seqs, shape.max_qlen, self._decode_heads,
                     dtype, dtype, vllm_config.device_config.device)

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: AiterMLAMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        decode = attn_metadata.decode
        assert decode is not None and decode.plan is not None
        out = self._decode(q, kv_c_and_k_pe_cache, decode.plan, decode.max_query_len, decode.attn_out_dtype, layer,
                           decode.work)
        return out, None

    def _decode(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        plan: DecodePlan,
        max_query_len: int,
        out_dtype: torch.dtype,
        layer: AttentionLayer,
        work: PersistentWork | None = None,
    ) -> torch.Tensor:
        q_scale = kv_scale = None
        if kv_cache.dtype == torch.uint8 or _is_fp8(kv_cache):
            if isinstance(q, tuple):
                q = torch.cat(q, dim=-1)
            fp8_dtype = q.dtype if _is_fp8(q) else _platform_fp8_dtype()
            kv_cache = _fp8_view(kv_cache, fp8_dtype)
            q_scale, kv_scale = layer._q_scale, layer._k_scale
            if not _is_fp8(q):
                q = (q.float() / q_scale).to(fp8_dtype)
        return mla_decode(
            q,
            kv_cache,
            plan,
            kernels=self._kernels,
            kv_lora_rank=self.kv_lora_rank,
            scale=self.scale,
            max_seqlen_q=max_query_len,
            decode_heads=self._decode_heads,
            out_dtype=out_dtype,
            q_scale=q_scale,
            kv_scale=kv_scale,
            work=work,
        )


def _platform_fp8_dtype() -> torch.dtype:
    from vllm.platforms import current_platform  # noqa: PLC0415

    return current_platform.fp8_dtype()


def _on_rocm() -> bool:
    from vllm.platforms import current_platform  # noqa: PLC0415

    return current_platform.is_rocm()


class AiterMLAImpl(DecodeKernelsMixin, MLACommonImpl[AiterMLAMetadata]):
    can_return_lse_for_decode: bool = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        **mla_args,
    ) -> None:
        check_unsupported_features(alibi_slopes, sliding_window, logits_soft_cap)
        if attn_type != AttentionType.DECODER:
            raise ValueError(f"{BACKEND_NAME} supports decoder self-attention only, got {attn_type}")
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            **mla_args,
        )
        self._init_decode(num_heads, kv_cache_dtype)
