"""Kernel choice (explicit, never a fallback) and the package's install contract."""

import builtins
from importlib.metadata import entry_points, requires

import pytest

from vllm_aiter_mla import kernels, reference
from vllm_aiter_mla.kernels import AiterUnavailableError, kernel_mode, load_kernels


def test_default_mode_is_aiter():
    assert kernel_mode({}) == "aiter"
    assert kernel_mode({"AITER_MLA_KERNELS": "reference"}) == "reference"


def test_unknown_mode_names_the_setting():
    with pytest.raises(ValueError, match="AITER_MLA_KERNELS"):
        kernel_mode({"AITER_MLA_KERNELS": "triton"})


def test_reference_mode_gives_reference_kernels():
    k = load_kernels("reference")
    assert k.name == "reference"
    assert k.mla_decode_fwd is reference.mla_decode_fwd


def test_missing_aiter_fails_with_fix_instead_of_falling_back(monkeypatch):
    real_import = builtins.__import__

    def no_aiter(name, *args, **kwargs):
        if name == "aiter" or name.startswith("aiter."):
            raise ImportError("No module named 'aiter'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_aiter)
    kernels.load_kernels.cache_clear()
    try:
        with pytest.raises(AiterUnavailableError) as err:
            load_kernels("aiter")
    finally:
        kernels.load_kernels.cache_clear()
    message = str(err.value)
    assert "import aiter" in message and "TRITON_MLA" in message and "AITER_MLA_KERNELS=reference" in message


def test_package_declares_no_install_requirements():
    """pip install of the backend must not pull vLLM, PyTorch or Triton from an index."""
    hard = [r for r in (requires("vllm-aiter-mla") or []) if "extra ==" not in r]
    assert hard == []


def test_entry_point_is_the_plugin_register_function():
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "aiter_mla"]
    assert len(eps) == 1
    from vllm_aiter_mla.plugin import register

    assert eps[0].load() is register


@pytest.mark.parametrize("found,ok", [
    ("0.32.0", True), ("0.32.0+rocm723", True), ("0.32.1", True), ("0.32.0rc1.dev5+g5df63a720", False),
    ("0.31.2", False), ("0.33.0", False), (None, False),
])
def test_vllm_version_gate(found, ok):
    from vllm_aiter_mla.plugin import check_vllm_version

    if ok:
        check_vllm_version(found)
    else:
        with pytest.raises(RuntimeError):
            check_vllm_version(found)


def test_float16_models_are_not_offered_to_this_backend():
    """AITER's MLA decode rejects fp16 queries: vLLM must pick another backend for fp16
    models (with its usual message), not select this one and fail at the first decode."""
    import torch

    from vllm_aiter_mla.backend import AiterMLABackend

    assert AiterMLABackend.supported_dtypes == [torch.bfloat16]
    assert not AiterMLABackend.supports_dtype(torch.float16)
    assert AiterMLABackend.supports_dtype(torch.bfloat16)
    assert "float16" not in AiterMLABackend.supported_kv_cache_dtypes


@pytest.mark.parametrize("dtype_name,rejected", [("float16", True), ("bfloat16", False)])
def test_vllm_validation_names_the_dtype_for_fp16(dtype_name, rejected):
    """vLLM's own validation (what its selector reports) refuses fp16 for this backend."""
    import torch
    from vllm.platforms.interface import DeviceCapability

    from vllm_aiter_mla.backend import AiterMLABackend

    reasons = AiterMLABackend.validate_configuration(
        head_size=576, dtype=getattr(torch, dtype_name), kv_cache_dtype="auto", block_size=16, use_mla=True,
        has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
        device_capability=DeviceCapability(9, 4), attn_type="decoder",
    )
    assert ("dtype not supported" in reasons) == rejected, reasons
