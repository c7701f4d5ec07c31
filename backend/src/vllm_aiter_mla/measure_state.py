"""The start-up measurement's state in this process, for the adapters (``backend.py``).

Each set of decode calls a layer makes is measured once per process (AITER's kernels and the
remedy, vLLM's Triton decode, on the same probes: ``crash_safe``, ``measure``), agreed across the
tensor-parallel group, and measured again on a layer's real KV cache once vLLM allocated it (through
vLLM's warm-up registry of kernels that depend on the allocated cache, where the release has one).
``measured_route`` turns the latest measurement into the route a layer takes; ``generation`` counts
the real-cache measurements that changed it, so impls and builders take their route again.

**Begun at the model's construction, collected after its weights are loaded** (backend/README.md tells
it in full). Where a child measures (``crash_safe.needs_child``), the first layer's construction begins
the first measurement (``begin_ahead``) and decides own or built-in from what needs no measurement: the
configuration (``routing``) and whether AITER's kernels load. ``collect_ahead`` collects every set begun,
in order, and stops the server in one line where a set's route is a refusal. It runs at the first of: an
MLA impl's ``process_weights_after_loading`` (inside vLLM's model loader: 0.32, 0.33, 0.34), its
``reserve_workspace`` (the memory-profiling run, 0.33 and later) and a metadata builder's construction
(every release: before the KV cache, CUDA-graph capture and the first request). The built-in's impl and
builder reach these too (``backend.RoutedMLAImpl``, ``RoutedMLAMetadataBuilder``), so every rank makes
its exchanges at the same point.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from vllm.logger import init_logger

from . import crash_safe, measure, measure_child, remedy
from .kernels import load_kernels
from .remedy import TritonDecode
from .routing import Route, with_measurements
from .upstream_kernels import load_triton_decode
from .vllm_builtin import BACKEND_NAME, decode_query_len_limit, layer_calls

logger = init_logger("vllm.aiter_mla")


def probe_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _tensor_parallel_group():
    """vLLM's tensor-parallel CPU group where it has more than one rank, else None."""
    try:
        from vllm.distributed import parallel_state  # noqa: PLC0415

        if not parallel_state.model_parallel_is_initialized():
            return None
        group = parallel_state.get_tp_group()
    except Exception:  # noqa: BLE001  (no distributed state: this process alone)
        return None
    return group.cpu_group if group.world_size > 1 else None


@dataclass(frozen=True)
class LayerMeasurement:
    measured: dict[int, measure.Measured]  # AITER's calls, per query length
    remedy: dict[int, measure.Measured]  # vLLM's Triton decode on the same probes, per query length
    seconds: float
    flags: tuple[frozenset[int], frozenset[int]]  # the tensor-parallel group's (measure.agree_flags)
    triton: TritonDecode | None = None  # the remedy's functions (None: they could not be loaded)
    cache: str = ""  # where the last measurement in this process ran, once on a layer's real KV cache


_MEASURED: dict[tuple, LayerMeasurement] = {}
# Cache geometries (set of calls, shape, strides, dtype, device) measured on a layer's real KV cache.
_ON_CACHE: set[tuple] = set()
# Counts the measurements on a layer's real KV cache that replaced an entry of _MEASURED: an impl or
# builder that applied an older count takes the route again before its next decode call.
generation = 0
# Sets of calls whose first measurement was begun at the model's construction (``begin_ahead``) and is
# not collected yet, in the order begun: each with its split count and its route before measurement.
_AHEAD: dict[tuple[measure.DecodeCall, ...], tuple[int, Route]] = {}


