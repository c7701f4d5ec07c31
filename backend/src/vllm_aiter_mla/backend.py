"""vLLM adapters: the ROCM_AITER_MLA backend, its metadata, builder and impl.

``AiterMLABackend`` (the class the plugin registers for vLLM's ``ROCM_AITER_MLA`` entry) is
vLLM's own built-in backend class as far as vLLM's selection sees it: it subclasses it, so
every configuration the built-in accepts is accepted (dtypes, KV dtypes, head sizes, DCP,
non-causal drafts, ...). Each layer then runs one of two implementations, chosen by
``routing.choose_route`` when vLLM constructs the layer's impl and builder:

* this package's own path (``AiterMLAImpl``, ``AiterMLAMetadataBuilder``): thin classes
  over vLLM's MLA common classes, making the decode calls the built-in makes for the layer (its
  head count, query lengths, dtypes, persistent work buffers), each measured on the GPU at
  start-up (``measure``, kept in ``measure_state``); the work is done by plain functions,
  ``planning.plan_decode_step`` / ``planning_triton`` (block table -> AITER's index tensors,
  on persistent buffers) and ``decode.mla_decode`` (the kernel call). Prefill uses vLLM's
  MLA prefill-backend mechanism (on ROCm with AITER: ``aiter.flash_attn_varlen_func``);
* vLLM's built-in implementation of the running vLLM, for every configuration the own path
  does not implement or does less well (one start-up line names it and why).

What is read of vLLM's built-in (head count, decode calls, predicates) is in ``vllm_builtin``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.config import get_current_vllm_config
from vllm.logger import init_logger
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonDecodeMetadata,
    MLACommonMetadataBuilder,
    QueryLenSupport,
)
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionLayer,
    AttentionType,
)

from . import __version__, measure, measure_state, vllm_builtin
from .config import check_kv_cache_dtype, check_unsupported_features, compile_threads_setting
from .decode import mla_decode
from .kernels import MLAKernels, load_kernels
from .measure_state import (bound_cache, cache_committed_later, collect_ahead, measured_route, probe_device,
                            real_cache_measurement, real_cache_warmup, remedy_splits)
from .persistent import PersistentWork, plan_work, reserve_work, take_work
from .planning import DecodePlan, DecodePlanBuffers, decode_query_len, plan_decode_step
from .remedy import TritonDecode, reserve_slot_table, slot_table, take_slot_table, triton_mla_decode
from .upstream_kernels import load_triton_decode
from .routing import Route, choose_route
from .vllm_builtin import (AITER_PREFILL_BACKEND, BACKEND_NAME, BuiltinBackend, BuiltinImpl, BuiltinMetadata,
                           BuiltinMetadataBuilder, builtin_context_chunk_kv_indices, builtin_fused_context_gather,
                           decode_query_len_limit, layer_calls, layer_facts, own_decode_heads, prefill_backend_name,
                           work_dtype)

logger = init_logger("vllm.aiter_mla")

# How often (decode steps) the builder reads the planners' overflow counter back (one small
# device-to-host copy; no plan can overflow the capacity the builder allocates).
OVERFLOW_CHECK_STEPS = 1024
# The route generation of an impl whose calls' measurement was begun at the model's construction and is
# not collected yet (no measure_state.generation is negative): it takes its route once collected.
ROUTE_PENDING = -1


@dataclass
class AiterMLADecodeMetadata(MLACommonDecodeMetadata):
    plan: DecodePlan | None = None
    max_query_len: int = 1  # the decode rows' own (uniform) query length = max_seqlen_q
    work: PersistentWork | None = None  # persistent mode's get_mla_metadata_v1 buffers
    attn_out_dtype: torch.dtype = torch.bfloat16
    slot_table: torch.Tensor | None = None  # the plan as a per-request table, where vLLM's Triton decode serves


@dataclass
class AiterMLAMetadata(BuiltinMetadata):
    """The built-in's metadata class (its prefill code reads its fields and checks its type), with
    the own decode metadata. Built-in-only fields keep their defaults unless the own builder fills
    them for the built-in's prefill code (``context_chunk_kv_indices``)."""


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


