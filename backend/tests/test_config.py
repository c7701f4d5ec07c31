"""Start-up checks: head counts, KV-cache dtypes, unsupported features."""

import pytest

from vllm_aiter_mla.config import (
    check_kv_cache_dtype,
    check_unsupported_features,
    decode_head_count,
    is_supported_head_count,
)


@pytest.mark.parametrize("heads,expected", [(16, 16), (128, 128), (32, 128), (64, 128), (96, 128), (112, 128)])
def test_supported_head_counts(heads, expected):
    assert decode_head_count(heads) == expected


@pytest.mark.parametrize("heads", [1, 8, 12, 24, 129, 144, 256])
def test_unsupported_head_counts_fail_with_tensor_parallel_hint(heads):
    with pytest.raises(ValueError, match="--tensor-parallel-size") as err:
        decode_head_count(heads)
    assert f"{heads} heads per GPU" in str(err.value)


def test_hint_lists_tensor_parallel_sizes_that_work():
    # DeepSeek-V3: 128 heads. TP16 leaves 8 per GPU; TP 1/2/4/8 give 128/64/32/16.
    with pytest.raises(ValueError) as err:
        decode_head_count(8, total_heads=128)
    assert "[1, 2, 4, 8]" in str(err.value)


def test_is_supported_head_count_matches_decode_head_count():
    for h in range(1, 300):
        if is_supported_head_count(h):
            assert decode_head_count(h) in (16, 128)
        else:
            with pytest.raises(ValueError):
                decode_head_count(h)


@pytest.mark.parametrize("dtype", ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3"])
def test_supported_kv_cache_dtypes(dtype):
    check_kv_cache_dtype(dtype)


@pytest.mark.parametrize("dtype", ["fp8_e5m2", "int8", "fp8_ds_mla"])
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
