"""Test data for MLA decode: a paged latent KV cache, per-head projections, and an
independent dense MLA computation (decompress K and V per head, causal softmax in
fp32). Nothing here uses the package under test."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch

KV_LORA_RANK = 512
ROPE = 64
LATENT = KV_LORA_RANK + ROPE
NOPE = 16  # per-head nope dim of the dense form (small keeps the dense check cheap)
V_DIM = 16


@dataclass
class DecodeCase:
    q_lens: list[int]
    seq_lens: list[int]
    block_size: int
    num_heads: int
    dtype: torch.dtype
    # Filled by make():
    block_table: torch.Tensor | None = None
    kv_cache: torch.Tensor | None = None  # [num_blocks, block_size, 576]
    q_nope: torch.Tensor | None = None  # [T, H, NOPE]
    q_pe: torch.Tensor | None = None  # [T, H, ROPE]
    w_uk: torch.Tensor | None = None  # [H, NOPE, KV_LORA_RANK]
    w_uv: torch.Tensor | None = None  # [H, V_DIM, KV_LORA_RANK]
    scale: float = 0.0

    @property
    def query_start_loc(self) -> torch.Tensor:
        return torch.tensor([0] + list(_cumsum(self.q_lens)), dtype=torch.int32)

    @property
    def seq_lens_t(self) -> torch.Tensor:
        return torch.tensor(self.seq_lens, dtype=torch.int32)

    def absorbed_q(self) -> torch.Tensor:
        """[T, H, 576]: q_nope absorbed through W_UK, followed by q_pe."""
        ql = torch.einsum("thn,hnl->thl", self.q_nope.float(), self.w_uk.float())
        return torch.cat([ql, self.q_pe.float()], dim=-1).to(self.dtype)

    def project_out(self, latent_out: torch.Tensor) -> torch.Tensor:
        """[T, H, 512] latent attention output -> [T, H, V_DIM] through W_UV."""
        return torch.einsum("thl,hvl->thv", latent_out.float(), self.w_uv.float())


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def make(case: DecodeCase, seed: int = 0) -> DecodeCase:
    g = torch.Generator().manual_seed(seed)
    bs = case.block_size
    blocks_per_req = [math.ceil(s / bs) for s in case.seq_lens]
    num_blocks = sum(blocks_per_req) + 3  # a few unused blocks
    perm = torch.randperm(num_blocks, generator=g)  # scattered, non-contiguous blocks
    max_blocks = max(blocks_per_req)
    table = torch.zeros(len(case.seq_lens), max_blocks, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_per_req):
        table[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    case.block_table = table
    case.kv_cache = (torch.randn(num_blocks, bs, LATENT, generator=g) * 0.5).to(case.dtype)
    total_q = sum(case.q_lens)
    h = case.num_heads
    case.q_nope = torch.randn(total_q, h, NOPE, generator=g).to(case.dtype)
    case.q_pe = torch.randn(total_q, h, ROPE, generator=g).to(case.dtype)
    case.w_uk = (torch.randn(h, NOPE, KV_LORA_RANK, generator=g) / math.sqrt(KV_LORA_RANK)).to(case.dtype)
    case.w_uv = (torch.randn(h, V_DIM, KV_LORA_RANK, generator=g) / math.sqrt(KV_LORA_RANK)).to(case.dtype)
    case.scale = 1.0 / math.sqrt(NOPE + ROPE)
    return case


def dense_mla(case: DecodeCase) -> torch.Tensor:
    """Per request and head: K = [c W_UK^T, k_pe], V = c W_UV^T, causal softmax (fp32)."""
    outs = []
    q_start = 0
    w_uk, w_uv = case.w_uk.float(), case.w_uv.float()
    for b, (q_len, kv_len) in enumerate(zip(case.q_lens, case.seq_lens)):
        rows = []
        for p in range(kv_len):
            blk = int(case.block_table[b, p // case.block_size])
            rows.append(case.kv_cache[blk, p % case.block_size])
        latent = torch.stack(rows).float()  # [L, 576]
        c, k_pe = latent[:, :KV_LORA_RANK], latent[:, KV_LORA_RANK:]
        k_nope = torch.einsum("lc,hnc->hln", c, w_uk)  # [H, L, NOPE]
        v = torch.einsum("lc,hvc->hlv", c, w_uv)  # [H, L, V]
        q_nope = case.q_nope[q_start : q_start + q_len].float()  # [q, H, NOPE]
        q_pe = case.q_pe[q_start : q_start + q_len].float()
        scores = (
            torch.einsum("qhn,hln->hql", q_nope, k_nope) + torch.einsum("qhr,lr->hql", q_pe, k_pe)
        ) * case.scale
        i = torch.arange(q_len)[:, None]
        j = torch.arange(kv_len)[None, :]
        scores = scores.masked_fill(j > kv_len - q_len + i, float("-inf"))
        out = torch.einsum("hql,hlv->qhv", scores.softmax(-1), v)
        outs.append(out)
        q_start += q_len
    return torch.cat(outs)


@cache
def _dense_of(q_lens: tuple[int, ...], seq_lens: tuple[int, ...], block_size: int, heads: int, dtype: torch.dtype,
              seed: int) -> torch.Tensor:
    return dense_mla(make(DecodeCase(list(q_lens), list(seq_lens), block_size, heads, dtype), seed=seed))


def dense_of(case: DecodeCase, seed: int) -> torch.Tensor:
    """``dense_mla`` of the case ``make(case, seed)`` made, computed once per process for each case: a
    matrix checks several kernels, pagings and modes against the same cases (``make`` is seeded, so the
    case is the same each time it is made), and the dense form decompresses K and V per head and
    request (most of such a test's time at 128 heads). ``case`` must be as ``make`` left it."""
    return _dense_of(tuple(case.q_lens), tuple(case.seq_lens), case.block_size, case.num_heads, case.dtype,
                     seed).clone()


def ragged(n: int, lo: int, hi: int, seed: int) -> list[int]:
    """n sequence lengths in [lo, hi], always including both ends when n > 1."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    if n > 1:
        lens[0], lens[-1] = lo, hi
    return lens


# The test matrix: (id, q_lens, seq_lens, block_size, heads). Batch 1..64, ragged
# lengths 1..4096, block sizes 1/16/64, 16 and 128 heads, query lengths 1 and 2-4.
MATRIX = [
    ("b1-len1-bs1-h16", [1], [1], 1, 16),
    ("b1-len4096-bs16-h128", [1], [4096], 16, 128),
    ("b8-ragged1..4096-bs64-h16", [1] * 8, ragged(8, 1, 4096, 1), 64, 16),
    ("b3-ragged1..4096-bs1-h16", [1] * 3, ragged(3, 1, 4096, 2), 1, 16),
    ("b64-ragged1..300-bs16-h16", [1] * 64, ragged(64, 1, 300, 3), 16, 16),
    ("b64-ragged1..200-bs1-h128", [1] * 64, ragged(64, 1, 200, 4), 1, 128),
    ("b17-ragged1..500-bs64-h128", [1] * 17, ragged(17, 1, 500, 5), 64, 128),
    ("b4-q2-bs16-h128", [2] * 4, ragged(4, 2, 700, 6), 16, 128),
    ("b6-q3-bs1-h16", [3] * 6, ragged(6, 3, 300, 7), 1, 16),
    ("b8-q4-bs64-h16", [4] * 8, ragged(8, 4, 2000, 8), 64, 16),
    ("b2-q4-bs16-h128-len4096", [4] * 2, [4, 4096], 16, 128),
]

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
