"""A layer's decode calls measured so that no call can take the server or the other tensor-parallel
ranks down: first in a child process under a time limit, its outcome recorded; then in this process
only where the child found the call safe; then agreed across the tensor-parallel group.

* **First measurement, in a child** (``measure_child``, started through the image runtime's one
  supervisor of child processes, ``rocm_vllm_runtime.children.output``, which kills the child and all
  it started at the deadline): the remedy's tasks first (vLLM's Triton decode at each query length),
  then AITER's. The child reports each task as it begins and ends; when it ends otherwise, the task it
  was in is measured as ``ended the process`` (a signal: SIGABRT from a missing kernel, a GPU memory
  fault; or a non-zero exit) or ``passed the time limit`` (``AITER_MLA_MEASURE_TIMEOUT_S``, default
  300 s), that kernel's remaining tasks as ``not measured``, and the other kernel's remaining tasks run
  in a second child. So at most two children run, each under the limit. None of these outcomes is
  served: AITER's call goes to the remedy where the remedy measured right, else the server refuses to
  start in one line.
* **The record** (``measurement_record``), in ``AITER_MLA_MEASURED_DIR`` (default:
  ``aiter-mla-measured`` in the image's persistent cache, ``$ROCM_VLLM_JIT_CACHE`` or
  ``/var/cache/aiter-jit``, where that folder exists; else no record is kept and each start measures
  in a child): a later start of the same image on the same GPU with the same calls reads it and starts
  no child. A record that cannot be trusted is measured again and replaced.
* **In this process**: the server's own kernels are what serve, so each task the first measurement
  found served (AITER: ``correct`` or ``drops the V scale``; the remedy: ``correct``) is measured again
  here, through the same function, and this measurement decides; a task it found not served keeps that
  outcome and never runs here (a call that ended or hung the child would end or hang the server).
  The in-process measurement at start-up runs on the probe's private cache.
* **On the layer's real KV cache** (``measure_on_cache``), once vLLM allocated it and before CUDA-graph
  capture: every task still served (AITER's, the remedy's) measured again in this process with the
  probe's keys in the cache's highest rows, past 4 GiB from its base where the cache is that large (a
  kernel that reads the cache through a 32-bit offset, ROCm/aiter#5765, is right in the private cache
  and wrong there). The rows it overwrites hold what they held before once it returns. A task found
  not served keeps that outcome; a later start that reads the record still measures here, on the
  real cache. Then one more exchange.
* **Agreement**: one ``measure.agree_flags`` exchange per set of calls on every rank, whatever its own
  measurement did: a failure anywhere before it (a bad setting, a record folder that cannot be
  written, a child that could not start) is an outcome, never an exception that skips the exchange.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from . import measure, measure_child, measurement_record
from .kernels import kernel_mode
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
        from rocm_vllm_runtime import children, files, jitcache, numbers  # noqa: PLC0415
    except ImportError:
        raise RuntimeError(RUNTIME_MISSING) from None
    return children, files, jitcache, numbers


def timeout_setting(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds a measurement child may run: ``AITER_MLA_MEASURE_TIMEOUT_S`` (more than 0, at most 900),
    default 300."""
    _, _, _, numbers = _runtime()
    raw = environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    return numbers.duration(TIMEOUT_ENV, raw, MAX_TIMEOUT_S)


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
    for line in output.stdout.splitlines():
        if not line.startswith(measure_child.LINE):
            continue  # the kernels' own output
        try:
            data = files.json_value(line[len(measure_child.LINE):], "the measurement child's report")
            if isinstance(data, dict) and "begin" in data:
                running = (str(data["begin"][0]), int(data["begin"][1]))
            elif isinstance(data, dict) and "done" in data:
                task = (str(data["done"][0]), int(data["done"][1]))
                done[task] = measure.measured_from(data["measured"])
                running = None
        except (ValueError, TypeError, KeyError, IndexError):
            continue  # a line cut short where the child was killed
    said = _last_line(output.stderr)
    said = f": {said}" if said else ""
    if output.error:
        how = f"could not be started ({output.error})"
        return ChildEnd(done, running, measure.Measured(measure.Outcome.ENDED, math.nan, math.nan,
                                                        f"the measurement child {how}"))
    if output.timed_out:
        return ChildEnd(done, running, measure.Measured(
            measure.Outcome.TIMED_OUT, math.nan, math.nan,
            f"the measurement child passed {TIMEOUT_ENV}={timeout_s:g} s and was killed"))
    if output.returncode == 0:
        return ChildEnd(done, running, None)
    code = output.returncode
    how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
    return ChildEnd(done, running, measure.Measured(measure.Outcome.ENDED, math.nan, math.nan,
                                                    f"the measurement child was {how}{said}"))


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
    while remaining:
        argv = measure_child.command(factory, calls, remaining, splits, device)
        end = child_end(run_child(argv, timeout_s), timeout_s)
        found.update((task, m) for task, m in end.done.items() if task in remaining)
        remaining = [task for task in remaining if task not in found]
        if not remaining:
            break
        failure = end.failure or measure.Measured(measure.Outcome.ENDED, math.nan, math.nan,
                                                  "the measurement child ended without measuring it")
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


