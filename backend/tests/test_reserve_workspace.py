"""Persistent-mode work buffers are claimed in vLLM's memory-profiling run (vLLM 0.33 and later
call the impl's reserve_workspace() there), so the KV cache is sized around them, and the
metadata builder later takes over exactly those tensors instead of allocating new ones."""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import remedy_standins
from vllm_aiter_mla import persistent, remedy
from vllm_aiter_mla.backend import DecodeKernelsMixin
from vllm_aiter_mla.kernels import load_kernels
from vllm_aiter_mla.persistent import allocate_work, largest_specs

REFERENCE = load_kernels("reference")


def config(max_num_seqs: int = 8, num_speculative_tokens: int | None = None):
    spec = None if num_speculative_tokens is None else types.SimpleNamespace(
        num_speculative_tokens=num_speculative_tokens, parallel_drafting=False,
        max_num_new_slots_for_drafting=0)  # read by vLLM 0.34
    return types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs),
                                 model_config=types.SimpleNamespace(dtype=torch.float32),
                                 device_config=types.SimpleNamespace(device=torch.device("cpu")),
                                 speculative_config=spec, use_v2_model_runner=True)


class Impl(DecodeKernelsMixin):
    """The decode mixin as the impls initialise it (_init_decode), with a given vLLM config."""

    def __init__(self, vllm_config, heads: int = 16):
        self._kernels = REFERENCE
        self._decode_heads = heads
        self._vllm_config = vllm_config
        self._decode_kv_cache_dtype = "auto"


@pytest.fixture(autouse=True)
def no_reservations():
    persistent._RESERVED.clear()
    remedy._RESERVED_TABLES.clear()
    yield
    persistent._RESERVED.clear()
    remedy._RESERVED_TABLES.clear()


def test_reserved_buffers_are_the_ones_the_builder_takes(monkeypatch):
    cfg = config(max_num_seqs=8, num_speculative_tokens=3)
    Impl(cfg).reserve_workspace()
    (reserved,) = persistent._RESERVED.values()
    assert (reserved.heads, reserved.max_qlen, reserved.q_dtype) == (16, 4, torch.float32)
    Impl(cfg).reserve_workspace()  # every layer's impl calls it: one set of buffers
    assert len(persistent._RESERVED) == 1
    taken = persistent.take_work(REFERENCE, 8, 4, 16, torch.float32, torch.float32, "cpu")
    assert taken is reserved and taken.work_indptr.data_ptr() == reserved.work_indptr.data_ptr()
    # handed out once: a second builder of the same shape gets buffers of its own
    again = persistent.take_work(REFERENCE, 8, 4, 16, torch.float32, torch.float32, "cpu")
    assert again is not reserved and again.work_indptr.data_ptr() != reserved.work_indptr.data_ptr()


def test_another_shape_is_not_handed_the_reserved_buffers(monkeypatch):
    Impl(config(max_num_seqs=8)).reserve_workspace()
    (reserved,) = persistent._RESERVED.values()
    other = persistent.take_work(REFERENCE, 16, 1, 16, torch.float32, torch.float32, "cpu")
    assert other is not reserved and len(persistent._RESERVED) == 1


def test_the_hook_is_the_one_vllm_calls():
    """vLLM's attention impl base class declares reserve_workspace() where the release has the hook
    (0.33 and later); this package's impls override it there."""
    from vllm.v1.attention.backend import AttentionImpl

    from vllm_aiter_mla.backend import AiterMLAImpl

    assert AiterMLAImpl.reserve_workspace is DecodeKernelsMixin.reserve_workspace
    if hasattr(AttentionImpl, "reserve_workspace"):
        assert AiterMLAImpl.__mro__.index(DecodeKernelsMixin) < AiterMLAImpl.__mro__.index(AttentionImpl)


def test_work_buffers_are_sized_by_the_largest_need_over_every_query_length():
    """AITER's buffer needs are not monotonic in the query length (gfx950 bf16 tiles fewer than 128
    packed rows by 64): each buffer gets, per dimension, the largest size over query lengths
    1 .. max_qlen, not the size asked for at max_qlen."""
    asked = []

    def info(batch, qlen, heads, q_dtype, kv_dtype, is_sparse, fast_mode=True):
        asked.append(qlen)
        peak = 100 if qlen == 2 else 10  # the middle length needs the most
        return tuple(((peak + i, 3), torch.int32) if i else ((peak,), torch.int64) for i in range(6))

    kernels = dataclasses.replace(REFERENCE, get_mla_metadata_info_v1=info)
    work = allocate_work(kernels, 4, 3, 16, torch.bfloat16, torch.bfloat16, "cpu")
    assert asked == [1, 2, 3]
    assert work.work_meta_data.shape == (100,) and work.work_meta_data.dtype == torch.int64
    assert work.reduce_partial_map.shape == (105, 3)
    with pytest.raises(ValueError, match="different ranks or dtypes"):
        largest_specs([(((4,), torch.int32),), (((4, 2), torch.int32),)])


@pytest.mark.parametrize("verify,rows", [(True, 1), (False, 4)], ids=["verify-kernel", "rows-per-query-row"])
def test_the_remedys_slot_table_is_claimed_in_the_profiling_run(verify, rows):
    """Where the remedy loaded, the profiling run also claims its slot table, for the longest query length's
    rows (one a request with vLLM's verify kernel, one a query row without) x max_model_len + qlen columns:
    the real-cache measurement may give the remedy any query length after the KV cache is sized."""
    cfg = config(max_num_seqs=8, num_speculative_tokens=3)
    cfg.model_config.max_model_len = 100
    impl = Impl(cfg)
    impl._triton = remedy_standins.triton_standin(verify=verify)
    impl.reserve_workspace()
    impl.reserve_workspace()  # every layer's impl calls it: one table
    (reserved,) = remedy._RESERVED_TABLES.values()
    assert tuple(reserved.shape) == (8 * rows, 104) and reserved.dtype == torch.int32
    # a builder asking for fewer rows (fewer query lengths served) of the same width takes it, once
    taken = remedy.take_slot_table(8, 104, "cpu")
    assert taken.data_ptr() == reserved.data_ptr() and not remedy._RESERVED_TABLES
    assert remedy.take_slot_table(8, 104, "cpu").data_ptr() != reserved.data_ptr()


def test_no_table_without_the_remedy_nor_for_another_shape():
    impl = Impl(config(max_num_seqs=8))
    impl.reserve_workspace()  # the remedy did not load: nothing could use a table
    assert not remedy._RESERVED_TABLES
    reserved = remedy.reserve_slot_table(8, 104, "cpu")
    for rows, width in ((9, 104), (8, 105), (8, 103)):
        assert remedy.take_slot_table(rows, width, "cpu").data_ptr() != reserved.data_ptr()
    assert len(remedy._RESERVED_TABLES) == 1
