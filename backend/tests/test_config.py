"""Start-up settings and checks: KV-cache dtypes, unsupported features, the planner's compile
threads."""

import re

import pytest

from vllm_aiter_mla.config import check_kv_cache_dtype, check_unsupported_features, compile_threads_setting


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
