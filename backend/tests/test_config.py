"""Start-up checks: head counts (padding to a head count AITER has a kernel for), query
lengths per KV dtype and decode mode, KV-cache dtypes, unsupported features."""

import re

import pytest

from vllm_aiter_mla import contract
from vllm_aiter_mla.config import (
    DecodeShape,
    check_kv_cache_dtype,
    check_unsupported_features,
    compile_threads_setting,
    decode_head_count,
    decode_mode,
)

NP = contract.NON_PERSISTENT
P = contract.PERSISTENT


def shape(max_qlen=1, dtype=contract.BF16, mode=P):
    return DecodeShape(max_qlen=max_qlen, q_dtype=dtype, kv_dtype=dtype, mode=mode)


@pytest.mark.parametrize("heads,mode,expected", [
    # Every arch's rules (CPU: gfx942 and gfx950), query length 1, bf16, AITER v0.1.20.post1's table.
    # 8 heads: non-persistent 8-head kernels on both archs; persistent has none at query length 1 on gfx942.
    (1, P, 16), (8, P, 16), (8, NP, 8), (12, NP, 16),
    (16, P, 16), (128, NP, 128), (128, P, 128),
    # Persistent mode folds multiples of 16 onto the 16-head kernels on gfx942 (gfx950 runs them natively);
    # 32 heads on gfx942 is a listed defect (AITER's own test skips it): 48.
    (32, P, 48), (64, P, 64), (24, P, 48), (100, P, 112),
    # Non-persistent: native 8, 16, 32, 64 (64 at query length 1: gfx950 only) and 128 heads.
    (32, NP, 32), (64, NP, 128), (17, NP, 32),
])
def test_head_count_is_the_nearest_with_a_kernel(heads, mode, expected):
    assert decode_head_count(heads, shape=shape(mode=mode)) == expected


def test_one_arch_uses_its_own_native_head_counts():
    gfx950 = DecodeShape(mode=P, archs=("gfx950",))
    assert decode_head_count(32, shape=gfx950) == 32 and decode_head_count(24, shape=gfx950) == 24
    assert decode_head_count(64, shape=DecodeShape(mode=NP, archs=("gfx950",))) == 64


def test_query_length_changes_the_head_count():
    # 16 heads bf16 non-persistent: kernels up to query length 8; 128 heads: any length.
    assert decode_head_count(16, shape=shape(max_qlen=2, mode=NP)) == 16
    assert decode_head_count(16, shape=shape(max_qlen=2, dtype=contract.FP8, mode=NP)) == 16


@pytest.mark.parametrize("heads", [129, 144, 256])
def test_too_many_heads_fail_with_tensor_parallel_hint(heads):
    with pytest.raises(ValueError, match="--tensor-parallel-size") as err:
        decode_head_count(heads, shape=shape())
    assert f"{heads} attention heads per GPU" in str(err.value)
    assert "\n" not in str(err.value)


def test_hint_lists_tensor_parallel_sizes_that_work():
    with pytest.raises(ValueError) as err:
        decode_head_count(256, total_heads=256, shape=shape(mode=NP))
    assert "[2, 4, 8, 16, 32, 64, 128, 256]" in str(err.value)


@pytest.mark.parametrize("qlen", [5, 6, 8])
def test_fp8_cache_with_four_or_more_speculative_tokens(qlen):
    """Persistent mode has fp8 kernels for query lengths 5-8: natively on gfx950 (AITER PRs #3380,
    #4258), on gfx942 only the 128-head one; non-persistent mode has none (AITER_CHECK)."""
    assert decode_head_count(16, shape=shape(max_qlen=qlen, dtype=contract.FP8)) == 128
    assert decode_head_count(16, shape=DecodeShape(max_qlen=qlen, q_dtype=contract.FP8, kv_dtype=contract.FP8,
                                                   archs=("gfx950",))) == 16
    with pytest.raises(ValueError) as err:
        decode_head_count(16, shape=shape(max_qlen=qlen, dtype=contract.FP8, mode=NP))
    message = str(err.value)
    assert "num_speculative_tokens" in message and "AITER_MLA_DECODE_MODE=persistent" in message
    assert "\n" not in message and "ROCm/aiter#2720" in message