class AiterMLAMetadataBuilder(MLACommonMetadataBuilder[AiterMLAMetadata]):
    """Plans every decode step into persistent buffers (fixed addresses, so a
    captured decode graph reads each step's plan), and in persistent mode fills AITER's
    work buffers for it."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    # Speculative / MTP decode with uniform query lengths (2-4) runs as decode.
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.UNIFORM
    _steps: int = 0  # decode steps planned (the overflow counter is read every OVERFLOW_CHECK_STEPS)
    _triton_qlens: frozenset[int] = frozenset()  # query lengths vLLM's Triton decode serves (measured)
    _route_generation: int | None = None  # the measure_state.generation its route was taken at (None: not measured)

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device, AiterMLAMetadata)
        if self.dcp_world_size > 1:
            raise ValueError(
                f"{BACKEND_NAME} (vllm-aiter-mla) does not support decode context parallelism; "
                "remove --decode-context-parallel-size."
            )
        kv_cache_dtype = vllm_config.cache_config.cache_dtype
        longest = decode_query_len_limit(vllm_config)
        self._decode_heads = own_decode_heads(self.num_heads)
        self._kernels = load_kernels()
        # The own impl's prefill is the built-in's (see AiterMLAImpl): where the built-in's builder
        # flattens chunked-prefill context for its fused gather, this builder does the same, with
        # the built-in's own method, so the built-in prefill code finds what it reads.
        self._fused_context_gather = builtin_fused_context_gather(kv_cache_dtype, self.dcp_world_size)
        self.kernel_block_size = kv_cache_spec.block_size  # read by that method, as in the built-in's builder
        # Persistent mode, as the built-in decodes every layer the own path takes.
        dtype = work_dtype(vllm_config, kv_cache_dtype)
        self._work: PersistentWork | None = take_work(self._kernels, vllm_config.scheduler_config.max_num_seqs,
                                                      longest, self._decode_heads, dtype, dtype, device)
        # kv_indices holds max_num_seqs x max_model_len keys (as vLLM's built-in): requests that
        # share prefix blocks reference the same slots, so a step's keys are not bounded by the KV
        # cache's slot count, only by its request count times the longest request (a padding
        # row's qlen keys included). The planners clamp kv_indptr to the capacity regardless.
        self._plan_buffers = DecodePlanBuffers.allocate(
            max_reqs=vllm_config.scheduler_config.max_num_seqs,
            max_blocks=-(-max(vllm_config.model_config.max_model_len, longest) // self.page_size),
            block_size=self.page_size,
            device=device,
        )
        self._route_args = (vllm_config, kv_cache_dtype, torch.device(device))
        self._slot_table = None
        self._take_route()
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
            shapes = warm_up(self._plan_buffers, vllm_config.model_config.max_model_len + longest, threads)
            logger.info_once("%s: decode planner compiled for its %d launch shapes in %.1f s, %d at a time%s",
                             BACKEND_NAME, shapes, time.monotonic() - started, threads,
                             "" if compile_in_threads() else " (this Triton has no triton.runtime._async_compile)")
        prefill = prefill_backend_name(vllm_config, layer_names)
        logger.info_once(
            "%s (vllm-aiter-mla %s): decode=%s mla_decode_fwd persistent, %d heads per GPU run as %d (the "
            "built-in's head count), query length <= %d (KV as pages of 1 slot, block size %d), each call "
            "measured at start-up; prefill=%s by vLLM's built-in impl (fused context gather: %s)",
            BACKEND_NAME, __version__, self._kernels.name, self.num_heads, self._decode_heads, longest, self.page_size,
            prefill, "on" if self._fused_context_gather else "off")
        if vllm_builtin.on_rocm() and prefill != AITER_PREFILL_BACKEND:
            logger.warning_once(
                "%s: MLA prefill runs on %s, not AITER's flash_attn_varlen_func (%s). Set "
                "VLLM_ROCM_USE_AITER=1 (and leave --attention-config.mla_prefill_backend unset) "
                "to prefill with AITER.", BACKEND_NAME, prefill, AITER_PREFILL_BACKEND)

    def _take_route(self) -> None:
        """Query lengths vLLM's Triton decode serves (measured: AITER wrong there; the latest measurement,
        on the layers' real KV cache once made): their plans are also written as per-request slot tables,
        into one persistent buffer (a captured graph reads it), allocated when first needed."""
        vllm_config, kv_cache_dtype, device = self._route_args
        self._route_generation = measure_state.generation
        route, _ = measured_route(vllm_config, Route(True, (), self._decode_heads), kv_cache_dtype)
        if route.refusal:
            raise ValueError(f"{BACKEND_NAME}: {route.refusal}")
        self._triton_qlens = route.triton_qlens if route.own else frozenset()
        if self._triton_qlens:
            triton = load_triton_decode(remedy_splits(vllm_config, device))
            self._table_rows = {q: triton.rows_per_request(q) for q in self._triton_qlens}
            rows = vllm_config.scheduler_config.max_num_seqs * max(self._table_rows.values())
            width = vllm_config.model_config.max_model_len + decode_query_len_limit(vllm_config)
            table = self._slot_table
            if table is None or table.shape[0] < rows or table.shape[1] != width:
                self._slot_table = take_slot_table(rows, width, device)  # the one reserved in profiling, if any

    def build(self, common_prefix_len: int, common_attn_metadata, fast_build: bool = False) -> AiterMLAMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        prefill = metadata.prefill
        if self._fused_context_gather and prefill is not None and prefill.chunked_context is not None:
            # Once per step, not per layer, as the built-in's builder does.
            metadata.context_chunk_kv_indices = builtin_context_chunk_kv_indices(self, prefill)
        return metadata

    def _build_decode(self, block_table_tensor: torch.Tensor, seq_lens_device: torch.Tensor, max_seq_len: int,
                      query_start_loc_cpu: torch.Tensor, query_start_loc_device: torch.Tensor, num_decode_tokens: int,
                      max_query_len: int, dcp_tot_seq_lens_device: torch.Tensor | None) -> AiterMLADecodeMetadata:
        # max_query_len is min(longest query of the whole batch, reorder threshold): prefill
        # rows count too. AITER needs the decode rows' own uniform length.
        qlen = decode_query_len(query_start_loc_cpu, num_decode_tokens)
        if self._route_generation not in (None, measure_state.generation):  # the real KV cache was measured since
            self._take_route()
        if self._plan_triton is not None:
            plan = self._plan_triton(self._plan_buffers, block_table_tensor, seq_lens_device, qlen, max_seq_len)
        else:
            plan = plan_decode_step(self._plan_buffers, block_table_tensor, seq_lens_device, qlen, max_seq_len).plan
        if self._work is not None and qlen not in self._triton_qlens:
            plan_work(self._kernels, self._work, plan, qlen)
        table = None
        if qlen in self._triton_qlens:
            table = slot_table(plan, num_decode_tokens // qlen, max(max_seq_len, 1), self._table_rows[qlen],
                               out=self._slot_table)
        self._steps += 1
        if self._steps % OVERFLOW_CHECK_STEPS == 0:
            self._plan_buffers.check_overflow()
        return AiterMLADecodeMetadata(block_table=block_table_tensor, seq_lens=seq_lens_device,
                                      dcp_tot_seq_lens=dcp_tot_seq_lens_device, plan=plan, max_query_len=qlen,
                                      work=self._work, attn_out_dtype=self.model_config.dtype, slot_table=table)


def _fp8_view(kv_cache: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    return kv_cache.view(fp8_dtype) if kv_cache.dtype == torch.uint8 else kv_cache


def _is_fp8(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point and t.element_size() == 1


class DecodeKernelsMixin:
    """Decode entry shared by the ROCm impl and the CPU development impl."""

    _kernels: MLAKernels
    _decode_heads: int
    _v_scale_fix_qlens: frozenset[int] = frozenset()
    _triton_qlens: frozenset[int] = frozenset()  # query lengths vLLM's Triton decode serves (measured)
    _triton: TritonDecode | None = None
    _real_cache_pending: bool = False  # its calls not yet measured on the layer's real KV cache
    _route_generation: int | None = None  # the measure_state.generation its route was taken at (None: not measured)
    kv_lora_rank: int
    scale: float

    def _init_decode(self, num_heads: int, kv_cache_dtype: str) -> None:
        check_kv_cache_dtype(kv_cache_dtype)
        vllm_config = get_current_vllm_config()
        self._decode_heads = own_decode_heads(num_heads)
        self._kernels = load_kernels()
        self._vllm_config = vllm_config
        self._decode_kv_cache_dtype = kv_cache_dtype
        # Every decode call measured on this GPU (once per process; routing measured the same calls
        # where it chose this path). ROCm/aiter#6732: lengths whose fp8 output comes back short by
        # kv_scale are multiplied back. Where routing began the measurement at the model's construction,
        # the route is taken once it is collected (after the weights are loaded: _collect_route).
        if measure_state.begun_ahead(layer_calls(vllm_config, self._decode_heads, kv_cache_dtype)):
            self._route_generation = ROUTE_PENDING
        else:
            self._take_route()
        # The same calls measured again on the layer's real KV cache once vLLM allocated it: by vLLM's
        # warm-up of kernels that depend on the allocated cache where the release has one (this
        # registration is kept where it is active, around the model's construction and the cache's
        # allocation), else at the first decode call outside CUDA-graph capture.
        self._real_cache_pending = True
        warmup = real_cache_warmup()
        if warmup is not None:
            warmup.register_warmup(self)

    def _take_route(self) -> None:
        """The layer's route from its calls' measurement (the latest, on the real cache once made)."""
        generation = measure_state.generation
        route, found = measured_route(self._vllm_config, Route(True, (), self._decode_heads),
                                      self._decode_kv_cache_dtype)
        if not route.own:  # a refusal, or AITER not loaded (CPU development mode has no built-in to hand it to)
            raise ValueError(f"{BACKEND_NAME}: {route.refusal or '; '.join(route.reasons)}")
        self._v_scale_fix_qlens = measure.v_scale_fix_qlens(
            {q: m for q, m in found.measured.items() if q not in route.triton_qlens})
        self._triton_qlens = route.triton_qlens
        self._triton = found.triton
        self._route_generation = generation

    def _collect_route(self) -> None:
        """Every measurement begun at the model's construction collected (a refusal stops the server here,
        in one line), and this layer's route taken where it waited for it."""
        collect_ahead()
        if self._route_generation == ROUTE_PENDING:
            self._take_route()

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """vLLM's model loader, once the weights are loaded (0.32, 0.33, 0.34): the decode calls'
        measurement begun at the model's construction is collected here, first of all the points that
        collect it, then the release's own weight processing."""
        self._collect_route()
        super().process_weights_after_loading(act_dtype)

    def measure_real_cache(self, kv_cache: torch.Tensor) -> None:
        """The layer's calls measured on ``kv_cache`` (its real KV cache, as the decode reads it: an fp8
        cache in the platform's fp8 dtype), once; then the route taken again (a call measured wrong there
        is served by the remedy, or the layer refuses in one line)."""
        self._real_cache_pending = False
        vllm_config = self._vllm_config
        if cache_committed_later(vllm_config):
            logger.warning_once(
                "%s: vLLM reserves the KV cache as address space and maps its highest blocks only after "
                "CUDA-graph capture (enable_extensible_kv_cache), so the decode calls stand as measured on the "
                "probe's own cache, not on the real one; set --no-enable-extensible-kv-cache to measure there",
                BACKEND_NAME)
            return
        real_cache_measurement(layer_calls(vllm_config, self._decode_heads, self._decode_kv_cache_dtype),
                               remedy_splits(vllm_config, probe_device()), kv_cache)
        self._take_route()

    def measure_bound_cache(self) -> None:
        """vLLM's warm-up (``real_cache_warmup``): the layer's calls measured on the KV cache vLLM bound to
        it; where none is bound yet, left to the first decode call outside capture."""
        if not self._real_cache_pending:
            return
        cache = bound_cache(self._vllm_config, self)
        if cache is not None:
            self.measure_real_cache(_fp8_view(cache, vllm_builtin.platform_fp8_dtype()))

    def _before_decode(self, kv_cache: torch.Tensor) -> None:
        """At a decode call: the real-cache measurement where vLLM's warm-up did not make it (at the first
        call outside CUDA-graph capture: nothing it does may be captured), or the route taken again where
        another layer's measurement changed it."""
        if self._route_generation == ROUTE_PENDING:  # collected by now (a metadata builder was built first)
            if _capturing(kv_cache) and measure_state.begun_ahead(
                    layer_calls(self._vllm_config, self._decode_heads, self._decode_kv_cache_dtype)):
                raise RuntimeError(f"{BACKEND_NAME}: a decode call was captured before this layer's decode calls' "
                                   "measurement was collected (it is collected after the weights are loaded)")
            self._collect_route()  # where it was collected already, this only takes the route (no GPU work)
        if self._real_cache_pending:
            if not _capturing(kv_cache):
                self.measure_real_cache(kv_cache)
            else:
                self._real_cache_pending = False  # a route changed after capture would not reach the graphs
                logger.warning_once(
                    "%s: CUDA-graph capture began before this layer's decode calls were measured on its KV cache "
                    "(vLLM ran neither its JIT warm-up nor an eager step first): they stand as measured on the "
                    "probe's own cache; set --kernel-config.enable_jit_warmup=true to measure on the real cache",
                    BACKEND_NAME)
        if self._route_generation != measure_state.generation:
            self._take_route()

    def reserve_workspace(self) -> None:
        """Called by vLLM (0.33 and later) in its memory-profiling run, before the KV cache is sized: the
        persistent-mode work buffers and, where the remedy loaded, its slot table (for any query length)
        are allocated here, so that memory is counted; the metadata builder takes them over. A
        measurement begun at the model's construction is collected first, where the loader did not."""
        self._collect_route()
        vllm_config = self._vllm_config
        dtype = work_dtype(vllm_config, self._decode_kv_cache_dtype)
        longest = decode_query_len_limit(vllm_config)
        reserve_work(self._kernels, vllm_config.scheduler_config.max_num_seqs, longest,
                     self._decode_heads, dtype, dtype, vllm_config.device_config.device)
        if self._triton is not None:  # the remedy may serve any query length once the real cache is measured
            rows = max(self._triton.rows_per_request(q) for q in range(1, longest + 1))
            reserve_slot_table(vllm_config.scheduler_config.max_num_seqs * rows,
                               vllm_config.model_config.max_model_len + longest, vllm_config.device_config.device)

    def forward_mqa(self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_c_and_k_pe_cache: torch.Tensor,
                    attn_metadata: AiterMLAMetadata, layer: AttentionLayer) -> tuple[torch.Tensor, torch.Tensor | None]:
        decode = attn_metadata.decode
        assert decode is not None and decode.plan is not None
        out = self._decode(q, kv_c_and_k_pe_cache, decode.plan, decode.max_query_len, decode.attn_out_dtype, layer,
                           decode.work, decode.slot_table)
        return out, None

    def _decode(self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_cache: torch.Tensor, plan: DecodePlan,
                max_query_len: int, out_dtype: torch.dtype, layer: AttentionLayer, work: PersistentWork | None = None,
                table: torch.Tensor | None = None) -> torch.Tensor:
        q_scale = kv_scale = None
        if kv_cache.dtype == torch.uint8 or _is_fp8(kv_cache):
            if isinstance(q, tuple):
                q = torch.cat(q, dim=-1)
            fp8_dtype = q.dtype if _is_fp8(q) else vllm_builtin.platform_fp8_dtype()
            kv_cache = _fp8_view(kv_cache, fp8_dtype)
            q_scale, kv_scale = layer._q_scale, layer._k_scale
            if not _is_fp8(q):
                q = (q.float() / q_scale).to(fp8_dtype)
        if self._real_cache_pending or self._route_generation not in (None, measure_state.generation):
            self._before_decode(kv_cache)
        if max_query_len in self._triton_qlens:  # measured: AITER wrong here, vLLM's Triton decode right
            return triton_mla_decode(q, kv_cache, plan, kernels=self._triton, kv_lora_rank=self.kv_lora_rank,
                                     scale=self.scale, max_seqlen_q=max_query_len, decode_heads=self._decode_heads,
                                     out_dtype=out_dtype, q_scale=q_scale, kv_scale=kv_scale, table=table)
        return mla_decode(q, kv_cache, plan, kernels=self._kernels, kv_lora_rank=self.kv_lora_rank, scale=self.scale,
                          max_seqlen_q=max_query_len, decode_heads=self._decode_heads, out_dtype=out_dtype,
                          q_scale=q_scale, kv_scale=kv_scale, work=work,
                          v_scale_dropped=kv_scale is not None and max_query_len in self._v_scale_fix_qlens)


