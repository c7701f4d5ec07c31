"""A layer's decode calls measured so that no call can take the server or the other tensor-parallel
ranks down: first in a child process under a time limit, its outcome recorded; then in this process
only where the child found the call safe; then agreed across the tensor-parallel group. backend/README.md
("A call that crashes or hangs ends a child, not the server") tells it in full.

* **First measurement, in a child** (``measure_child``, started through the image runtime's one
  supervisor of child processes, ``rocm_vllm_runtime.children.output``, which kills the child and all
  it started at the deadline): the remedy's tasks first, then AITER's. On a GPU the child first compiles
  the remedy's Triton kernels side by side (``measure_child.warm_up``); a child that ends during those
  compiles is started again without them, and where they pass the time limit AITER's tasks go to the next
  child. Where a child ends otherwise than by finishing, the task it was in is ``ended the process`` (a
  signal, e.g. SIGABRT from a missing kernel or a GPU memory fault, or a non-zero exit) or ``passed the
  time limit`` (``AITER_MLA_MEASURE_TIMEOUT_S``, default 300 s), that kernel's remaining tasks ``not
  measured``, and the other kernel's go to a second child. None of these outcomes is served.
* **Begun ahead** (``begin``): a server may begin the first measurement in a thread while it constructs
  the model and loads its weights; ``measure_layer`` collects it, waiting only for what is left.
* **The record** (``measurement_record``), in ``AITER_MLA_MEASURED_DIR`` (default: ``aiter-mla-measured``
  in ``$ROCM_VLLM_JIT_CACHE`` or ``/var/cache/aiter-jit``, where that folder exists; else none is kept): a
  later start of the same image on the same GPU with the same calls reads it and starts no child.
* **In this process**: each task the first measurement found served is measured again here, and this
  decides; so is the remedy's wherever it would serve (``measure_and_agree``). A task found not served
  never runs here (a call that ended or hung the child would end or hang the server).
* **On the layer's real KV cache** (``measure_on_cache``), before CUDA-graph capture: the probe's keys in
  the cache's highest rows, past 4 GiB from its base where the cache is that large (a kernel that reads
  the cache through a 32-bit offset, ROCm/aiter#5765, is right in the private cache and wrong there).
* **Agreement**: one ``measure.agree_flags`` exchange per set of calls on every rank, whatever its own
  measurement did (a failure before it is an outcome, never an exception that skips it); a second where
  the group needs the remedy at a query length a rank left unmeasured.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from . import measure, measure_child, measurement_record
from .kernels import KERNELS_ENV, kernel_mode
from .measure_child import KINDS, Task

logger = logging.getLogger("vllm.aiter_mla")

TIMEOUT_ENV = "AITER_MLA_MEASURE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0
# Two children at most, each under the limit: well inside the tensor-parallel group's own timeout
# (vLLM's 1,800 s), so the other ranks wait for a hanging rank's children, never time out on it.
MAX_TIMEOUT_S = 900.0
RECORDS_ENV = "AITER_MLA_MEASURED_DIR"
RECORDS_NAME = "aiter-mla-measured"
RUNTIME_MISSING = ("the start-up measurement runs in a child process through rocm_vllm_runtime (the image's "
                   "runtime), which is not installed: install it beside this plugin (pip install --no-deps ./runtime)")
STDERR_SHOWN = 200  # characters of the child's last stderr line in an outcome


def _runtime():
    """The image runtime's modules this one uses (one line where they are missing)."""
    try:
        from rocm_vllm_runtime import children, files, jitcache, numeric  # noqa: PLC0415
    except ImportError:
        raise RuntimeError(RUNTIME_MISSING) from None
    return children, files, jitcache, numeric


