"""The own metadata builder hands vLLM's built-in prefill code the chunked-context indices its
fused gather reads, made by the built-in builder's own method, and they are the right slots:
run on the CPU with the release's ``_expand_page_indices_kernel`` (read from the installed
vLLM's source by backend/bench/builtin_planner.py; vLLM itself turns Triton off on a CPU) in
Triton's interpreter. Used by test_prefill_inherited.py in a process of its own, because
TRITON_INTERPRET must be set before Triton is imported.

    TRITON_INTERPRET=1 python context_gather_interpreted.py

Prints one line per case; ends with status 1 at the first chunk whose indices differ.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch
import vllm
from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder, MLACommonPrefillMetadata
from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import builtin_planner  # noqa: E402

from vllm_aiter_mla.backend import AiterMLAMetadataBuilder  # noqa: E402

Chunk = MLACommonPrefillMetadata.ContextChunk

# (id, block size, blocks per request, [(start, length) of each request's context in one chunk], ...)
CASES = [
    ("one-chunk", 16, 8, [[(0, 37), (0, 0), (0, 90)]]),
    ("second-chunk-with-offsets", 16, 8, [[(0, 64), (0, 30)], [(64, 50), (30, 3)]]),
    ("block-size-1", 1, 128, [[(5, 100), (0, 1)]]),
    ("block-size-64-past-the-first-chunk-of-the-kernel", 64, 40, [[(0, 2500), (100, 1030)]]),
]


def chunk(index: int, spans: list[tuple[int, int]], first_request: int) -> Chunk:
    lens = torch.tensor([n for _, n in spans], dtype=torch.int32)
    cu = torch.zeros(len(spans) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    tokens = int(lens.sum())
    return Chunk(index=index, request_slice=slice(first_request, first_request + len(spans)),
                 token_slice=slice(0, len(spans)), continuation_token_end=0, is_continuation=False,
                 num_context_tokens=tokens, query_start_loc=torch.arange(len(spans) + 1, dtype=torch.int32),
                 max_query_len=1, cu_seq_lens=cu, starts=torch.tensor([s for s, _ in spans], dtype=torch.int32),
                 max_seq_len=int(lens.max()), seq_lens=lens,
                 token_to_seq=torch.repeat_interleave(torch.arange(len(spans)), lens.long()),
                 all_rows_active=True)


def expected(block_table: torch.Tensor, block_size: int, spans: list[tuple[int, int]], first: int) -> list[int]:
    slots = []
    for offset, (start, length) in enumerate(spans):
        row = block_table[first + offset]
        slots += [int(row[p // block_size]) * block_size + p % block_size for p in range(start, start + length)]
    return slots


def main() -> int:
    kernel = builtin_planner.load(Path(vllm.__file__).resolve().parents[1]).kernel
    builtin._expand_page_indices_kernel = kernel  # vLLM's placeholder on a CPU, the release's kernel here
    generator = torch.Generator().manual_seed(0)
    for name, block_size, blocks, chunks in CASES:
        requests = max(len(spans) for spans in chunks)
        table = torch.randperm(requests * blocks * 2, generator=generator, dtype=torch.int32)[: requests * blocks]
        table = table.reshape(requests, blocks)
        context = MLACommonPrefillMetadata.ChunkedContextMetadata(
            context_lens=torch.zeros(requests, dtype=torch.int32), workspace=torch.empty(0),
            chunks=[chunk(i, spans, 0) for i, spans in enumerate(chunks)], context_lens_list=[0] * requests,
            empty_token_slices=[])
        prefill = MLACommonPrefillMetadata(block_table=table, query_start_loc=torch.zeros(requests + 1),
                                           max_query_len=1, chunked_context=context)
        made = types.SimpleNamespace(prefill=prefill, context_chunk_kv_indices=None)
        MLACommonMetadataBuilder.build = lambda self, *args, **kwargs: made  # the common part's result
        own = object.__new__(AiterMLAMetadataBuilder)
        own._fused_context_gather = True
        own.kernel_block_size = block_size
        indices = AiterMLAMetadataBuilder.build(own, 0, None).context_chunk_kv_indices
        if indices is None or len(indices) != len(chunks):
            print(f"DIFFERENT {name}: {None if indices is None else len(indices)} index lists for {len(chunks)} "
                  "chunks")
            return 1
        for i, spans in enumerate(chunks):
            want = expected(table, block_size, spans, 0)
            if indices[i].tolist() != want:
                print(f"DIFFERENT {name} chunk {i}: {indices[i].tolist()[:8]}... != {want[:8]}...")
                return 1
        print(f"ok: {name} ({len(chunks)} chunk(s), {sum(n for spans in chunks for _, n in spans)} context tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
