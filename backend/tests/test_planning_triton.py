"""The fused Triton planner equals the PyTorch planner (uniform layout), on a GPU:
random batches with padding rows, stale block-table entries, block sizes 1/16/64, query
lengths 1-4, a narrow and a full-width table, plain and captured in a CUDA graph; and the
edges of its tile walk: request ends on and beside tile boundaries and pairs of tiles written
at once, tiles holding one request boundary, padding rows, long runs of short requests between
long ones (tiles skipped, the next long request found past many lengths), requests one under,
at and one over the tile size, 4096 one-key requests, many short requests (the rows kernel, the grouped
kernel and the tile walk), one long request, any grid size, a max_seq_len hint below the real
lengths, a block table narrower than the rows kernel's tile."""

from __future__ import annotations

import random

import pytest
import torch
import triton
from planning_batches import table_for

from vllm_aiter_mla.planning import DecodePlanBuffers, plan_decode_into

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU for Triton"),
]


def random_batch(rng: random.Random, device: str):
    block_size = rng.choice([1, 16, 64])
    num_reqs = rng.choice([1, 3, 17, 64, 300])
    qlen = rng.randint(1, 4)
    lens = [rng.choice([qlen, rng.randint(qlen, 3000)]) for _ in range(num_reqs)]
    padding = rng.randint(0, min(3, num_reqs - 1))
    for i in range(num_reqs - padding, num_reqs):
        lens[i] = 0  # CUDA-graph padding rows
    blocks = [-(-max(n, qlen) // block_size) for n in lens]
    width = max(blocks) + rng.randint(0, 3)
    num_cache_blocks = sum(blocks) + 5
    perm = torch.randperm(num_cache_blocks, generator=torch.Generator().manual_seed(rng.randint(0, 10**6)))
    table = torch.full((num_reqs, width), 0, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks):
        table[b, :n] = perm[used : used + n].to(torch.int32)
        table[b, n:] = rng.randint(0, num_cache_blocks - 1)  # stale entries
        used += n
    seq = torch.tensor(lens, dtype=torch.int32)
    slots = num_cache_blocks * block_size
    return block_size, qlen, table.to(device), seq.to(device), slots


def expected_plan(block_size, qlen, table, seq):
    buffers = DecodePlanBuffers.allocate(table.shape[0], table.shape[1], block_size, table.device)
    return plan_decode_into(buffers, table, seq, None, uniform_qlen=qlen)


@pytest.mark.parametrize("seed", range(40))
def test_triton_plan_equals_pytorch_plan(seed):
    from vllm_aiter_mla.planning_triton import plan_decode_triton

    rng = random.Random(seed)
    block_size, qlen, table, seq, slots = random_batch(rng, "cuda")
    want = expected_plan(block_size, qlen, table, seq)
    buffers = DecodePlanBuffers.allocate(table.shape[0] + 5, table.shape[1] + 2, block_size, "cuda",
                                         max_keys=slots + (table.shape[0] + 5) * 4)
    buffers.kv_indices.fill_(-7)
    buffers.kv_indptr.fill_(99)
    max_seq = int(seq.max()) if rng.random() < 0.5 else None
    got = plan_decode_triton(buffers, table, seq, qlen, max_seq)
    total = int(want.kv_indptr[-1])
    assert torch.equal(got.qo_indptr, want.qo_indptr)
    assert torch.equal(got.kv_indptr, want.kv_indptr)
    assert torch.equal(got.kv_indices[:total], want.kv_indices[:total])
    assert torch.equal(got.kv_last_page_lens, want.kv_last_page_lens)


def test_triton_plan_replays_from_a_cuda_graph():
    from vllm_aiter_mla.planning_triton import plan_decode_triton

    rng = random.Random(5)
    block_size, qlen, table, seq, slots = random_batch(rng, "cuda")
    buffers = DecodePlanBuffers.allocate(table.shape[0], table.shape[1], block_size, "cuda", max_keys=slots + 4 * 300)
    plan_decode_triton(buffers, table, seq, qlen)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan = plan_decode_triton(buffers, table, seq, qlen)
    for _ in range(3):
        seq.copy_(torch.clamp(seq - torch.randint(0, 50, seq.shape, device="cuda", dtype=torch.int32), min=0))
        graph.replay()
        want = expected_plan(block_size, qlen, table, seq)
        total = int(want.kv_indptr[-1])
        assert torch.equal(plan.kv_indptr, want.kv_indptr)
        assert torch.equal(plan.kv_indices[:total], want.kv_indices[:total])


# Edge cases of the tile walk: a tile inside one request, a tile where one request ends and
# the next begins, the last partial tile, and the grid's stride over tiles.


def assert_plan_equal(lens, qlen, block_size, *, max_reqs=None, max_seq_len=None, seed=0):
    from vllm_aiter_mla.planning_triton import plan_decode_triton

    table, seq, slots = table_for(lens, qlen, block_size, seed, device="cuda")
    want = expected_plan(block_size, qlen, table, seq)
    total = int(want.kv_indptr[-1])
    assert total == sum(max(n, qlen) for n in lens)
    max_reqs = max_reqs or len(lens)
    buffers = DecodePlanBuffers.allocate(max_reqs, table.shape[1], block_size, "cuda",
                                         max_keys=slots + max_reqs * qlen)
    buffers.kv_indices.fill_(-7)
    buffers.kv_indptr.fill_(99)
    buffers.qo_indptr.fill_(99)
    got = plan_decode_triton(buffers, table, seq, qlen, max_seq_len)
    assert torch.equal(got.qo_indptr, want.qo_indptr)
    assert torch.equal(got.kv_indptr, want.kv_indptr)
    assert torch.equal(got.kv_indices[:total], want.kv_indices[:total])
    # nothing written past the batch's keys (the last tile is partial)
    assert bool((buffers.kv_indices[total:] == -7).all())


def tile_boundary_batches(block_t):
    """Request ends on, just before and just after tile boundaries."""
    return {
        "ends on boundaries": [block_t] * 3,
        "one before": [block_t - 1, block_t, block_t],
        "one after": [block_t + 1, block_t - 2, block_t + 1, 1],
        "two-key requests across a boundary": [block_t - 1] + [2] * 5 + [block_t],
        "total one past a tile": [block_t, 1],
        "total one short of a tile": [block_t - 1],
        "one-key requests across a boundary": [block_t - 3] + [1] * 6 + [block_t],
        "a tile boundary inside 4094 one-key requests": [block_t // 2] + [1] * (block_t - 2) + [block_t // 2 + 3],
        "ends on pairs of tiles": [2 * block_t, 2 * block_t, 4 * block_t, 1],
        "ends one short of and one past a pair": [2 * block_t - 1, 2 * block_t + 2, 3 * block_t - 1, 5],
        "a pair ending on the last key": [3 * block_t - 7, 7 + 2 * block_t],
    }


@pytest.mark.parametrize("block_size,qlen", [(1, 1), (16, 1), (16, 3), (64, 2)])
@pytest.mark.parametrize("name", list(tile_boundary_batches(4096)))
def test_tile_boundaries(name, block_size, qlen):
    from vllm_aiter_mla.planning_triton import BLOCK_T

    lens = tile_boundary_batches(BLOCK_T)[name]
    assert_plan_equal(lens, qlen, block_size)
    assert_plan_equal(lens, qlen, block_size, max_seq_len=max(lens))


@pytest.mark.parametrize("run", [255, 256, 257, 1000])
def test_long_runs_of_short_requests_between_long_ones(run):
    # Runs of one- and two-key requests, around 256 and more, between long requests (the tile
    # walk: no max_seq_len, so no grouped kernel): tiles with no key of a long request are
    # skipped, and the next long request is found many lengths on.
    from vllm_aiter_mla.planning_triton import BLOCK_T

    lens = [BLOCK_T + 3] + [1] * run + [2] * run + [3 * BLOCK_T] + [1] * (run // 2)
    assert_plan_equal(lens, 1, 16)
    assert_plan_equal(lens, 2, 1, seed=1)


@pytest.mark.parametrize("programs", [1, 3, None])
def test_every_tile_is_planned_whatever_the_grid(programs, monkeypatch):
    from vllm_aiter_mla import planning_triton

    if programs is not None:
        monkeypatch.setattr(planning_triton, "_num_programs", lambda device_index: programs)
    rng = random.Random(programs or 0)
    lens = [rng.choice([1, 7, rng.randint(1, 3 * planning_triton.BLOCK_T)]) for _ in range(40)]
    assert_plan_equal(lens, 1, 16)


@pytest.mark.parametrize("qlen", [1, 2, 4])
def test_padding_rows(qlen):
    # Live rows between and after runs of padding rows (sequence length 0 -> qlen keys),
    # runs long enough that a tile holds only padding (query lengths 2 and 4).
    from vllm_aiter_mla.planning_triton import BLOCK_T, MAX_REQS

    run = min(BLOCK_T // qlen + 7, MAX_REQS - 100)
    lens = [3000] + [0] * 5 + [1, 2, 3] + [0] * run + [BLOCK_T + 1] + [0] * 64
    assert_plan_equal(lens, qlen, 16, max_reqs=min(len(lens) + 10, MAX_REQS))


def test_a_batch_of_padding_rows_only():
    assert_plan_equal([0] * 300, 2, 16)


@pytest.mark.parametrize("block_size", [1, 16])
def test_4096_requests_of_one_key(block_size):
    # One tile spans 4096 requests: the deepest search (4096 candidates), with plan buffers
    # for exactly the planner's largest batch.
    from vllm_aiter_mla.planning_triton import MAX_REQS

    assert_plan_equal([1] * MAX_REQS, 1, block_size, max_seq_len=1)


@pytest.mark.parametrize("hint", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_many_short_requests(seed, hint):
    # With max_seq_len the rows kernel plans them (checked), without it the tile walk.
    from vllm_aiter_mla.planning_triton import MAX_REQS, _num_programs, launch_shape_of

    rng = random.Random(seed)
    lens = [rng.randint(0, 40) for _ in range(MAX_REQS - rng.randint(0, 100))]
    qlen = rng.randint(1, 4)
    longest = max(max(lens), qlen) if hint else None
    assert launch_shape_of(_num_programs(0), len(lens), longest)[0] == ("rows" if hint else "walk")
    assert_plan_equal(lens, qlen, rng.choice([1, 16]), max_reqs=MAX_REQS, seed=seed,
                      max_seq_len=max(lens) if hint else None)


@pytest.mark.parametrize("num_reqs,longest", [(1, 1), (5, 300), (700, 9), (4096, 2), (1000, 2048)])
def test_grouped_kernel(num_reqs, longest, monkeypatch):
    # Groups of several requests, one request per group, a last group cut short by the batch
    # (the rows kernel, which takes short requests first, turned off).
    from vllm_aiter_mla import planning_triton
    from vllm_aiter_mla.planning_triton import _num_programs, launch_shape_of

    monkeypatch.setattr(planning_triton, "ROWS_MAX_LEN", 0)
    assert launch_shape_of(_num_programs(0), num_reqs, longest)[0] == "grouped"
    rng = random.Random(num_reqs)
    lens = [rng.choice([0, 1, longest, rng.randint(0, longest)]) for _ in range(num_reqs)]
    lens[rng.randrange(num_reqs)] = longest
    assert_plan_equal(lens, 1 + num_reqs % 3, rng.choice([1, 16, 64]), max_seq_len=longest)


def test_a_max_seq_len_below_the_real_lengths_gives_the_same_plan():
    # The hint picks the kernel and its launch shape only: understated, the rows kernel or the
    # grouped kernel (chosen for short requests) still plans every key.
    lens = [5] * 300 + [9000, 3] + [5] * 200
    assert_plan_equal(lens, 1, 16, max_seq_len=5)
    assert_plan_equal(lens, 2, 16, max_seq_len=100)
    assert_plan_equal(lens, 2, 1, max_seq_len=2000)


@pytest.mark.parametrize("num_reqs,longest", [(1, 1), (3, 1024), (64, 17), (700, 9), (4000, 300), (4096, 1),
                                              (4096, 16), (1000, 512)])
def test_rows_kernel(num_reqs, longest):
    # Groups of several requests, one request per group, a last group cut short by the batch,
    # padding rows, requests of one key and of the longest; block size 1 makes the table as
    # wide as the tile, block size 64 far narrower (its first positions read the last column).
    from vllm_aiter_mla.planning_triton import _num_programs, launch_shape_of

    assert launch_shape_of(_num_programs(0), num_reqs, longest)[0] == "rows"
    rng = random.Random(num_reqs * longest)
    lens = [rng.choice([0, 1, longest, rng.randint(0, longest)]) for _ in range(num_reqs)]
    lens[rng.randrange(num_reqs)] = longest
    for block_size in (1, 16, 64):
        assert_plan_equal(lens, 1 + num_reqs % 3, block_size, max_seq_len=longest, seed=block_size)


def test_a_block_table_without_columns_is_refused():
    from vllm_aiter_mla.planning_triton import plan_decode_triton

    buffers = DecodePlanBuffers.allocate(4, 1, 16, "cuda", max_keys=1000)
    table = torch.zeros((2, 0), dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="no columns"):
        plan_decode_triton(buffers, table, torch.ones(2, dtype=torch.int32, device="cuda"), 1, 1)


@pytest.mark.parametrize("block_size", [1, 16])
def test_tiles_holding_one_or_two_request_boundaries(block_size):
    # Requests a little longer or shorter than a tile, so that most tiles hold one boundary
    # (each key's row is the cursor's or the next request's); a short request between two long
    # ones (two boundaries: one of three rows), the second or third request ending on the tile's
    # end; between runs of such tiles and of tiles holding more boundaries; with and without the
    # hint.
    from vllm_aiter_mla.planning_triton import BLOCK_T

    rng = random.Random(block_size)
    lens = [BLOCK_T + 1] * 9 + [BLOCK_T - 1] * 9 + [rng.randint(BLOCK_T // 2, 3 * BLOCK_T) for _ in range(60)]
    lens += [1, 2, 3] + [2 * BLOCK_T + 5, 0, BLOCK_T - 2, 1] + [rng.randint(1, 5000) for _ in range(40)]
    lens += [BLOCK_T - 10, 5, BLOCK_T + 5] * 3 + [BLOCK_T - 10, 10, BLOCK_T] + [BLOCK_T - 10, 5, 5, BLOCK_T]
    lens += [rng.choice([rng.randint(1, 32), rng.randint(BLOCK_T, 4 * BLOCK_T)]) for _ in range(60)]
    assert_plan_equal(lens, 1, block_size)
    assert_plan_equal(lens, 2, block_size, max_seq_len=max(lens))


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_one_long_request(block_size):
    from vllm_aiter_mla.planning_triton import BLOCK_T

    assert_plan_equal([37 * BLOCK_T + 5], 1, block_size, max_seq_len=37 * BLOCK_T + 5)


def test_one_long_request_among_short_ones():
    from vllm_aiter_mla.planning_triton import BLOCK_T

    rng = random.Random(1)
    lens = [rng.randint(1, 30) for _ in range(500)] + [20 * BLOCK_T + 3] + [rng.randint(1, 30) for _ in range(500)]
    assert_plan_equal(lens, 2, 16)


def test_more_requests_than_the_planner_holds_is_refused():
    from vllm_aiter_mla.planning_triton import MAX_REQS, plan_decode_triton

    buffers = DecodePlanBuffers.allocate(MAX_REQS + 1, 4, 16, "cuda", max_keys=1000)
    table = torch.zeros((2, 4), dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="max-num-seqs"):
        plan_decode_triton(buffers, table, torch.ones(2, dtype=torch.int32, device="cuda"), 1)


def _compiled(kernel) -> int:
    """How many compiled variants a Triton kernel holds (every device)."""
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(c) for c in kernel.cache.values())


@pytest.mark.parametrize("threads", [8, 1], ids=["compiled in threads", "compiled one at a time"])
def test_after_warm_up_no_batch_compiles_a_kernel(threads, tmp_path, monkeypatch):
    """warm_up() compiles every launch shape (in threads, or one at a time): then batches of any
    size, lengths, query length and max_seq_len hint (none, right, too small, too large) plan
    without a single compile, and the plans are right. A shape warm_up() did not launch does
    compile (the count can move)."""
    from vllm_aiter_mla import planning_triton as pt

    if threads > 1 and not pt.compile_in_threads():
        pytest.skip(f"Triton {triton.__version__} has no triton.runtime._async_compile: no compile in threads")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compiled here, not loaded from an earlier run
    # In threads: a block size no other test plans with, so every shape is compiled by warm_up.
    max_reqs, block_size, max_len = 512, 32 if threads > 1 else 16, 20000
    buffers = DecodePlanBuffers.allocate(max_reqs=max_reqs, max_blocks=-(-max_len // block_size) + 1,
                                         block_size=block_size, device="cuda", max_keys=max_reqs * (max_len + 4))
    kernels = (pt._plan_kernel, pt._plan_grouped_kernel, pt._plan_rows_kernel)
    cached = sum(_compiled(k) for k in kernels)
    shapes = pt.warm_up(buffers, max_len + 4, threads)
    before = [_compiled(k) for k in kernels]
    assert sum(before) - (cached if threads > 1 else 0) >= shapes
    rng = random.Random(7)
    for step in range(300):
        num_reqs = rng.choice([1, 2, 15, 16, 17, rng.randint(1, max_reqs), max_reqs])
        qlen = rng.randint(1, 4)
        short = rng.random() < 0.5
        lens = [rng.randint(0, 64 if short else max_len) for _ in range(num_reqs)]
        width = -(-max(max(lens), qlen) // block_size) + rng.randint(0, 2)
        table = torch.randint(0, 50000, (num_reqs, width), dtype=torch.int32, device="cuda")
        seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
        hint = rng.choice([None, max(lens), max(1, max(lens) // 3), max_len])
        got = pt.plan_decode_triton(buffers, table, seq, qlen, hint)
        if step % 25 == 0:
            ref = expected_plan(block_size, qlen, table, seq)
            total = int(ref.kv_indptr[-1])
            assert torch.equal(got.kv_indptr, ref.kv_indptr)
            assert torch.equal(got.kv_indices[:total], ref.kv_indices[:total])
    torch.cuda.synchronize()
    assert [_compiled(k) for k in kernels] == before
    pt._launch(buffers, table[:1], seq[:1], 1, 1, ("walk", pt.MIN_BLOCK_T // 2, False, 1, 1))
    assert _compiled(pt._plan_kernel) == before[0] + 1


@pytest.mark.parametrize("block_size", [1, 16])
def test_requests_around_the_tile_size_in_a_walk(block_size):
    # The walk writes requests shorter than its tile as rows and walks the tiles for the keys of
    # the others (a tile holds keys of at most two of them, and skips the short requests' keys):
    # lengths one under, at and one over the tile, runs of short requests between long ones, a
    # short request first and last, padding rows; with no hint and with hints that give the walk
    # smaller tiles (on this GPU's grid).
    from vllm_aiter_mla import planning_triton as pt

    rng = random.Random(block_size)
    programs = pt._num_programs(0)
    walked = set()
    for num_reqs, longest in [(40, None), (300, None), (2000, None), (40, 10000), (50, 10000), (300, 9000),
                              (2000, 20000)]:
        kind, block_t, direct, *_ = pt.launch_shape_of(programs, num_reqs, longest)
        if kind != "walk" or direct:
            continue
        walked.add((block_t, longest is None))
        lens = [rng.choice([block_t - 1, block_t, block_t + 1, 1, 0, rng.randint(1, block_t - 1),
                            rng.randint(block_t, 3 * block_t)]) for _ in range(num_reqs)]
        lens[0], lens[-1] = rng.randint(1, block_t - 1), rng.randint(1, block_t - 1)
        if longest is not None:
            lens = [min(n, longest) for n in lens]
        assert_plan_equal(lens, rng.randint(1, 3), block_size, max_seq_len=longest)
    assert {(pt.BLOCK_T, True), (pt.BLOCK_T, False)} <= walked


@pytest.mark.parametrize("hint", [64, 2048, 20000, None], ids=["rows", "grouped", "walk", "no-hint"])
def test_requests_sharing_a_prefix_and_buffers_too_small(hint):
    """Prefix caching: 256 requests on one prefix of up to 20k tokens (the same block ids in every
    row) reference far more keys than the cache has slots. With the builder's capacity (requests
    x the longest request) the plan is exact; with buffers sized by the slot count, every kernel
    clamps kv_indptr to the capacity, writes nothing past it, and counts the dropped keys."""
    from vllm_aiter_mla.planning_triton import launch_shape_of, _num_programs, plan_decode_triton

    block_size, qlen, num_reqs = 16, 2, 256
    prefix = (hint or 20000) - 4
    blocks = -(-prefix // block_size) + 1
    table = torch.arange(blocks, dtype=torch.int32, device="cuda").repeat(num_reqs, 1)
    table[:, -1] = blocks + torch.arange(num_reqs, dtype=torch.int32, device="cuda")  # a block of its own
    seq = torch.full((num_reqs,), prefix, dtype=torch.int32, device="cuda")
    seq[::7] = prefix - 9
    slots = (blocks + num_reqs) * block_size
    want = expected_plan(block_size, qlen, table, seq)
    keys = int(want.kv_indptr[-1])
    assert keys > 3 * (slots + num_reqs * qlen)
    if hint is not None:
        assert launch_shape_of(_num_programs(0), num_reqs, hint)[0] == ("rows" if hint == 64 else
                                                                       "grouped" if hint == 2048 else "walk")
    whole = DecodePlanBuffers.allocate(num_reqs, blocks, block_size, "cuda")
    got = plan_decode_triton(whole, table, seq, qlen, hint)
    assert torch.equal(got.kv_indptr, want.kv_indptr)
    assert torch.equal(got.kv_indices[:keys], want.kv_indices[:keys])
    assert int(whole.overflow) == 0
    small = DecodePlanBuffers.allocate(num_reqs, blocks, block_size, "cuda", max_keys=slots + num_reqs * qlen)
    small.kv_indices.fill_(-7)
    got = plan_decode_triton(small, table, seq, qlen, hint)
    cap = small.capacity
    assert torch.equal(got.kv_indptr, want.kv_indptr.clamp(max=cap))
    assert torch.equal(got.kv_indices[:cap], want.kv_indices[:cap])
    assert int(small.kv_indices[cap]) == -7
    assert int(small.overflow) == keys - cap
    with pytest.raises(RuntimeError, match="keys more than the plan buffers hold"):
        small.check_overflow()
