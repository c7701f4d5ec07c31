"""backend/bench/planning.py's comparison with vLLM's built-in ROCM_AITER_MLA decode planning:
the bench finds the built-in's step in every release track's vLLM source (the kernel its
_build_decode launches, the fill of its page-index buffer, slot ids); on the CPU, in Triton's
interpreter, every track's built-in plans equal ours (padding rows at query length 1 and of a
padded multi-token batch included); and a built-in kernel that writes one slot wrong, or a
source without the step, fails the bench."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sdist import sdist_source, track_names
from vllm_sdist import versions as pinned_versions

pytest.importorskip("triton", reason="Triton is not installed (tests/requirements.lock installs it)")

BACKEND = Path(__file__).resolve().parents[1]
BENCH = BACKEND / "bench" / "planning.py"
# Small batches (a few seconds each in the interpreter): a grouped launch at query length 1, the
# padding rows at query length 1 (the built-in plans them 0 keys), a multi-token batch, and a
# padded multi-token batch (the built-in gives its padding rows the query length).
CASES = "64 x 4k,4096 padding rows,256 x 4k,60 random 3..2k + 4 padding rows"


def bench(*args: str) -> subprocess.CompletedProcess:
    path = [str(BACKEND / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(BENCH), "--check-only", *args], env=env, capture_output=True,
                          text=True, timeout=600)


@functools.cache
def builtin_planner():
    spec = importlib.util.spec_from_file_location("builtin_planner", BENCH.with_name("builtin_planner.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("track", track_names())
def test_the_builtin_step_is_found_in_each_track(track):
    found = builtin_planner().load(sdist_source(track))
    assert found.label == f"vLLM {pinned_versions()['tracks'][track]['vllm']['version']}"
    assert found.fills, "the built-in no longer fills its page-index buffer: the bench's columns say it does"
    assert "KERNEL_BLOCK_SIZE" in found.params and found.chunk > 0
    assert callable(getattr(found.kernel, "run", None))


def test_every_track_plans_as_ours_in_the_interpreter():
    sources = [str(sdist_source(track)) for track in track_names()]
    run = bench(*(arg for src in sources for arg in ("--vllm-source", src)), "--only", CASES)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"all plans equal (4 batches, {len(sources)} built-in)" in run.stdout, run.stdout
    assert "* padding rows at query length 1" in run.stdout


FAKE_RELEASE = '''
import triton
import triton.language as tl


class AiterMLAMetadataBuilder:
    def _build_decode(self, block_table, kv_indptr):
        self.paged_kv_indices.fill_(-1)
        _expand[(block_table.shape[0], 8)](self.paged_kv_indices, block_table, block_table.stride(0),
                                           block_table.stride(1), kv_indptr, KERNEL_BLOCK_SIZE=16, BLOCK_SIZE=512)


@triton.jit
def _expand(page_indices, block_table, block_table_stride_0, block_table_stride_1, cu_num_tokens,
            KERNEL_BLOCK_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    req = tl.program_id(0)
    start = tl.load(cu_num_tokens + req)
    count = tl.load(cu_num_tokens + req + 1) - start
    t = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    keep = t < count
    row = block_table + req * block_table_stride_0
    block = tl.load(row + (t // KERNEL_BLOCK_SIZE) * block_table_stride_1, mask=keep)
    tl.store(page_indices + start + t, block * KERNEL_BLOCK_SIZE + t % KERNEL_BLOCK_SIZE + OFF_BY, mask=keep)
'''


def fake_release(folder: Path, off_by: str) -> Path:
    """An sdist-shaped folder of release 9.9.9 whose step is FAKE_RELEASE, with ``off_by`` added
    to the slots it writes."""
    source = folder / "vllm-9.9.9" / "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
    source.parent.mkdir(parents=True)
    source.write_text(FAKE_RELEASE.replace("OFF_BY", off_by))
    (folder / "vllm-9.9.9" / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: vllm\nVersion: 9.9.9\n")
    return source.parents[5]


@pytest.mark.parametrize(("off_by", "status", "said"), [
    ("0", 0, "all plans equal (1 batches, 1 built-in)"),
    ("(t == count - 1).to(tl.int32)", 1, "64 x 4k: plans differ: ['vLLM 9.9.9: kv_indices']"),
])
def test_a_builtin_writing_a_wrong_slot_fails_the_bench(tmp_path, off_by, status, said):
    run = bench("--vllm-source", str(fake_release(tmp_path, off_by)), "--only", "64 x 4k")
    assert run.returncode == status, run.stdout + run.stderr
    assert said in run.stdout, run.stdout


def test_a_source_without_the_step_is_refused(tmp_path):
    source = tmp_path / "rocm_aiter_mla.py"
    source.write_text("class AiterMLAMetadataBuilder:\n    pass\n")
    run = bench("--vllm-source", str(source))
    assert run.returncode == 2
    assert "no AiterMLAMetadataBuilder._build_decode" in run.stderr