class AiterMLAImpl(DecodeKernelsMixin, BuiltinImpl):
    """The own path's impl: vLLM's built-in impl of the running release with the own decode.
    Everything but decode (``forward_mqa``) and the workspace reservation is the built-in's, so
    the own path's prefill is never behind the release it runs on (0.34's fused k-concat and
    gfx950 fused context gather included); layers whose prefill the built-in runs from metadata
    only its builder makes (fp8 prefill, FlyDSL) are routed to the built-in whole."""

    can_return_lse_for_decode: bool = False
    supports_dcp: bool = False  # the own builder refuses DCP; routing gives -dcp layers to the built-in

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None, attn_type: str, kv_sharing_target_layer_name: str | None,
                 **mla_args) -> None:
        check_unsupported_features(alibi_slopes, sliding_window, logits_soft_cap)
        if attn_type != AttentionType.DECODER:
            raise ValueError(f"{BACKEND_NAME} supports decoder self-attention only, got {attn_type}")
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                         logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args)
        if getattr(self, "_fp8_prefill_enabled", False):
            # routing gives these layers to the built-in (its builder makes the fp8 prefill metadata)
            raise ValueError(f"{BACKEND_NAME}: a layer with vLLM's built-in fp8 prefill reached the own path "
                             "(routing gives it to the built-in)")
        self._init_decode(num_heads, kv_cache_dtype)


