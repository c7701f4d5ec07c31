"""Block tables for planner tests: rows of distinct cache blocks, stale entries after them
(shared by the GPU tests and the interpreter run)."""

from __future__ import annotations

import torch


def table_for(lens: list[int], qlen: int, block_size: int, seed: int = 0,
              device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, int]:
    """(block table, sequence lengths, cache slots) on ``device``: each row a slice of a random
    permutation of the cache's blocks, with stale random entries past the request's blocks."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-max(n, qlen) // block_size) for n in lens]
    num_cache_blocks = sum(blocks) + 3
    perm = torch.randperm(num_cache_blocks, generator=gen).to(torch.int32)
    table = torch.randint(0, num_cache_blocks, (len(lens), max(blocks) + 2), generator=gen, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks):
        table[b, :n] = perm[used : used + n]
        used += n
    return table.to(device), torch.tensor(lens, dtype=torch.int32, device=device), num_cache_blocks * block_size
