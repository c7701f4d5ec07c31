"""What the start-up measurement pays once per start outside the measurement itself: the measurement
child ends as soon as its reports are out (no interpreter teardown to wait for), and a record's
builds are read without scanning every installed distribution where AITER is found by its wheel's
name or cannot be imported at all."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path

import child_standins
import pytest
import torch
from rocm_vllm_runtime import children, distributions

import vllm_aiter_mla
from vllm_aiter_mla import crash_safe, measure, measure_child, measurement_record
from vllm_aiter_mla.remedy import TritonDecode

HERE = Path(__file__).resolve().parent
TEARDOWN = "TEARDOWN RAN"


def teardown_marked(kind: str, splits: int):
    """child_standins.right, and a handler that prints ``TEARDOWN`` when the interpreter tears down."""
    atexit.register(print, TEARDOWN, flush=True)
    return child_standins.right(kind, splits)


def test_the_child_ends_once_its_reports_are_out(monkeypatch):
    roots = [Path(vllm_aiter_mla.__file__).parents[1], Path(children.__file__).parents[1], HERE]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(str(p) for p in roots))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    call = measure.DecodeCall(16, 1, torch.bfloat16, torch.bfloat16)
    argv = measure_child.command(f"{Path(__file__).stem}:teardown_marked", [call], [("aiter", 1)], 4, "cpu")
    out = crash_safe.run_child(argv, 120.0)
    end = crash_safe.child_end(out, 120.0)
    assert out.returncode == 0 and end.failure is None, out.stderr[-2000:]
    assert end.done["aiter", 1].outcome is measure.Outcome.CORRECT
    assert TEARDOWN not in out.stdout  # ended without tearing the interpreter down


@pytest.fixture
def fresh_builds():
    measurement_record.builds.cache_clear()
    yield
    measurement_record.builds.cache_clear()


def _no_scan():
    raise AssertionError("every installed distribution was scanned for the aiter package")


def test_aiter_found_by_its_wheel_name_needs_no_scan(monkeypatch, fresh_builds):
    real = distributions.build_of
    monkeypatch.setattr(distributions, "build_of",
                        lambda *names: "amd-aiter 0.1.9 0123456789abcdef" if "amd-aiter" in names else real(*names))
    monkeypatch.setattr(distributions, "providers_of", lambda name: _no_scan())
    assert measurement_record.builds()["aiter"] == "amd-aiter 0.1.9 0123456789abcdef"


def test_aiter_that_cannot_be_imported_needs_no_scan(monkeypatch, fresh_builds):
    real = distributions.build_of
    monkeypatch.setattr(distributions, "build_of",
                        lambda *names: None if set(names) & {"amd-aiter", "aiter"} else real(*names))
    monkeypatch.setattr(distributions, "providers_of", lambda name: _no_scan())
    monkeypatch.setitem(sys.modules, "aiter", None)  # not importable here, whatever is installed
    assert measurement_record.builds()["aiter"] == "not installed"


def test_aiter_under_another_wheel_name_is_found_by_the_scan(monkeypatch, fresh_builds, tmp_path):
    (tmp_path / "aiter").mkdir()
    (tmp_path / "aiter" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    real = distributions.build_of
    monkeypatch.setattr(distributions, "build_of", lambda *names: (
        None if set(names) & {"amd-aiter", "aiter"} else "rocm-aiter 2.0 fedcba9876543210" if names == ("rocm-aiter",)
        else real(*names)))
    monkeypatch.setattr(distributions, "providers_of", lambda name: ["rocm-aiter"] if name == "aiter" else [])
    assert measurement_record.builds()["aiter"] == "rocm-aiter 2.0 fedcba9876543210"


# ---- the measurement child compiles the remedy's Triton kernels side by side, launching nothing ----


def test_the_remedys_kernels_are_compiled_side_by_side_and_nothing_is_launched():
    from triton.runtime.jit import KernelInterface

    seen: list[tuple[bool, int]] = []

    class Kernel(KernelInterface):
        def run(self, *args, grid, warmup, **kwargs):
            seen.append((warmup, threading.get_ident()))
            time.sleep(0.2)  # a compile: each thread waits here at the same time

    kernel = Kernel()

    def decode(q, k_buffer, v_buffer, o, *args, **kwargs):
        kernel[(1,)](q, o)

    remedy = TritonDecode("a Triton stand-in", decode, decode, 4)
    probes = [measure.prepare(measure.DecodeCall(16, qlen, torch.bfloat16, torch.bfloat16), "cpu")
              for qlen in (1, 2, 3)]
    assert measure_child.warm_up(remedy, probes)
    assert len(seen) == 3 and all(warmup for warmup, _ in seen), seen  # compiled, never launched
    assert len({thread for _, thread in seen}) == 3, seen  # one thread a probe
    seen.clear()
    kernel[(1,)](None, None)
    assert seen[0][0] is False  # launches launch again after it