# ---- the ROCM_AITER_MLA entry: vLLM's built-in backend, each layer routed to own or built-in ----


def layer_route(vllm_config, num_heads: int, latent_size: int, kv_cache_dtype: str, ahead: bool = False) -> Route:
    """The layer's route: its configuration first (``routing.choose_route``), then each decode call
    it would make measured on this GPU (``measure_state.measured_route``, ``ahead`` as there). Raises
    (one line) only where neither kernel was measured right for a call: the server must not start with
    a known-wrong answer; the built-in would make the same AITER call."""
    facts = layer_facts(vllm_config, num_heads, latent_size, kv_cache_dtype)
    route, _ = measured_route(vllm_config, choose_route(facts), kv_cache_dtype, ahead=ahead)
    if route.refusal:
        raise ValueError(f"{BACKEND_NAME}: {route.refusal}")
    if route.triton_qlens:
        logger.info_once("%s (vllm-aiter-mla %s): %d heads per GPU, --kv-cache-dtype %s: %s", BACKEND_NAME,
                         __version__, num_heads, kv_cache_dtype, "; ".join(route.reasons))
    if not route.own:
        logger.info_once("%s (vllm-aiter-mla %s): vLLM's built-in %s runs this attention (%d heads per GPU, "
                         "--kv-cache-dtype %s): %s", BACKEND_NAME, __version__, BuiltinImpl.__qualname__,
                         num_heads, kv_cache_dtype, "; ".join(route.reasons))
    return route