def _failed(calls: Sequence[measure.DecodeCall], exc: Exception) -> dict[Task, measure.Measured]:
    m = measure.Measured(measure.Outcome.RAISED, math.nan, math.nan, f"the first measurement: {measure.one_line(exc)}")
    return {(kind, call.qlen): m for kind in KINDS for call in calls}


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
    m = measure.Measured(measure.Outcome.NOT_MEASURED, math.nan, math.nan, "left to the server's process")
    return {(kind, call.qlen): m for kind in KINDS for call in calls}


def measure_layer(kernels, triton, calls: Sequence[measure.DecodeCall], splits: int, device: torch.device,
                  factory: str = measure_child.PRODUCTION, group=None, cache: torch.Tensor | None = None,
                  environ: Mapping[str, str] = os.environ) -> LayerResult:
    """The layer's calls measured crash-safely (first in a child or from its record, then here where
    that found them served) and agreed across ``group`` in one exchange. ``kernels``/``triton``: this
    process's (what serves; ``triton`` None where it could not be loaded); ``factory``: how the child
    loads its own (``measure_child.PRODUCTION`` in a server)."""
    calls = list(calls)
    try:
        in_child = needs_child(factory, device, environ)
        first, source = (first_measurement(factory, calls, splits, device, records_setting(environ),
                                           timeout_setting(environ)) if in_child else (_unmeasured(calls), IN_PROCESS))
    except Exception as exc:  # noqa: BLE001  (an outcome: the exchange below must happen on every rank)
        in_child, first, source = True, _failed(calls, exc), f"not made ({measure.one_line(exc)})"
    aiter_at = [c.qlen for c in calls if not in_child or first["aiter", c.qlen].outcome.served]
    remedy_at = [c.qlen for c in calls if not in_child or first["triton", c.qlen].outcome is measure.Outcome.CORRECT]
    here, remedied_here, seconds = measure.measure_both(kernels, triton, calls, device, cache=cache,
                                                        aiter_at=aiter_at, remedy_at=remedy_at)
    measured = {c.qlen: here.get(c.qlen, first["aiter", c.qlen]) for c in calls}
    remedied = {c.qlen: remedied_here.get(c.qlen, first["triton", c.qlen]) for c in calls}
    flags = measure.agree_flags(measure.local_flags(measured, remedied), (c.qlen for c in calls), group)
    return LayerResult(measured, remedied, seconds, flags, source)


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
    served, the remedy's where ``remedied`` has them correct (a task found not served never runs: it may
    have ended the measurement child); these outcomes replace those. The rows written hold what they held
    before once this returns (at a first eager step they may hold a request's keys). Where the keys cannot
    go to the cache, the given outcomes stand and ``cache`` of the result says why. One
    ``measure.agree_flags`` exchange across ``group`` whatever happened."""
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
                here, remedied_here, seconds = measure.measure_both(
                    kernels, triton, calls, cache.device, cache=cache,
                    aiter_at=[q for q, m in measured.items() if m.outcome.served],
                    remedy_at=[q for q, m in remedied.items() if m.outcome is measure.Outcome.CORRECT])
            finally:
                written.copy_(saved)
            measured.update(here)
            remedied.update(remedied_here)
            where = describe_cache(cache, rows)
    except Exception as exc:  # noqa: BLE001  (an outcome: the exchange below must happen on every rank)
        failed = measure.Measured(measure.Outcome.RAISED, math.nan, math.nan,
                                  f"measuring on the layer's KV cache: {measure.one_line(exc)}")
        measured = {q: failed if m.outcome.served else m for q, m in measured.items()}
        remedied = {q: failed if m.outcome is measure.Outcome.CORRECT else m for q, m in remedied.items()}
        where = f"the layer's KV cache ({measure.one_line(exc)})"
    flags = measure.agree_flags(measure.local_flags(measured, remedied), (c.qlen for c in calls), group)
    return LayerResult(measured, remedied, seconds, flags, "", where)
