"""Kernel factories for the measurement child (``vllm_aiter_mla.measure_child``) in tests, named
``child_standins:NAME`` (this folder on the child's PYTHONPATH), each ``(kind, splits)`` -> kernels as
``upstream_kernels.production`` is: the reference kernel standing in for AITER, the remedy's CPU stand-in
(``remedy_standins``) for vLLM's Triton decode, and AITER's call at some query lengths replaced by one
that raises, aborts the process (``os.abort``: SIGABRT, as AITER's missing-kernel checks and a GPU
memory fault end it) or hangs.

``in_process`` runs a child's command in this process instead (the adapter tests, and the tests of what
the parent makes of a child's end): an abort or a hang there raises ``Died``, read back as the end a
real child would have had.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable

from rocm_vllm_runtime import children

from vllm_aiter_mla import measure, measure_child
from vllm_aiter_mla.kernels import load_kernels
from vllm_aiter_mla.remedy import TritonDecode

import remedy_standins

REFERENCE = load_kernels("reference")
HANG_S = 3600.0


class Died(BaseException):
    """An abort (``signum``) or a hang (``signum`` None) of a stand-in run in this process."""

    def __init__(self, signum: int | None) -> None:
        super().__init__(signum)
        self.signum = signum


def _abort() -> None:
    os.abort()


def _hang() -> None:
    time.sleep(HANG_S)


# What a stand-in does to end its process; ``in_process`` swaps them for raising Died.
END = {"abort": _abort, "hang": _hang}


def aiter_with(ends: dict[int, str]):
    """The reference kernel, but at each query length of ``ends``: "raise" (a RuntimeError, as AITER's
    Python checks), "abort" or "hang"."""
    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q, **kw):
        how = ends.get(max_seqlen_q)
        if how == "raise":
            raise RuntimeError(f"AITER: no kernel for query length {max_seqlen_q}")
        if how in END:
            END[how]()
        return REFERENCE.mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                                        max_seqlen_q, **kw)

    return dataclasses.replace(REFERENCE, name=f"reference with {ends}", mla_decode_fwd=mla_decode_fwd)


def remedy_with(ends: dict[int, str], splits: int) -> TritonDecode:
    """The remedy's CPU stand-in, but ending its process at each query length of ``ends`` (the number of
    rows a request has, read from the call)."""
    right = remedy_standins.triton_standin(splits=splits)

    def wrap(function: Callable) -> Callable:
        def call(q, k_buffer, v_buffer, o, lse, table, lens, *args, **kw):
            qlen = q.shape[0] // 6  # the probe's six requests
            if ends.get(qlen) in END:
                END[ends[qlen]]()
            return function(q, k_buffer, v_buffer, o, lse, table, lens, *args, **kw)
        return call

    return dataclasses.replace(right, decode_attention_fwd=wrap(right.decode_attention_fwd),
                               decode_attention_fwd_verify=wrap(right.decode_attention_fwd_verify))


def right(kind: str, splits: int):
    return REFERENCE if kind == "aiter" else remedy_standins.triton_standin(splits=splits)


def raises_2_aborts_3(kind: str, splits: int):
    """AITER right at query length 1, raising at 2, aborting the process at 3; the remedy right."""
    return aiter_with({2: "raise", 3: "abort"}) if kind == "aiter" else right(kind, splits)


def raises_1_aborts_2(kind: str, splits: int):
    return aiter_with({1: "raise", 2: "abort"}) if kind == "aiter" else right(kind, splits)


def hangs_2(kind: str, splits: int):
    """AITER right at query length 1, hanging at 2; the remedy right."""
    return aiter_with({2: "hang"}) if kind == "aiter" else right(kind, splits)


def remedy_aborts_1_aiter_hangs_2(kind: str, splits: int):
    return aiter_with({2: "hang"}) if kind == "aiter" else remedy_with({1: "abort"}, splits)


def unloadable(kind: str, splits: int):
    if kind == "aiter":
        raise RuntimeError("import aiter failed")
    return right(kind, splits)


def all_served():
    """A stand-in for ``crash_safe.run_child`` whose child finds every call it is given right (measured
    nothing unsafe): the server's own measurement then decides each call."""
    right = measure.Measured(measure.Outcome.CORRECT, 0.0, 0.0, "", 1.0, 0.0, 0.0, 0.0)

    def run(argv, timeout_s):
        tasks = measure_child.parse_args(list(argv)[3:]).task
        return children.Output("".join(measure_child.LINE + json.dumps({"done": list(task), "measured":
                                                                        measure.measured_data(right)}) + "\n"
                                       for task in tasks), "", 0)

    return run


def in_process(factory: Callable | None = None, stderr: str = ""):
    """A stand-in for ``crash_safe.run_child``: the child's command run by this process (``factory``
    instead of the one it names, where given), its end as a ``children.Output``."""
    def run(argv, timeout_s):
        args = measure_child.parse_args(list(argv)[3:])
        lines: list[str] = []
        ends = dict(END)

        def died(signum):
            def end():
                raise Died(signum)
            return end

        END.update(abort=died(signal.SIGABRT), hang=died(None))
        try:
            measure_child.run_tasks(factory or measure_child.factory_of(args.factory), args.call, args.task,
                                    args.splits, args.device,
                                    lambda data: lines.append(measure_child.LINE + json.dumps(data)))
            code, timed_out = 0, False
        except Died as exc:
            code, timed_out = (None, True) if exc.signum is None else (-exc.signum, False)
        finally:
            END.update(ends)
        return children.Output("\n".join(lines) + "\n", stderr, code, timed_out)

    return run