class RoutedMLAImpl(BuiltinImpl):
    """The impl class vLLM instantiates for a layer: an own ``AiterMLAImpl`` where
    ``routing.choose_route`` gives the layer to this package, else itself, which is vLLM's
    built-in impl. Its class attributes (``supports_dcp``, ...) are the built-in's: the
    configurations they admit are delegated."""

    def __new__(cls, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args):
        args = dict(num_heads=num_heads, head_size=head_size, scale=scale, num_kv_heads=num_kv_heads,
                    alibi_slopes=alibi_slopes, sliding_window=sliding_window, kv_cache_dtype=kv_cache_dtype,
                    logits_soft_cap=logits_soft_cap, attn_type=attn_type,
                    kv_sharing_target_layer_name=kv_sharing_target_layer_name)
        if layer_route(get_current_vllm_config(), num_heads, head_size, kv_cache_dtype, ahead=True).own:
            return AiterMLAImpl(**args, **mla_args)
        return super().__new__(cls)

    # The built-in's impl collects the measurements begun at the model's construction at the same points
    # as the own one (measure_state.collect_ahead), so every rank makes its exchanges at the same point
    # whichever implementation its layers got.
    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        collect_ahead()
        super().process_weights_after_loading(act_dtype)

    def reserve_workspace(self) -> None:
        collect_ahead()
        reserve = getattr(super(), "reserve_workspace", None)  # (vLLM 0.33 and later)
        if reserve is not None:
            reserve()


