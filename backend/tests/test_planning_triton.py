"""The fused Triton planner equals the PyTorch planner (uniform layout), on a GPU:
random batches with padding rows, stale block-table entries, block sizes 1/16/64, query
lengths 1-4, a narrow and a full-width table, plain and captured in a CUDA graph."""

from __future__ import annotations

import random

import pytest
import torch

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
