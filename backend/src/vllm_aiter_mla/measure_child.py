"""The measurement child: a process of its own that measures a layer's decode calls, so that a call
that aborts the process, faults the GPU or hangs ends this child, not the server (``crash_safe``
starts it and reads what it reports).

    python -m vllm_aiter_mla.measure_child --factory MODULE:FUNCTION --device cuda:0 --splits 4 \\
        --call HEADS,QLEN,Q_DTYPE,KV_DTYPE,OUT_DTYPE,PERSISTENT ... --task KIND:QLEN ...

It loads the kernels through the factory (``PRODUCTION``, ``upstream_kernels.production``: AITER's
kernels as ``kernels.load_kernels`` loads them, vLLM's Triton decode as
``upstream_kernels.load_triton_decode`` does; a test names a stand-in of its own), then measures
each task, a kernel (``aiter`` or ``triton``) at a query length, in the order given, each as the
server measures it (``measure.prepare`` and ``measure.measure``: one probe per call, shared by both
kernels). Before each task it prints ``LINE {"begin": [kind, qlen]}`` and after it ``LINE {"done":
[kind, qlen], "measured": ...}`` (``measure.measured_data``), each line flushed at once, so that
whatever ends the child, the tasks it finished and the one it was in are known. Everything else it
prints is the kernels' own output. Once its reports are out it ends at once (``end``: no interpreter
teardown for the parent to wait for).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Sequence

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
            device: torch.device | str) -> list[str]:
    """The child's command line: this Python, this module."""
    argv = [sys.executable, "-m", __name__, "--factory", factory, "--device", str(device), "--splits", str(splits)]
    for call in calls:
        argv += ["--call", call_text(call)]
    for kind, qlen in tasks:
        argv += ["--task", f"{kind}:{qlen}"]
    return argv


def run_tasks(factory: Factory, calls: Sequence[measure.DecodeCall], tasks: Sequence[Task], splits: int,
              device: torch.device | str, report: Callable[[dict], None]) -> None:
    """Measure each task in order, reporting its beginning and its outcome. A kernel that cannot be
    loaded, a probe that cannot be made and a call that raises are outcomes (``raised``)."""
    by_qlen = {call.qlen: call for call in calls}
    loaded: dict[str, MLAKernels | TritonDecode | Exception] = {}
    probes: dict[int, measure.Probe | Exception] = {}
    for kind, qlen in tasks:
        report({"begin": [kind, qlen]})
        call = by_qlen[qlen]
        if kind not in loaded:
            try:
                loaded[kind] = factory(kind, splits)
            except Exception as exc:  # noqa: BLE001  (measured as raising: nothing it loads serves)
                loaded[kind] = exc
        if qlen not in probes:
            try:
                probes[qlen] = measure.prepare(call, device)
            except Exception as exc:  # noqa: BLE001  (the probe itself cannot be made: nothing can be served)
                probes[qlen] = exc
        kernels, probe = loaded[kind], probes[qlen]
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
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run_tasks(factory_of(args.factory), args.call, args.task, args.splits, device, _print)
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