def _layer_impls(vllm_config, layer_names: list[str]) -> list[object]:
    context = vllm_config.compilation_config.static_forward_context
    return [context[name].impl for name in layer_names if getattr(context.get(name), "impl", None) is not None]


def builder_runs_own(kv_cache_spec, layer_names: list[str], vllm_config) -> bool:
    """Whether the metadata of these layers is the own path's: as their impls were routed (the
    model is built before its metadata builders), or, with no layer registered, by routing the
    configuration itself."""
    impls = _layer_impls(vllm_config, layer_names)
    if impls:
        own = {isinstance(impl, AiterMLAImpl) for impl in impls}
        if len(own) > 1:
            raise ValueError(f"{BACKEND_NAME}: layers {layer_names} share a metadata builder but were routed to "
                             "different implementations (own and vLLM's built-in)")
        return own.pop()
    num_heads = vllm_config.model_config.get_num_attention_heads(vllm_config.parallel_config)
    return layer_route(vllm_config, num_heads, kv_cache_spec.head_size, vllm_config.cache_config.cache_dtype).own


class RoutedMLAMetadataBuilder(BuiltinMetadataBuilder):
    """The builder class vLLM instantiates: an own ``AiterMLAMetadataBuilder`` for layers whose
    impl is the own one, else itself, which is vLLM's built-in builder. Its class attributes and
    class methods (CUDA-graph support, query-length support, ...) are the built-in's."""

    def __new__(cls, kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs):
        collect_ahead()  # where neither the loader nor the profiling run did (every release builds these first)
        if builder_runs_own(kv_cache_spec, layer_names, vllm_config):
            return AiterMLAMetadataBuilder(kv_cache_spec, layer_names, vllm_config, device)
        return super().__new__(cls)


class AiterMLABackend(BuiltinBackend):
    """vLLM's ``ROCM_AITER_MLA`` entry with this plugin: for vLLM's selection exactly the
    built-in backend (its dtypes, KV dtypes, head sizes, block sizes, DCP, non-causal and
    validation are inherited), so the plugin never moves a model off AITER MLA; the layers
    run the own path or the built-in one (``routing``)."""

    @staticmethod
    def get_impl_cls() -> type[RoutedMLAImpl]:
        return RoutedMLAImpl

    @staticmethod
    def get_builder_cls() -> type[RoutedMLAMetadataBuilder]:
        return RoutedMLAMetadataBuilder
