"""The Triton planner's launch shapes, on the host (no GPU): warm_up() compiles the list
launch_shapes() gives, and every batch, whatever its size, lengths and max_seq_len hint, gets
a shape from that list, so no request waits for a compile."""
from __future__ import annotations

import random

import pytest

from vllm_aiter_mla import planning_triton as pt


@pytest.mark.parametrize("programs", [8, 1056, 2432])  # tiny grid, H200 (132 SMs), MI300X (304 CUs)
@pytest.mark.parametrize(("max_reqs", "max_len"), [(1, 16), (256, 8192), (1024, 131072), (4096, 163840)])
def test_every_batch_gets_a_shape_warm_up_compiles(programs, max_reqs, max_len):
    shapes = set(pt.launch_shapes(programs, max_reqs, max_len))
    rng = random.Random(f"{programs}-{max_reqs}-{max_len}")
    cases = [(n, longest) for n in range(1, min(max_reqs, 64) + 1) for longest in (None, 1, 2, 3, max_len)]
    for _ in range(20000):
        n = rng.randint(1, max_reqs)
        longest = rng.choice([None, rng.randint(1, max_len), rng.randint(1, min(max_len, 9000)),
                              2 ** rng.randint(0, max_len.bit_length() - 1)])
        cases.append((n, longest))
    missing = {pt.launch_shape_of(programs, n, longest)[:-1] for n, longest in cases} - shapes
    assert not missing, missing


def test_shapes_are_kernels_and_their_constants():
    shapes = pt.launch_shapes(1056, 1024, 131072)
    assert len(shapes) == len(set(shapes))
    for shape in shapes:
        kind, a, b, *rest = shape
        if kind == "rows":
            assert a & (a - 1) == 0 and a <= pt.MAX_REQS and b & (b - 1) == 0 and b <= pt.ROWS_MAX_COLS
        elif kind == "grouped":
            assert a & (a - 1) == 0 and a <= pt.MAX_GROUP and b & (b - 1) == 0 and b <= pt.MAX_CHUNK
        else:
            assert kind == "walk" and pt.MIN_BLOCK_T <= a <= pt.BLOCK_T and isinstance(b, bool)
            # groups of short requests: a power of two, at most WALK_MAX_GROUP (the direct search
            # has none)
            (group,) = rest
            assert group & (group - 1) == 0 and group <= pt.WALK_MAX_GROUP and (group == 1 or not b)
        if kind != "walk":
            assert not rest
    # the three kernels, and every tile size of the walk with and without the direct search
    assert {s[0] for s in shapes} == {"rows", "grouped", "walk"}
    tile_sizes = [pt.MIN_BLOCK_T << i for i in range((pt.BLOCK_T // pt.MIN_BLOCK_T).bit_length())]
    assert {s[1:3] for s in shapes if s[0] == "walk"} == {(t, d) for t in tile_sizes for d in (True, False)}


def test_walk_groups_cover_the_batch_in_one_round():
    # Where the walk runs on every program, each program plans at most one group of short
    # requests (H200: 1056 programs, MI300X: 2432; up to MAX_REQS requests).
    for programs in (1056, 2432):
        for num_reqs in (1, 17, 1000, 1057, 4096):
            for longest in (None, 20000, 163840):
                kind, block_t, direct, group, grid = pt.launch_shape_of(programs, num_reqs, longest)
                assert kind == "walk" and grid * group >= num_reqs


@pytest.mark.parametrize("programs", [8, 1056])
def test_rows_kernel_for_short_requests_only(programs):
    # Up to ROWS_MAX_LEN keys a request: the rows kernel, a program per group, every request
    # in a group, tiles of at most ROW_ELEMS pairs; longer requests or no hint: another kernel.
    for num_reqs in (1, 2, 17, 1000, 4096):
        for longest in (1, 2, 16, 300, 512, pt.ROWS_MAX_LEN):
            kind, group, cols, grid = pt.launch_shape_of(programs, num_reqs, longest)
            assert kind == "rows"
            assert cols >= min(longest, pt.ROWS_MAX_COLS) and group * cols <= max(pt.ROW_ELEMS, cols)
            assert grid * group >= num_reqs > (grid - 1) * group
        assert pt.launch_shape_of(programs, num_reqs, pt.ROWS_MAX_LEN + 1)[0] != "rows"
        assert pt.launch_shape_of(programs, num_reqs, None)[0] == "walk"


def test_warm_up_compiles_one_kernel_per_cpu_at_most_sixteen(monkeypatch):
    assert pt.compile_in_threads(), "the Triton the tests install compiles in threads (AsyncCompileMode)"
    monkeypatch.setattr(pt.os, "sched_getaffinity", lambda pid: set(range(128)))
    assert pt.compile_threads() == pt.WARM_UP_MAX_THREADS == 16
    monkeypatch.setattr(pt.os, "sched_getaffinity", lambda pid: {3, 5})
    assert pt.compile_threads() == 2
    monkeypatch.setattr(pt.os, "sched_getaffinity", lambda pid: {0})
    assert pt.compile_threads() == 1
    assert pt.compile_threads(5) == 5  # AITER_MLA_COMPILE_THREADS, as set


def test_warm_up_compiles_one_at_a_time_without_async_compile(monkeypatch):
    monkeypatch.setattr(pt.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(pt, "_async_compile_mode", lambda: None)
    assert not pt.compile_in_threads()
    assert pt.compile_threads() == 1
    assert pt.compile_threads(8) == 1