def timeout_setting(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds a measurement child may run: ``AITER_MLA_MEASURE_TIMEOUT_S`` (more than 0, at most 900),
    default 300."""
    _, _, _, numeric = _runtime()
    raw = environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    return numeric.duration(TIMEOUT_ENV, raw, MAX_TIMEOUT_S)


def records_setting(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The folder of measurement records: ``AITER_MLA_MEASURED_DIR``, else ``aiter-mla-measured`` in the
    image's persistent cache where that exists; None: no record is kept."""
    _, _, jitcache, _ = _runtime()
    chosen = environ.get(RECORDS_ENV, "").strip()
    if chosen:
        return Path(chosen)
    root = Path(environ.get(jitcache.CACHE_ROOT_ENV, "").strip() or jitcache.DEFAULT_CACHE_ROOT)
    return root / RECORDS_NAME if root.is_dir() else None


# ------------------------------------------------------------------------------ the child

@dataclass(frozen=True)
class ChildEnd:
    """What a child reported, and how it ended where it did not end by finishing."""

    done: dict[Task, measure.Measured]
    running: Task | None  # the task it had begun and not finished
    failure: measure.Measured | None  # ended the process or passed the time limit; None: it finished
    warming: bool = False  # it ended while compiling the remedy's kernels side by side (before any task)


def run_child(argv: Sequence[str], timeout_s: float):
    """The one start of a measurement child: its output once it ends, or at the deadline (then it and
    all it started are killed)."""
    children, _, _, _ = _runtime()
    return children.output(argv, timeout_s)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:STDERR_SHOWN] if lines else ""


def child_end(output, timeout_s: float) -> ChildEnd:
    """A child's ``children.Output`` read: the tasks it finished, the one it was in, and how it ended."""
    _, files, _, _ = _runtime()
    done: dict[Task, measure.Measured] = {}
    running: Task | None = None
    warming = False
    for line in output.stdout.splitlines():
        if not line.startswith(measure_child.LINE):
            continue  # the kernels' own output
        try:
            data = files.json_value(line[len(measure_child.LINE):], "the measurement child's report")
            if isinstance(data, dict) and ("warm" in data or "warmed" in data):
                warming = "warm" in data
            elif isinstance(data, dict) and "begin" in data:
                running = (str(data["begin"][0]), int(data["begin"][1]))
            elif isinstance(data, dict) and "done" in data:
                task = (str(data["done"][0]), int(data["done"][1]))
                done[task] = measure.measured_from(data["measured"])
                running = None
        except (ValueError, TypeError, KeyError, IndexError):
            continue  # a line cut short where the child was killed
    said = _last_line(output.stderr)
    code = output.returncode
    if output.error:
        failure = _ended(f"the measurement child could not be started ({output.error})")
    elif output.timed_out:
        failure = measure.Measured(measure.Outcome.TIMED_OUT, math.nan, math.nan,
                                   f"the measurement child passed {TIMEOUT_ENV}={timeout_s:g} s and was killed")
    elif code == 0:
        failure = None
    else:
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
        failure = _ended(f"the measurement child was {how}" + (f": {said}" if said else ""))
    return ChildEnd(done, running, failure, warming)


def _ended(detail: str) -> measure.Measured:
    return measure.Measured(measure.Outcome.ENDED, math.nan, math.nan, detail)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kernel_name(kind: str) -> str:
    return "AITER's call" if kind == "aiter" else "vLLM's Triton decode"


def measure_in_children(factory: str, calls: Sequence[measure.DecodeCall], splits: int, device: torch.device,
                        timeout_s: float) -> tuple[dict[Task, measure.Measured], float]:
    """Every task (the remedy's, then AITER's, at each query length) measured in children: a child that
    ends otherwise than by finishing leaves the task it was in so measured and that kernel's remaining
    tasks not measured, and the other kernel's remaining tasks go to the next child. Returns the outcomes
    and the seconds it took."""
    started = time.monotonic()
    remaining: list[Task] = [(kind, call.qlen) for kind in reversed(KINDS) for call in calls]
    found: dict[Task, measure.Measured] = {}
    warm = True
    while remaining:
        argv = measure_child.command(factory, calls, remaining, splits, device, warm)
        end = child_end(run_child(argv, timeout_s), timeout_s)
        found.update((task, m) for task, m in end.done.items() if task in remaining)
        remaining = [task for task in remaining if task not in found]
        if not remaining:
            break
        if end.warming and warm and (end.failure is None or end.failure.outcome is not measure.Outcome.TIMED_OUT):
            warm = False  # it ended compiling side by side (not by the limit): measured again, one at a time
            continue
        failure = end.failure or _ended("the measurement child ended without measuring it")
        if end.warming:  # the remedy's compiles passed the limit: its tasks so measured, AITER's to the next child
            found.update((task, failure) for task in remaining if task[0] == "triton")
            remaining = [task for task in remaining if task not in found]
            continue
        if end.running is None or end.running not in remaining:  # before its first call: nothing more can run
            found.update((task, failure) for task in remaining)
            break
        kind, qlen = end.running
        found[end.running] = failure
        gone = measure.Measured(measure.Outcome.NOT_MEASURED, math.nan, math.nan,
                                f"{_kernel_name(kind)} at query length {qlen} {failure.outcome.value} first")
        found.update((task, gone) for task in remaining if task[0] == kind and task not in found)
        remaining = [task for task in remaining if task not in found]
    return found, time.monotonic() - started