def _compute_units(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 1


def remedy_splits(vllm_config, device: torch.device) -> int:
    """The static split count of the remedy's calls: vLLM's TRITON_MLA rule for the longest request."""
    return remedy.kv_splits(vllm_config.model_config.max_model_len + decode_query_len_limit(vllm_config),
                            _compute_units(device))


def layer_measurement(calls: tuple[measure.DecodeCall, ...], splits: int = 4) -> LayerMeasurement:
    """The layer's decode calls measured crash-safely on this process's GPU (``crash_safe``), AITER's and
    the remedy's (``splits`` splits) on the same probes, once per process and set of calls (a failure
    too), and agreed across the tensor-parallel group: every rank reaches the group's one exchange for
    each new set of calls (the key holds no failure text, so a changing message makes no extra one)."""
    _AHEAD.pop(calls, None)  # collected here, if begun ahead (crash_safe.measure_layer takes the child's outcome)
    kernels, failed, triton, triton_failed, device = _loaded(splits)
    key = (kernels, triton, calls, device)
    if key in _MEASURED:
        return _MEASURED[key]
    if kernels is None:
        raised = _unloaded(failed)
        measured, remedied, seconds, source = {call.qlen: raised for call in calls}, {}, 0.0, ""
        flags = crash_safe.agree_in_step(measured, remedied, calls, _tensor_parallel_group())
    else:
        found = crash_safe.measure_layer(kernels, triton, calls, splits, device, group=_tensor_parallel_group())
        measured, remedied, seconds, flags = found.measured, found.remedy, found.seconds, found.flags
        source = found.first
        if triton is None:
            remedied = {q: dataclasses.replace(m, detail=f"loading it: {triton_failed}") if m.detail == "not loaded"
                        else m for q, m in remedied.items()}
    result = _MEASURED[key] = LayerMeasurement(measured, remedied, seconds, flags, triton)
    first = calls[0]
    if kernels is not None:
        chosen = measure.serving(measured, remedied, flags)
        logger.info("%s: MLA decode with %d heads, q %s / KV %s, measured on %s in %.2f s (AITER's %s kernels, "
                    "persistent, and %s; the first measurement %s): %s", BACKEND_NAME, first.heads,
                    measure.dtype_name(first.q_dtype), measure.dtype_name(first.kv_dtype), device, seconds,
                    kernels.name, remedy.NAME, source,
                    measure.describe_serving(chosen, measured, remedied, triton.function if triton else None))
    fixed = sorted(measure.v_scale_fix_qlens(measured))
    if fixed:
        logger.info("%s: AITER's fp8 MLA decode with %d heads leaves V unscaled at query length %s "
                    "(ROCm/aiter#6732, measured on %s): the own path multiplies its output by kv_scale there",
                    BACKEND_NAME, first.heads, ", ".join(map(str, fixed)), device)
    return result


def _unloaded(failed: str) -> measure.Measured:
    """The measurement of a call whose kernels could not be loaded."""
    return measure.Measured(measure.Outcome.RAISED, float("nan"), float("nan"), f"loading the kernels: {failed}")


def _loaded(splits: int):
    """This process's kernels (AITER's, None where they could not be loaded, and why), the remedy's
    (likewise) and the device they are measured on."""
    try:
        kernels, failed = load_kernels(), ""
    except Exception as exc:  # noqa: BLE001  (measured as raising; the route goes to the built-in)
        kernels, failed = None, measure.one_line(exc)
    try:
        triton, triton_failed = load_triton_decode(splits), ""
    except Exception as exc:  # noqa: BLE001  (measured as raising: the remedy serves nothing)
        triton, triton_failed = None, measure.one_line(exc)
    return kernels, failed, triton, triton_failed, probe_device()


def real_cache_measurement(calls: tuple[measure.DecodeCall, ...], splits: int, cache: torch.Tensor) -> LayerMeasurement:
    """The layer's decode calls measured again on its real KV cache (``cache``, in the calls' KV dtype)
    before CUDA-graph capture (``crash_safe.measure_on_cache``), once per process and cache geometry:
    caches of one shape, strides and dtype put the keys at the same offsets from their bases. Its outcome
    replaces the set of calls' measurement (``layer_measurement``), so the route every layer takes next
    follows it; one start-up line says what it found."""
    global generation
    collect_ahead()
    kernels, _, triton, _, device = _loaded(splits)
    found = layer_measurement(calls, splits)
    key = (kernels, triton, calls, device)
    geometry = (key, tuple(cache.shape), tuple(cache.stride()), cache.dtype, cache.device)
    if kernels is None or geometry in _ON_CACHE:
        return found
    _ON_CACHE.add(geometry)
    result = crash_safe.measure_on_cache(kernels, triton, calls, cache, found.measured, found.remedy,
                                         _tensor_parallel_group())
    updated = _MEASURED[key] = LayerMeasurement(result.measured, result.remedy, result.seconds, result.flags,
                                                found.triton, result.cache)
    generation += 1
    first = calls[0]
    chosen = measure.serving(updated.measured, updated.remedy, updated.flags)
    logger.info("%s: MLA decode with %d heads, q %s / KV %s, measured again in %.2f s on %s: %s", BACKEND_NAME,
                first.heads, measure.dtype_name(first.q_dtype), measure.dtype_name(first.kv_dtype), result.seconds,
                result.cache, measure.describe_serving(chosen, updated.measured, updated.remedy,
                                                       triton.function if triton else None))
    return updated


def _warmup_hook():
    """vLLM's registry of warm-ups that depend on the allocated KV cache (``JitWarmupRegistry`` in
    ``vllm.model_executor.warmup.jit_warmup``: registrations made while it is active, run once the
    cache is bound and before CUDA-graph capture) and the base class of what it runs, where the running
    release has them with that interface; else None."""
    try:
        from vllm.model_executor.warmup import jit_warmup  # noqa: PLC0415
    except ImportError:
        return None
    registry = getattr(jit_warmup, "JitWarmupRegistry", None)
    base = getattr(jit_warmup, "VllmJitKernel", None)
    if registry is None or base is None:
        return None
    if not all(callable(getattr(registry, name, None)) for name in ("register", "activate", "warmup")):
        return None
    if not all(callable(getattr(base, name, None)) for name in ("get_warmup_keys", "compile", "compile_many",
                                                                 "register_warmup")):
        return None
    return registry, base


@functools.cache
def real_cache_warmup():
    """The warm-up an own impl registers with vLLM's registry (``_warmup_hook``), one per process, or None
    where the release has none: run by vLLM's JIT warm-up, it measures each registered impl's decode
    calls on its layer's bound KV cache (``DecodeKernelsMixin.measure_bound_cache``)."""
    hook = _warmup_hook()
    if hook is None:
        return None
    _, base = hook

    class RealCacheMeasurement(base):  # type: ignore[misc, valid-type]
        """Each own layer's decode calls measured on its allocated KV cache: one warm-up key per impl."""

        def get_warmup_keys(self, impl):
            return [impl]

        def compile(self, impl) -> None:
            impl.measure_bound_cache()

    return RealCacheMeasurement()


def bound_cache(vllm_config, impl) -> torch.Tensor | None:
    """The KV cache vLLM bound to the layer whose impl is ``impl`` (a tensor, or the first of a list of
    them), None where there is none yet."""
    context = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {}
    for layer in context.values():
        if getattr(layer, "impl", None) is impl:
            cache = getattr(layer, "kv_cache", None)
            if isinstance(cache, (list, tuple)):
                cache = cache[0] if cache else None
            return cache if isinstance(cache, torch.Tensor) and cache.numel() else None
    return None


def cache_committed_later(vllm_config) -> bool:
    """Whether the running vLLM reserves the KV cache as address space and maps (commits) its blocks
    later (0.34's ``ExtensibleKVCache``, ``cache_config.enable_extensible_kv_cache``): rows past the
    committed blocks are not memory yet."""
    return bool(getattr(getattr(vllm_config, "cache_config", None), "enable_extensible_kv_cache", False))


def avoiding(calls: tuple[measure.DecodeCall, ...]) -> str:
    """The settings that avoid a layer's decode calls, for a refusal's line."""
    first = calls[0]
    ways = []
    if len(calls) > 1:
        ways.append("fewer num_speculative_tokens in --speculative-config")
    if first.fp8:
        ways.append("--kv-cache-dtype auto")
    ways.append("another --tensor-parallel-size (another head count)")
    return "avoid the call with " + " or ".join(ways)


def begin_ahead(calls: tuple[measure.DecodeCall, ...], splits: int, route: Route) -> bool:
    """Begin the first measurement of ``calls`` now, at the model's construction (``crash_safe.begin``: its
    record read, else its children run, in a thread), for ``collect_ahead`` to collect once the weights are
    loaded. Whether the measurement is left to ``collect_ahead``: where the first measurement runs in a
    child (not in CPU development mode, nor where a setting is bad: there it is measured now, as an
    outcome), and not measured in this process already. Where AITER's kernels did not load nothing is
    begun, but the set is still left to ``collect_ahead``, so that this rank makes its exchange where the
    others make theirs. ``route``: the layer's before measurement (``routing.choose_route``), own."""
    if calls in _AHEAD:
        return True
    kernels, _, triton, _, device = _loaded(splits)
    if (kernels, triton, calls, device) in _MEASURED:
        return False
    try:
        if not crash_safe.needs_child(measure_child.PRODUCTION, device):
            return False
    except ValueError:
        return False
    if kernels is not None:
        crash_safe.begin(measure_child.PRODUCTION, calls, splits, device)
    _AHEAD[calls] = (splits, route)
    return True


def begun_ahead(calls: tuple[measure.DecodeCall, ...]) -> bool:
    """Whether the measurement of ``calls`` was begun ahead and is not collected yet."""
    return calls in _AHEAD


def collect_ahead() -> None:
    """Collect every first measurement begun at the model's construction (``begin_ahead``), in the order
    begun (``layer_measurement``: one exchange per set on every rank). Then, where a set's route is a
    refusal, the server stops here in one line, before its KV cache is allocated and anything is served."""
    refusals = []
    while _AHEAD:
        calls, (splits, route) = next(iter(_AHEAD.items()))
        found = layer_measurement(calls, splits)
        routed = _route_of(route, calls, found)
        if routed.refusal:
            refusals.append(routed.refusal)
        elif routed.triton_qlens:
            first = calls[0]
            logger.info("%s: MLA decode with %d heads, KV %s: %s", BACKEND_NAME, first.heads,
                        measure.dtype_name(first.kv_dtype), "; ".join(routed.reasons))
    if refusals:
        raise ValueError(f"{BACKEND_NAME}: {refusals[0]}")


def _unloaded_route(unloaded: measure.Measured) -> Route:
    """The route where AITER itself could not be loaded: the built-in's (which imports it too and says so
    in its own words)."""
    return Route(False, (f"AITER's decode: {unloaded.describe()}",))


def _route_of(route: Route, calls: tuple[measure.DecodeCall, ...], found: LayerMeasurement) -> Route:
    if all(m.detail.startswith("loading the kernels") for m in found.measured.values()):
        return _unloaded_route(next(iter(found.measured.values())))
    return with_measurements(route, found.measured, found.remedy, found.flags, avoiding(calls))


def measured_route(vllm_config, route: Route, kv_cache_dtype: str,
                   ahead: bool = False) -> tuple[Route, LayerMeasurement | None]:
    """``route`` (an own one) once the layer's decode calls were measured (``layer_measurement``):
    which kernel serves which query length, or a refusal. Every measurement begun ahead is collected
    first (``collect_ahead``). ``ahead`` (the model's construction): the measurement is begun instead
    where it can be (``begin_ahead``), and the route is returned unmeasured (``Route.pending``), own
    where AITER's kernels load, else the built-in's; ``collect_ahead`` measures it later."""
    if not route.own:
        return route, None
    calls = layer_calls(vllm_config, route.decode_heads, kv_cache_dtype)
    splits = remedy_splits(vllm_config, probe_device())
    if ahead and begin_ahead(calls, splits, route):
        kernels, failed, _, _, _ = _loaded(splits)
        if kernels is None:
            return _unloaded_route(_unloaded(failed)), None
        return dataclasses.replace(route, pending=True), None
    collect_ahead()
    found = layer_measurement(calls, splits)
    return _route_of(route, calls, found), found
