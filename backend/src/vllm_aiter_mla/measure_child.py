"""The measurement child: a process of its own that measures a layer's decode calls, so that a call
that aborts the process, faults the GPU or hangs ends this child, not the server (``crash_safe``
starts it and reads what it reports).

    python -m vllm_aiter_mla.measure_child --factory MODULE:FUNCTION --device cuda:0 --splits 4 \\
        --call HEADS,QLEN,Q_DTYPE,KV_DTYPE,OUT_DTYPE,PERSISTENT ... --task KIND:QLEN ... [--no-warm]

It loads the kernels through the factory (``PRODUCTION``, ``upstream_kernels.production``: AITER's
kernels as ``kernels.load_kernels`` loads them, vLLM's Triton decode as
``upstream_kernels.load_triton_decode`` does; a test names a stand-in of its own), then measures
each task, a kernel (``aiter`` or ``triton``) at a query length, in the order given, each as the
server measures it (``measure.prepare`` and ``measure.measure``: one probe per call, shared by both
kernels). On a GPU it first compiles the remedy's Triton kernels for all its tasks side by side, one
thread a task, launching nothing (``warm_up``: Triton compiles in parallel that way, and they are most
of a first measurement), between ``LINE {"warm": [...]}`` and ``LINE {"warmed": [...]}``; ``--no-warm``
leaves that out. Before each task it prints ``LINE {"begin": [kind, qlen]}`` and after it ``LINE {"done":
[kind, qlen], "measured": ...}`` (``measure.measured_data``), each line flushed at once, so that
whatever ends the child, the tasks it finished and the one it was in are known. Everything else it
prints is the kernels' own output. Once its reports are out it ends at once (``end``: no interpreter
teardown for the parent to wait for).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

import torch

from . import measure
from .kernels import MLAKernels
from .remedy import TritonDecode

# the kernels a server measures (named, not imported: the measurement itself reads nothing of vLLM)
PRODUCTION = "vllm_aiter_mla.upstream_kernels:production"
LINE = "AITER_MLA_MEASURED "  # the start of each line the parent reads
KINDS = ("aiter", "triton")

Task = tuple[str, int]  # (kind, query length)
Factory = Callable[[str, int], "MLAKernels | TritonDecode"]


def factory_of(name: str) -> Factory:
    """The function ``MODULE:FUNCTION`` names."""
    module, _, function = name.partition(":")
    if not module or not function:
        raise ValueError(f"a kernel factory is named MODULE:FUNCTION, not {name!r}")
    return getattr(importlib.import_module(module), function)


def call_text(call: measure.DecodeCall) -> str:
    return ",".join([str(call.heads), str(call.qlen), *(measure.dtype_name(d) for d in
                                                        (call.q_dtype, call.kv_dtype, call.out_dtype)),
                     str(int(call.persistent))])


def call_from(text: str) -> measure.DecodeCall:
    parts = text.split(",")
    if len(parts) != 6 or not all(p.isascii() and p.isdigit() and len(p) <= 4 for p in (*parts[:2], parts[5])):
        raise ValueError(f"a call is HEADS,QLEN,Q_DTYPE,KV_DTYPE,OUT_DTYPE,PERSISTENT, not {text!r}")
    dtypes = [getattr(torch, name, None) for name in parts[2:5]]
    if not all(isinstance(d, torch.dtype) for d in dtypes):
        raise ValueError(f"unknown dtype in {text!r}")
    return measure.DecodeCall(int(parts[0]), int(parts[1]), *dtypes, persistent=parts[5] == "1")


def task_from(text: str) -> Task:
    kind, _, qlen = text.partition(":")
    if kind not in KINDS or not (qlen.isascii() and qlen.isdigit() and len(qlen) <= 4):
        raise ValueError(f"a task is KIND:QLEN with KIND one of {', '.join(KINDS)}, not {text!r}")
    return kind, int(qlen)


def command(factory: str, calls: Sequence[measure.DecodeCall], tasks: Sequence[Task], splits: int,
            device: torch.device | str, warm: bool = True) -> list[str]:
    """The child's command line: this Python, this module. ``warm``: the remedy's Triton kernels compiled
    side by side first (``warm_up``)."""
    argv = [sys.executable, "-m", __name__, "--factory", factory, "--device", str(device), "--splits", str(splits)]
    if not warm:
        argv.append("--no-warm")
    for call in calls:
        argv += ["--call", call_text(call)]
    for kind, qlen in tasks:
        argv += ["--task", f"{kind}:{qlen}"]
    return argv


def _kept(made: dict, key, make: Callable[[], object]):
    """``make()`` once per ``key``; what it raised is kept instead (kernels that cannot be loaded or a probe
    that cannot be made: measured as raising)."""
    if key not in made:
        try:
            made[key] = make()
        except Exception as exc:  # noqa: BLE001  (measured as raising: nothing it made serves)
            made[key] = exc
    return made[key]


@contextlib.contextmanager
def triton_compile_only() -> Iterator[bool]:
    """For the length of the block, every Triton kernel launch (``kernel[grid](...)``) in this process
    compiles the kernel for its arguments and launches nothing (Triton's own ``warmup``); yields whether
    that could be arranged (False: no Triton, or one without that interface)."""
    try:
        from triton.runtime.jit import KernelInterface  # noqa: PLC0415
    except ImportError:
        yield False
        return
    launch = KernelInterface.__dict__.get("__getitem__")
    if launch is None or "warmup" not in inspect.signature(KernelInterface.run).parameters:
        yield False
        return

    def compile_only(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=True, **kwargs)

    KernelInterface.__getitem__ = compile_only
    try:
        yield True
    finally:
        KernelInterface.__getitem__ = launch


def warm_up(remedy: TritonDecode, probes: Sequence[measure.Probe]) -> bool:
    """The remedy's Triton kernels for each probe compiled side by side, one thread a probe (Triton's
    compiles run in parallel that way; in sequence they are most of a first measurement), launching
    nothing: no kernel runs before its measurement, whose first call stays its first. Whether it could
    be done (``triton_compile_only``). A call that raises here raises again when measured."""
    with triton_compile_only() as compiling:
        if not compiling:
            return False
        threads = [threading.Thread(target=_compile, args=(remedy, probe), daemon=True) for probe in probes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return True


def _compile(remedy: TritonDecode, probe: measure.Probe) -> None:
    with contextlib.suppress(Exception):  # measured (as raising) in its turn
        measure.run_probe(remedy, probe, runs=(0,))


def run_tasks(factory: Factory, calls: Sequence[measure.DecodeCall], tasks: Sequence[Task], splits: int,
              device: torch.device | str, report: Callable[[dict], None], warm: bool = True) -> None:
    """Measure each task in order, reporting its beginning and its outcome. A kernel that cannot be
    loaded, a probe that cannot be made and a call that raises are outcomes (``raised``). ``warm``: on
    a GPU, the remedy's kernels for its tasks are first compiled side by side (``warm_up``), between a
    ``warm`` and a ``warmed`` report (where the child ends in between, the parent measures those tasks
    again in a child that does not warm up)."""
    by_qlen = {call.qlen: call for call in calls}
    loaded: dict[str, MLAKernels | TritonDecode | Exception] = {}
    probes: dict[int, measure.Probe | Exception] = {}
    remedy_tasks = [(kind, qlen) for kind, qlen in tasks if kind == "triton"]
    if warm and torch.device(device).type == "cuda" and len(remedy_tasks) > 1:
        report({"warm": [list(task) for task in remedy_tasks]})
        remedy = _kept(loaded, "triton", lambda: factory("triton", splits))
        ready = [_kept(probes, q, lambda: measure.prepare(by_qlen[q], device)) for _, q in remedy_tasks]
        if isinstance(remedy, TritonDecode):
            warm_up(remedy, [p for p in ready if not isinstance(p, Exception)])
        report({"warmed": [list(task) for task in remedy_tasks]})
    for kind, qlen in tasks:
        report({"begin": [kind, qlen]})
        call = by_qlen[qlen]
        kernels = _kept(loaded, kind, lambda: factory(kind, splits))
        probe = _kept(probes, qlen, lambda: measure.prepare(call, device))
        if isinstance(kernels, Exception):
            found = measure.Measured(measure.Outcome.RAISED, math.nan, math.nan,
                                     f"loading it: {measure.one_line(kernels)}")
        elif isinstance(probe, Exception):
            found = measure.Measured(measure.Outcome.RAISED, math.nan, math.nan,
                                     f"making the probe: {measure.one_line(probe)}")
        else:
            found = measure.measure(kernels, call, device, probe=probe)
        report({"done": [kind, qlen], "measured": measure.measured_data(found)})


def _print(data: dict) -> None:
    print(LINE + json.dumps(data, separators=(",", ":")), flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The child's options (``command`` writes them)."""
    parser = argparse.ArgumentParser(prog="python -m vllm_aiter_mla.measure_child",
                                     description="Measure a layer's decode calls (the server's measurement child).")
    parser.add_argument("--factory", required=True)
    parser.add_argument("--device", required=True, type=torch.device)
    parser.add_argument("--splits", type=int, required=True)
    parser.add_argument("--call", action="append", default=[], type=call_from)
    parser.add_argument("--task", action="append", default=[], type=task_from)
    parser.add_argument("--no-warm", dest="warm", action="store_false")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run_tasks(factory_of(args.factory), args.call, args.task, args.splits, device, _print, args.warm)
    return 0


def end(code: int) -> None:
    """End the child at once once its reports are out: no interpreter teardown (module finalisation,
    the GPU context's destruction, atexit handlers), which the parent would wait for and which reports
    nothing (about half a second on an NVIDIA H100)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    end(main())
