"""Decode planning: block table + sequence lengths -> AITER's int32 index tensors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_aiter_mla.planning import DecodePlanBuffers, PlanWorkspace, plan_decode, plan_decode_into


@st.composite
def batches(draw):
    """A batch: block size, per-request lengths, query lengths and a block table of
    distinct blocks drawn from a cache of `num_blocks` blocks (with stale padding)."""
    block_size = draw(st.sampled_from([1, 2, 16, 64]))
    num_reqs = draw(st.integers(1, 12))
    seq_lens = draw(st.lists(st.integers(0, 300), min_size=num_reqs, max_size=num_reqs))
    q_len = draw(st.integers(1, 4))
    blocks_needed = [-(-s // block_size) for s in seq_lens]
    width = max(max(blocks_needed), 1) + draw(st.integers(0, 2))
    num_blocks = sum(blocks_needed) + draw(st.integers(0, 8))
    perm = draw(st.permutations(list(range(max(num_blocks, 1)))))
    table = torch.full((num_reqs, width), 0, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_needed):
        table[b, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        # Entries past a request's blocks hold whatever was there before.
        table[b, n:] = draw(st.integers(0, max(num_blocks - 1, 0)))
        used += n
    qsl = torch.arange(0, (num_reqs + 1) * q_len, q_len, dtype=torch.int32)
    return block_size, torch.tensor(seq_lens, dtype=torch.int32), qsl, table, max(num_blocks, 1)


def expected_slots(table: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> list[list[int]]:
    return [
        [int(table[b, p // block_size]) * block_size + p % block_size for p in range(int(n))]
        for b, n in enumerate(seq_lens)
    ]


@settings(max_examples=150, deadline=None)
@given(batches())
def test_plan_properties(batch):
    block_size, seq_lens, qsl, table, num_blocks = batch
    plan = plan_decode(table, seq_lens, qsl, block_size)
    for t in (plan.qo_indptr, plan.kv_indptr, plan.kv_indices, plan.kv_last_page_lens):
        assert t.dtype == torch.int32
    # indptrs start at 0, are monotone and consistent with the lengths
    assert int(plan.kv_indptr[0]) == 0 and int(plan.qo_indptr[0]) == 0
    assert torch.all(plan.kv_indptr[1:] >= plan.kv_indptr[:-1])
    assert torch.equal(plan.kv_indptr[1:] - plan.kv_indptr[:-1], seq_lens)
    assert torch.equal(plan.qo_indptr, qsl)
    assert int(plan.kv_indptr[-1]) == plan.kv_indices.numel()
    # every index inside the cache
    if plan.kv_indices.numel():
        assert int(plan.kv_indices.min()) >= 0
        assert int(plan.kv_indices.max()) < num_blocks * block_size
    # the slots are exactly those of the block table, in order
    for b, slots in enumerate(expected_slots(table, seq_lens, block_size)):
        lo, hi = int(plan.kv_indptr[b]), int(plan.kv_indptr[b + 1])
        assert plan.kv_indices[lo:hi].tolist() == slots
    assert torch.equal(plan.kv_last_page_lens, torch.ones(len(seq_lens), dtype=torch.int32))


@settings(max_examples=150, deadline=None)
@given(batches(), st.booleans(), st.booleans())
def test_persistent_buffers_equal_allocating_plan(batch, with_workspace, narrow_table):
    block_size, seq_lens, qsl, table, _ = batch
    expected = plan_decode(table, seq_lens, qsl, block_size)
    buffers = DecodePlanBuffers.allocate(16, table.shape[1] + 3, block_size, "cpu")
    workspace = PlanWorkspace.allocate(buffers) if with_workspace else None
    # Stale contents from an earlier, larger step must not leak into this one.
    buffers.kv_indices.fill_(-7)
    buffers.kv_indptr.fill_(99)
    buffers.kv_indptr[0] = 0
    if narrow_table:  # only the blocks the longest request needs
        need = max(1, -(-int(seq_lens.max()) // block_size))
        table = table[:, :need]
    plan = plan_decode_into(buffers, table, seq_lens, qsl, workspace)
    total = int(expected.kv_indptr[-1])
    assert torch.equal(plan.qo_indptr, expected.qo_indptr)
    assert torch.equal(plan.kv_indptr, expected.kv_indptr)
    assert torch.equal(plan.kv_indices[:total], expected.kv_indices)
    assert torch.equal(plan.kv_last_page_lens, expected.kv_last_page_lens)
    # Views of the persistent buffers (fixed addresses for a captured graph).
    assert plan.kv_indices.data_ptr() == buffers.kv_indices.data_ptr()
    assert plan.kv_indptr.data_ptr() == buffers.kv_indptr.data_ptr()


def test_replanning_into_same_buffers_changes_contents_not_addresses():
    buffers = DecodePlanBuffers.allocate(4, 8, 16, "cpu")
    t1 = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    t2 = torch.tensor([[5, 6], [7, 4]], dtype=torch.int32)
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    p1 = plan_decode_into(buffers, t1, torch.tensor([20, 3], dtype=torch.int32), qsl)
    first = p1.kv_indices[:23].clone()
    p2 = plan_decode_into(buffers, t2, torch.tensor([17, 32], dtype=torch.int32), qsl)
    assert p1.kv_indices.data_ptr() == p2.kv_indices.data_ptr()
    assert not torch.equal(first, p2.kv_indices[:23])
    rows = expected_slots(t2, torch.tensor([17, 32]), 16)
    assert p2.kv_indices[:49].tolist() == rows[0] + rows[1]


def test_plan_into_rejects_batch_larger_than_buffers():
    buffers = DecodePlanBuffers.allocate(2, 4, 16, "cpu")
    table = torch.zeros(3, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="exceeds the plan buffers"):
        plan_decode_into(buffers, table, torch.ones(3, dtype=torch.int32), torch.arange(4, dtype=torch.int32))


@pytest.mark.parametrize("bad", ["seq_lens", "query_start_loc", "table"])
def test_plan_rejects_inconsistent_shapes(bad):
    table = torch.zeros(2, 3, dtype=torch.int32)
    seq = torch.ones(3 if bad == "seq_lens" else 2, dtype=torch.int32)
    qsl = torch.arange(4 if bad == "query_start_loc" else 3, dtype=torch.int32)
    if bad == "table":
        table = torch.zeros(6, dtype=torch.int32)
    with pytest.raises(ValueError):
        plan_decode(table, seq, qsl, 16)


def _allocations(fn) -> list[int]:
    """Sizes of the allocations `fn` makes, as the PyTorch profiler records them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0]