# ------------------------------------------------------------------------------ the record

def first_measurement(factory: str, calls: Sequence[measure.DecodeCall], splits: int, device: torch.device,
                      folder: Path | None, timeout_s: float) -> tuple[dict[Task, measure.Measured], str]:
    """Each task's first measurement: from a record that can be trusted, else measured in children and
    recorded. Returns it and where it came from, in words."""
    ident = measurement_record.identity(measurement_record.gpu_of(device), calls, splits, factory)
    builds = measurement_record.builds()
    path = None
    if folder is not None:
        try:
            path = measurement_record.path_in(folder, ident)
            found, why = measurement_record.read(path, ident, builds, [c.qlen for c in calls], timeout_s)
        except (OSError, ValueError) as exc:
            found, why = None, f"unusable ({measure.one_line(exc)})"
        if found is not None:
            return found, f"read from its record {path}"
        if why:
            logger.info("ROCM_AITER_MLA: the measurement record %s is %s: measured again", path or folder, why)
    found, seconds = measure_in_children(factory, calls, splits, device, timeout_s)
    if path is None:
        return found, f"measured in a child process in {seconds:.2f} s (no record kept: set {RECORDS_ENV} to keep one)"
    try:
        measurement_record.write(path, ident, builds, timeout_s, found)
    except (OSError, ValueError) as exc:
        logger.warning("ROCM_AITER_MLA: the measurement record %s could not be written (%s): each start measures "
                       "in a child; set %s to a writable folder", path, measure.one_line(exc), RECORDS_ENV)
        return found, f"measured in a child process in {seconds:.2f} s"
    return found, f"measured in a child process in {seconds:.2f} s, recorded in {path}"


# ------------------------------------------------------------------------------ the layer

@dataclass(frozen=True)
class LayerResult:
    measured: dict[int, measure.Measured]  # AITER's calls, per query length
    remedy: dict[int, measure.Measured]  # vLLM's Triton decode's, per query length
    seconds: float  # in this process
    flags: tuple[frozenset[int], frozenset[int]]  # the tensor-parallel group's (measure.agree_flags)
    first: str  # where the first measurement came from, in words
    cache: str = ""  # where this process's last measurement ran (``measure_on_cache``), in words


def _every(calls: Sequence[measure.DecodeCall], m: measure.Measured) -> dict[Task, measure.Measured]:
    return {(kind, call.qlen): m for kind in KINDS for call in calls}


def _failed(calls: Sequence[measure.DecodeCall], exc: Exception) -> dict[Task, measure.Measured]:
    return _every(calls, measure.Measured(measure.Outcome.RAISED, math.nan, math.nan,
                                          f"the first measurement: {measure.one_line(exc)}"))


IN_PROCESS = ("in this process only (CPU development mode: the pure-PyTorch reference on the CPU cannot end "
              "the process, and vLLM's Triton decode does not run there)")


