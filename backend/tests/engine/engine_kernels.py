"""Kernel sets for engine runs (tests only): what stands in for AITER's decode and for vLLM's Triton
MLA decode (the remedy) inside vLLM's CPU engine.

A set is chosen by the engine driver for one engine (``install``: this package's adapter loads its
kernels through ``load_kernels`` and ``load_triton_decode``, swapped here in the process that builds
the engine, and swapped back after it) or, in the worker processes of a tensor-parallel engine, by
``tests/fake_amx/sitecustomize.py`` from ``ROCM_VLLM_TEST_KERNELS`` (one set per rank, ``|`` between
them). Nothing in the plugin reads a setting for it: a production server cannot select a stand-in.

Sets:

* ``aiter-x0.97``: AITER's call a uniform x0.97 (the reference kernel's output scaled: a defect the
  measurement's least-squares scale bound catches), the remedy right (``remedy_standins``' CPU stand-in
  of vLLM's Triton functions, computing densely); the remedy must serve.
* ``both-x0.97``: AITER's call and the remedy both x0.97: nothing serves, the engine must refuse.
* ``aborts``, ``raises``, ``hangs``: AITER's call ends the measurement child by SIGABRT, raises a
  BaseException (which ends the child with a traceback) or hangs; the remedy right. These are measured
  first in a child (``child_factory`` names ``factory``), as AITER's kernels are in a server.

The remedy stand-in counts its calls (``remedy_calls``), so a test sees it served the engine's steps.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKEND_TESTS = HERE.parent  # measure_standins, remedy_standins
if str(BACKEND_TESTS) not in sys.path:
    sys.path.insert(0, str(BACKEND_TESTS))

SETS = ("aiter-x0.97", "both-x0.97", "aborts", "raises", "hangs")
IN_CHILD = ("aborts", "raises", "hangs")  # AITER's call could end the server: measured first in a child
ENV = "ROCM_VLLM_TEST_KERNELS"
WRONG_FACTOR = 0.97
HANG_S = 3600.0

_remedy_calls = 0
_lines: list[str] = []  # a worker's start-up lines (install_by_rank)


def remedy_calls() -> int:
    """Calls the remedy stand-in served in this process so far (the measurement's included)."""
    return _remedy_calls


def rank_report(worker=None) -> dict:
    """What a worker of a tensor-parallel engine did (run there by ``collective_rpc``): its rank's
    start-up lines and the remedy stand-in's calls."""
    from vllm.distributed import parallel_state

    return {"rank": parallel_state.get_tensor_model_parallel_rank(), "lines": list(_lines),
            "remedy_calls": _remedy_calls}


class KernelDied(BaseException):
    """What the ``raises`` set's AITER call raises: not an Exception, so nothing on the way catches it."""


def _aiter(name: str):
    import measure_standins

    reference = measure_standins.REFERENCE
    if name in ("aiter-x0.97", "both-x0.97"):
        wrong = measure_standins.scaled(WRONG_FACTOR)
        return dataclasses.replace(wrong, name=f"reference x{WRONG_FACTOR} (a wrong stand-in)")

    def ends(*args, **kwargs):
        if name == "aborts":
            os.abort()
        if name == "hangs":
            time.sleep(HANG_S)
        raise KernelDied("the AITER stand-in raised a BaseException")

    return dataclasses.replace(reference, name=f"reference that {name[:-1]} (a stand-in)", mla_decode_fwd=ends)


def _remedy(name: str, splits: int):
    import remedy_standins

    triton = remedy_standins.triton_standin(WRONG_FACTOR if name == "both-x0.97" else 1.0, splits=splits)

    def counted(function: Callable) -> Callable:
        def call(*args, **kwargs):
            global _remedy_calls
            _remedy_calls += 1
            return function(*args, **kwargs)
        return call

    return dataclasses.replace(triton, decode_attention_fwd=counted(triton.decode_attention_fwd),
                               decode_attention_fwd_verify=counted(triton.decode_attention_fwd_verify))


def _check(name: str) -> None:
    if name not in SETS:
        raise ValueError(f"{ENV}: kernel set {name!r} is not one of {', '.join(SETS)}")


def factory(name: str) -> Callable[[str, int], object]:
    """``(kind, splits) -> kernels`` of set ``name``, as ``upstream_kernels.production`` is."""
    _check(name)
    return lambda kind, splits: _aiter(name) if kind == "aiter" else _remedy(name, splits)


# The measurement child loads a factory by MODULE:FUNCTION: one function per set that runs there.
def aborts(kind: str, splits: int):
    return factory("aborts")(kind, splits)


def raises(kind: str, splits: int):
    return factory("raises")(kind, splits)


def hangs(kind: str, splits: int):
    return factory("hangs")(kind, splits)


def child_factory(name: str) -> str | None:
    """The measurement child's factory for set ``name`` (None: measured in the engine's process only,
    as in CPU development mode)."""
    return f"{__name__}:{name}" if name in IN_CHILD else None


def install(name: str) -> Callable[[], None]:
    """Set ``name``'s kernels in this process's adapter (and, for a set measured in a child, the child's
    factory). Returns what restores the adapter's own."""
    _check(name)
    import functools

    from vllm_aiter_mla import backend, crash_safe, measure_state

    aiter = _aiter(name)  # one object per engine: the adapter keys its measurement by the kernels
    remedies: dict[int, object] = {}

    def load_triton_decode(splits: int):
        return remedies.setdefault(splits, _remedy(name, splits))

    loaders = (backend, measure_state)  # the adapters' loads and the start-up measurement's
    real = [(m.load_kernels, m.load_triton_decode) for m in loaders], crash_safe.measure_layer
    for module in loaders:
        module.load_kernels = lambda mode=None: aiter
        module.load_triton_decode = load_triton_decode
    in_child = child_factory(name)
    if in_child:
        crash_safe.measure_layer = functools.partial(real[1], factory=in_child)

    def undo() -> None:
        for module, (kernels, triton) in zip(loaders, real[0]):
            module.load_kernels, module.load_triton_decode = kernels, triton
        crash_safe.measure_layer = real[1]

    return undo


def install_by_rank(value: str) -> None:
    """``ROCM_VLLM_TEST_KERNELS``'s sets (``a|b``: rank 0 a, rank 1 b; one name: every rank), installed
    in this process once its tensor-parallel rank is known: at the adapter's first kernel load, which
    comes after vLLM set up the group (the model's layers are built then)."""
    names = value.split("|")
    for name in names:
        _check(name)
    import logging

    from vllm_aiter_mla import backend, measure_state

    logger = logging.getLogger("vllm.aiter_mla")  # this process's start-up lines, for rank_report
    real_handle = logger.handle

    def handle(record):
        if record.levelno >= logging.INFO:
            _lines.append(record.getMessage())
        return real_handle(record)

    logger.handle = handle

    def first_load(attr: str) -> Callable:
        def load(*args, **kwargs):
            from vllm.distributed import parallel_state

            rank = parallel_state.get_tensor_model_parallel_rank()
            name = names[min(rank, len(names) - 1)]
            install(name)
            print(f"{ENV}: kernel set {name} installed on rank {rank} (pid {os.getpid()})", file=sys.stderr,
                  flush=True)
            return getattr(backend, attr)(*args, **kwargs)
        return load

    for module in (backend, measure_state):  # whichever loads first installs the set in both
        module.load_kernels = first_load("load_kernels")
        module.load_triton_decode = first_load("load_triton_decode")