def test_no_kernel_names_the_kv_cache_dtype_when_bf16_would_run(monkeypatch):
    rows = {("gfx942", P, 16, "bf16", "bf16", 1): (("k",), 1)}
    monkeypatch.setattr(contract, "active_table", lambda: contract.KernelTable("v0.0.0", rows))
    fp8 = DecodeShape(q_dtype=contract.FP8, kv_dtype=contract.FP8, archs=("gfx942",))
    with pytest.raises(ValueError, match="use --kv-cache-dtype auto.$") as err:
        decode_head_count(16, shape=fp8)
    assert "AITER v0.0.0 has no persistent MLA decode kernel on gfx942 for 16 heads" in str(err.value)


def test_non_persistent_mode_refuses_query_length_three():
    """ROCm/aiter#2720: non-power-of-two max_seqlen_q is wrong on the non-persistent path."""
    with pytest.raises(ValueError, match="AITER_MLA_DECODE_MODE=persistent"):
        decode_head_count(16, shape=shape(max_qlen=3, mode=NP))
    assert decode_head_count(16, shape=shape(max_qlen=3, mode=P)) == 16


def test_decode_mode_setting():
    assert decode_mode({}) == P
    assert decode_mode({"AITER_MLA_DECODE_MODE": "non-persistent"}) == NP
    with pytest.raises(ValueError, match="AITER_MLA_DECODE_MODE"):
        decode_mode({"AITER_MLA_DECODE_MODE": "fast"})


def test_compile_threads_setting():
    assert compile_threads_setting({}) is None
    assert compile_threads_setting({"AITER_MLA_COMPILE_THREADS": " "}) is None
    assert compile_threads_setting({"AITER_MLA_COMPILE_THREADS": "1"}) == 1
    assert compile_threads_setting({"AITER_MLA_COMPILE_THREADS": " 32 "}) == 32
    assert compile_threads_setting({"AITER_MLA_COMPILE_THREADS": "256"}) == 256
    for bad in ["0", "-2", "1.5", "four", "+3", "\u00b2", "257", "00000001"]:
        with pytest.raises(ValueError, match=re.escape(f"AITER_MLA_COMPILE_THREADS={bad!r} is not a whole number")):
            compile_threads_setting({"AITER_MLA_COMPILE_THREADS": bad})
    # 5000 digits: one line, cut short, never int()'s own limit error
    with pytest.raises(ValueError, match=r"AITER_MLA_COMPILE_THREADS='9{20}\.\.\.\(5000 characters\)' is not"):
        compile_threads_setting({"AITER_MLA_COMPILE_THREADS": "9" * 5000})


@pytest.mark.parametrize("dtype", ["auto", "bfloat16", "fp8", "fp8_e4m3"])
def test_supported_kv_cache_dtypes(dtype):
    check_kv_cache_dtype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "fp8_e5m2", "int8", "fp8_ds_mla"])
def test_unsupported_kv_cache_dtypes_name_the_setting(dtype):
    with pytest.raises(ValueError, match="--kv-cache-dtype"):
        check_kv_cache_dtype(dtype)


@pytest.mark.parametrize("kwargs,word", [
    ({"alibi_slopes": [0.1]}, "ALiBi"),
    ({"sliding_window": 4096}, "sliding window"),
    ({"logits_soft_cap": 30.0}, "soft-cap"),
])
def test_unsupported_features_fail_clearly(kwargs, word):
    args = {"alibi_slopes": None, "sliding_window": None, "logits_soft_cap": None, **kwargs}
    with pytest.raises(ValueError, match=word):
        check_unsupported_features(**args)


def test_no_unsupported_feature_passes():
    check_unsupported_features(None, None, None)
    check_unsupported_features(None, None, 0.0)