def needs_child(factory: str, device: torch.device, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the first measurement runs in a child: wherever a measured kernel could end or hang the
    process (AITER's, or anything on a GPU); not in CPU development mode, where the server measures the
    pure-PyTorch reference on the CPU (``AITER_MLA_KERNELS=reference``), which raises at worst, and the
    remedy cannot load."""
    return not (factory == measure_child.PRODUCTION and device.type == "cpu"
                and kernel_mode(environ) == "reference")


def _unmeasured(calls: Sequence[measure.DecodeCall]) -> dict[Task, measure.Measured]:
    """Every task left to this process's measurement, which measures them all (none keeps this)."""
    return _every(calls, measure.Measured(measure.Outcome.NOT_MEASURED, math.nan, math.nan,
                                          "left to the server's process"))


def _first(factory: str, calls: Sequence[measure.DecodeCall], splits: int, device: torch.device,
           environ: Mapping[str, str]) -> tuple[bool, dict[Task, measure.Measured], str]:
    """The first measurement (``first_measurement``), or every task left to this process where no child
    is needed: whether it ran in a child, its outcomes and where they came from. Never raises: a failure
    is an outcome of every task."""
    try:
        in_child = needs_child(factory, device, environ)
        if not in_child:
            return False, _unmeasured(calls), IN_PROCESS
        first, source = first_measurement(factory, calls, splits, device, records_setting(environ),
                                          timeout_setting(environ))
        return True, first, source
    except Exception as exc:  # noqa: BLE001  (an outcome: the exchange after it must happen on every rank)
        return True, _failed(calls, exc), f"not made ({measure.one_line(exc)})"


# ------------------------------------------------------------------------------ begun ahead

# The settings a first measurement reads (the third: the runtime's jitcache.CACHE_ROOT_ENV, where the
# record folder is by default), part of what a measurement begun ahead is kept under.
SETTINGS = (RECORDS_ENV, TIMEOUT_ENV, "ROCM_VLLM_JIT_CACHE", KERNELS_ENV)
_BEGUN: dict[tuple, Future] = {}
_BEGUN_LOCK = threading.Lock()


def _begun_key(factory: str, calls: Sequence[measure.DecodeCall], splits: int, device: torch.device,
               environ: Mapping[str, str]) -> tuple:
    return factory, tuple(calls), splits, str(device), tuple(environ.get(name, "") for name in SETTINGS)


def begin(factory: str, calls: Sequence[measure.DecodeCall], splits: int, device: torch.device,
          environ: Mapping[str, str] = os.environ) -> bool:
    """Begin the first measurement of ``calls`` now (its record read, else its children run), in a thread
    of this process, while the server goes on (constructing the model, loading its weights);
    ``measure_layer`` with the same calls, splits, device, factory and settings collects it, waiting for
    what is left. Whether a measurement was begun: not where none runs in a child (CPU development mode)
    or one of these was begun already and not collected yet. Nothing is exchanged with other ranks here:
    the agreement stays in ``measure_layer``."""
    calls = list(calls)
    environ = dict(environ)
    try:
        if not needs_child(factory, device, environ):
            return False
    except ValueError:
        return False  # a bad setting: measure_layer makes it an outcome
    key = _begun_key(factory, calls, splits, device, environ)
    with _BEGUN_LOCK:
        if key in _BEGUN:
            return False
        future: Future = Future()
        _BEGUN[key] = future
    thread = threading.Thread(target=_run_begun, args=(future, factory, calls, splits, device, environ),
                              name="aiter-mla-first-measurement", daemon=True)
    thread.start()
    return True


def _run_begun(future: Future, factory: str, calls: list[measure.DecodeCall], splits: int, device: torch.device,
               environ: Mapping[str, str]) -> None:
    future.set_running_or_notify_cancel()
    try:
        future.set_result(_first(factory, calls, splits, device, environ))
    except BaseException as exc:  # noqa: BLE001  (handed to whoever collects it)
        future.set_exception(exc)


def _collect(factory: str, calls: Sequence[measure.DecodeCall], splits: int, device: torch.device,
             environ: Mapping[str, str]) -> tuple[bool, dict[Task, measure.Measured], str] | None:
    """The outcome of a measurement ``begin`` started for these (waiting for it), or None where none was."""
    with _BEGUN_LOCK:
        future = _BEGUN.pop(_begun_key(factory, calls, splits, device, environ), None)
    if future is None:
        return None
    try:
        in_child, first, source = future.result()
    except Exception as exc:  # noqa: BLE001  (an outcome: the exchange after it must happen on every rank)
        return True, _failed(calls, exc), f"not made ({measure.one_line(exc)})"
    return in_child, first, f"{source}, begun ahead"


def measure_layer(kernels, triton, calls: Sequence[measure.DecodeCall], splits: int, device: torch.device,
                  factory: str = measure_child.PRODUCTION, group=None, cache: torch.Tensor | None = None,
                  environ: Mapping[str, str] = os.environ) -> LayerResult:
    """The layer's calls measured crash-safely (first in a child or from its record, then here where
    that found them served) and agreed across ``group``. ``kernels``/``triton``: this process's (what
    serves; ``triton`` None where it could not be loaded); ``factory``: how the child loads its own
    (``measure_child.PRODUCTION`` in a server). A first measurement ``begin`` started for these is
    collected instead of starting another."""
    calls = list(calls)
    in_child, first, source = (_collect(factory, calls, splits, device, environ)
                               or _first(factory, calls, splits, device, environ))
    aiter_at = [c.qlen for c in calls if not in_child or first["aiter", c.qlen].outcome.served]
    remedy_at = [c.qlen for c in calls if not in_child or first["triton", c.qlen].outcome is measure.Outcome.CORRECT]
    measured, remedied, seconds, flags = measure_and_agree(
        kernels, triton, calls, device, cache, aiter_at, remedy_at, {c.qlen: first["aiter", c.qlen] for c in calls},
        {c.qlen: first["triton", c.qlen] for c in calls}, group, remedy_where_needed=in_child)
    return LayerResult(measured, remedied, seconds, flags, source)


def measure_and_agree(kernels, triton, calls: Sequence[measure.DecodeCall], device: torch.device,
                      cache: torch.Tensor | None, aiter_at: Sequence[int], remedy_at: Sequence[int],
                      measured: Mapping[int, measure.Measured], remedied: Mapping[int, measure.Measured],
                      group, remedy_where_needed: bool = True):
    """AITER's calls measured in this process at ``aiter_at``; the remedy at ``remedy_at`` where this
    process needs it (AITER not served here), or everywhere there without ``remedy_where_needed``; the
    outcomes replace those given (``measured``, ``remedied``: what stands where a kernel is not measured
    here), and the group agrees (``agree_in_step``). Returns the outcomes, the seconds the measuring took
    and the group's (need, bad) flags."""
    measured, remedied = dict(measured), dict(remedied)
    here, remedied_here, seconds = measure.measure_both(kernels, triton, calls, device, cache=cache, aiter_at=aiter_at,
                                                        remedy_at=remedy_at, remedy_where_needed=remedy_where_needed)
    measured.update(here)
    remedied.update(remedied_here)

    def remedy_left(qlens: frozenset[int]) -> dict[int, measure.Measured]:
        nonlocal seconds
        _, more, more_seconds = measure.measure_both(kernels, triton, calls, device, cache=cache, aiter_at=(),
                                                     remedy_at=qlens)
        seconds += more_seconds
        return more

    left = frozenset(q for q in remedy_at if q not in remedied_here)
    flags = agree_in_step(measured, remedied, calls, group, left, remedy_left)
    return measured, remedied, seconds, flags


def agree_in_step(measured: Mapping[int, measure.Measured], remedied: dict[int, measure.Measured],
                  calls: Sequence[measure.DecodeCall], group, left: frozenset[int] = frozenset(),
                  remedy_left: Callable[[frozenset[int]], Mapping[int, measure.Measured]] | None = None,
                  ) -> tuple[frozenset[int], frozenset[int]]:
    """The group's exchanges, the same number on every rank whatever it measured: a first one of this
    rank's flags and the query lengths where it left the remedy unmeasured (``left``); where the group
    needs the remedy at such a length (another rank's AITER is not served there), ``remedy_left`` measures
    it here (its outcomes go into ``remedied``) and every rank makes a second exchange: whether it does
    depends on the agreed flags alone. A rank that measures nothing here (its kernels did not load, or
    measuring failed before it) leaves nothing unmeasured and has no ``remedy_left``. Returns the group's
    (need, bad) flags."""
    qlens = [c.qlen for c in calls]
    need, bad, left_somewhere = measure.agree_flags((*measure.local_flags(measured, remedied), left), qlens, group)
    if need & left_somewhere:
        if remedy_left is not None:
            remedied.update(remedy_left(need & left))
        need, bad = measure.agree_flags(measure.local_flags(measured, remedied), qlens, group)
    return need, bad


# ------------------------------------------------------------------------------ the layer's real cache

def cache_unusable(cache: torch.Tensor, calls: Sequence[measure.DecodeCall]) -> str:
    """Why the probe's keys cannot go to ``cache`` ('' where they can): another dtype than the calls
    read, not a contiguous [rows, ..., 576] tensor, or fewer rows than the probe writes (then it lies
    inside the private cache's reach)."""
    call = calls[0]
    if cache.dtype != call.kv_dtype:
        return f"it holds {measure.dtype_name(cache.dtype)}, the calls read {measure.dtype_name(call.kv_dtype)}"
    if cache.dim() < 2 or cache.shape[-1] != measure.HEAD_DIM or not cache.is_contiguous():
        return f"it is no contiguous [rows, ..., {measure.HEAD_DIM}] tensor"
    rows, needed = cache.numel() // measure.HEAD_DIM, measure.probe_rows(calls)
    if rows < needed:
        return f"its {rows} rows are fewer than the probe's {needed}"
    return ""


def describe_cache(cache: torch.Tensor, rows: int) -> str:
    """Where a measurement in ``cache`` put its keys: its size and how far past its base its highest
    ``rows`` rows begin."""
    size = cache.numel() * cache.element_size()
    start = size - rows * measure.HEAD_DIM * cache.element_size()
    return (f"the layer's KV cache ({_bytes(size)}, the probe's keys in its highest {rows} rows, "
            f"{_bytes(start)} and more past its base)")


def _bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f} GiB" if shift == 30 else f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def measure_on_cache(kernels, triton, calls: Sequence[measure.DecodeCall], cache: torch.Tensor,
                     measured: Mapping[int, measure.Measured], remedied: Mapping[int, measure.Measured],
                     group=None) -> LayerResult:
    """The layer's calls measured again in this process with the probe's keys in the highest rows of
    ``cache`` (the layer's real KV cache, in the calls' KV dtype): AITER's where ``measured`` has them
    served, the remedy's where ``remedied`` has them correct and it would serve (``measure_and_agree``);
    these outcomes replace those. The rows written hold what they held before once this returns (at a
    first eager step they may hold a request's keys). Where the keys cannot go to the cache, the given
    outcomes stand and ``cache`` of the result says why. The group agrees whatever happened."""
    calls = list(calls)
    measured, remedied = dict(measured), dict(remedied)
    seconds = 0.0
    try:
        why = cache_unusable(cache, calls)
        if why:
            where = f"not on the layer's KV cache ({why}): the private cache's measurement stands"
        else:
            rows = measure.probe_rows(calls)
            written = cache.view(-1, measure.HEAD_DIM)[-rows:]
            saved = written.clone()
            try:
                measured, remedied, seconds, flags = measure_and_agree(
                    kernels, triton, calls, cache.device, cache, [q for q, m in measured.items() if m.outcome.served],
                    [q for q, m in remedied.items() if m.outcome is measure.Outcome.CORRECT], measured, remedied, group)
            finally:
                written.copy_(saved)
            return LayerResult(measured, remedied, seconds, flags, "", describe_cache(cache, rows))
    except Exception as exc:  # noqa: BLE001  (an outcome: the exchange below must happen on every rank)
        failed = measure.Measured(measure.Outcome.RAISED, math.nan, math.nan,
                                  f"measuring on the layer's KV cache: {measure.one_line(exc)}")
        measured = {q: failed if m.outcome.served else m for q, m in measured.items()}
        remedied = {q: failed if m.outcome is measure.Outcome.CORRECT else m for q, m in remedied.items()}
        where = f"the layer's KV cache ({measure.one_line(exc)})"
    flags = agree_in_step(measured, remedied, calls, group)
    return LayerResult(measured, remedied, seconds, flags, "", where)