def test_plan_into_with_workspace_allocates_no_tensor_storage():
    """With a workspace, planning allocates nothing (the CUDA-graph requirement)."""
    buffers = DecodePlanBuffers.allocate(4, 8, 16, "cpu")
    workspace = PlanWorkspace.allocate(buffers)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    seq, qsl = torch.tensor([40, 9], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32)
    with_ws = _allocations(lambda: plan_decode_into(buffers, table, seq, qsl, workspace))
    without_ws = _allocations(lambda: plan_decode_into(buffers, table, seq, qsl, None))
    assert with_ws == [], with_ws
    # The measurement sees scratch allocations when there is no workspace.
    assert without_ws, without_ws


def _shared_prefix_batch(num_reqs: int, prefix_blocks: int, block_size: int):
    """num_reqs requests on one cached prefix of prefix_blocks blocks (prefix caching: the same
    block ids in every row), each with one block of its own; the cache holds exactly the
    blocks in use."""
    table = torch.zeros((num_reqs, prefix_blocks + 1), dtype=torch.int32)
    table[:, :prefix_blocks] = torch.arange(prefix_blocks, dtype=torch.int32)
    table[:, prefix_blocks] = prefix_blocks + torch.arange(num_reqs, dtype=torch.int32)
    seq_lens = torch.full((num_reqs,), prefix_blocks * block_size + 1, dtype=torch.int32)
    return table, seq_lens, prefix_blocks + num_reqs


def test_requests_sharing_a_prefix_have_more_keys_than_the_cache_has_slots_and_are_planned_whole():
    """Σ seq_lens of a step is not bounded by the KV cache's slot count: 64 requests on one
    2k-token prefix reference 131k keys in a cache of 3,072 slots. The default capacity
    (requests x the longest request) plans it exactly."""
    block_size, qlen, num_reqs = 16, 1, 64
    table, seq_lens, cache_blocks = _shared_prefix_batch(num_reqs, 128, block_size)
    keys = int(seq_lens.sum())
    old_capacity = cache_blocks * block_size + num_reqs * qlen  # what the builder used to allocate
    assert keys > 40 * old_capacity
    buffers = DecodePlanBuffers.allocate(num_reqs, table.shape[1], block_size, "cpu")
    plan = plan_decode_into(buffers, table, seq_lens, None, uniform_qlen=qlen)
    want = plan_decode(table, seq_lens, torch.arange(num_reqs + 1, dtype=torch.int32), block_size)
    assert torch.equal(plan.kv_indptr, want.kv_indptr) and int(plan.kv_indptr[-1]) == keys
    assert torch.equal(plan.kv_indices[:keys], want.kv_indices)
    buffers.check_overflow()  # nothing dropped


def test_a_plan_never_points_past_the_buffers_and_the_overflow_is_reported():
    """Buffers smaller than the step (the sizing by slot count): kv_indptr stops at the
    capacity (AITER cannot read past it), the keys that fit are right, and the dropped keys
    are counted on the device and reported by check_overflow."""
    block_size, num_reqs = 16, 8
    table, seq_lens, cache_blocks = _shared_prefix_batch(num_reqs, 4, block_size)
    capacity = cache_blocks * block_size + num_reqs
    buffers = DecodePlanBuffers.allocate(num_reqs, table.shape[1], block_size, "cpu", max_keys=capacity)
    buffers.kv_indices.fill_(-7)
    plan = plan_decode_into(buffers, table, seq_lens, None, uniform_qlen=1)
    want = plan_decode(table, seq_lens, torch.arange(num_reqs + 1, dtype=torch.int32), block_size)
    keys = int(want.kv_indptr[-1])
    assert keys > capacity
    assert torch.equal(plan.kv_indptr, want.kv_indptr.clamp(max=capacity))
    assert torch.equal(plan.kv_indices[:capacity], want.kv_indices[:capacity])
    assert int(buffers.overflow) == keys - capacity
    with pytest.raises(RuntimeError, match=f"{keys - capacity} keys more than the plan buffers hold"):
        buffers.check_overflow()
