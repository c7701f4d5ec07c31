"""Kernel choice (explicit, never a fallback) and the package's install contract."""

import builtins
import json
import logging
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points, requires
from pathlib import Path

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


def test_package_requires_the_runtime_alone():
    """pip install of the backend must not pull vLLM, PyTorch, Triton or AITER from an index: it
    requires the image's runtime (on no index) and nothing else."""
    hard = [r for r in (requires("vllm-aiter-mla") or []) if "extra ==" not in r]
    assert hard == ["rocm-vllm-runtime"]


def test_importing_the_plugin_imports_none_of_the_runtime():
    """vLLM imports the plugin's module in every process: the runtime is imported only when asked
    (register, the start-up measurement), so its absence is one line, never an import error."""
    code = ("import sys; import vllm_aiter_mla.plugin; "
            "print(sorted(m for m in sys.modules if m.startswith('rocm_vllm_runtime')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert proc.returncode == 0 and proc.stdout.split("\n")[-2] == "[]", proc.stdout + proc.stderr[-2000:]


def test_entry_point_is_the_plugin_register_function():
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "aiter_mla"]
    assert len(eps) == 1
    from vllm_aiter_mla.plugin import register

    assert eps[0].load() is register


def _track_versions() -> list[str]:
    """The vLLM release of each track in the repository's versions.json, newest first."""
    data = json.loads((Path(__file__).resolve().parents[2] / "versions.json").read_text())
    return sorted((t["vllm"]["version"] for t in data["tracks"].values()),
                  key=lambda v: tuple(map(int, v.split("."))), reverse=True)


def _covered_versions() -> list[str]:
    """The tracks' releases up to the newest one the plugin declares (SUPPORTED_VLLM's upper bound
    X.Y: the tracks before it; a newer track is one the plugin steps aside on)."""
    from vllm_aiter_mla import SUPPORTED_VLLM

    upper = tuple(int(n) for n in re.search(r"<\s*(\d+)\.(\d+)", SUPPORTED_VLLM).groups())
    return [v for v in _track_versions() if tuple(map(int, v.split(".")))[:2] < upper]


def _gate_cases() -> list[tuple[str | None, bool]]:
    versions = _covered_versions()
    cases: list[tuple[str | None, bool]] = []
    for version in versions:
        major, minor, patch = map(int, version.split("."))
        cases += [(version, True), (f"{version}+rocm72", True), (f"{major}.{minor}.{patch + 1}", True),
                  (f"{version}rc1.dev5+g5df63a720", False)]
    # tracks past the declared range: the plugin steps aside there (tools.pins verify holds the range
    # to run from the oldest track up to a track)
    cases += [(version, False) for version in _track_versions() if version not in versions]
    newest, oldest = (tuple(map(int, v.split("."))) for v in (versions[0], versions[-1]))
    cases += [(f"{newest[0]}.{newest[1] + 1}.0", False), (f"{oldest[0]}.{oldest[1] - 1}.9", False),
              (None, False), ("not-a-version", False)]
    return cases


@pytest.mark.parametrize("found,ok", _gate_cases())
def test_vllm_version_gate_is_the_release_tracks(found, ok):
    """Every track's vLLM up to the newest the plugin declares (and its patch releases, local builds)
    is served; newer tracks, the minor releases on either side, pre-releases and unreadable versions
    are not."""
    from vllm_aiter_mla.plugin import check_vllm_version, vllm_version_problem

    assert (vllm_version_problem(found) is None) == ok
    if ok:
        check_vllm_version(found)
    else:
        with pytest.raises(RuntimeError, match="Install a matching vLLM"):
            check_vllm_version(found)


def test_outside_the_range_the_plugin_registers_nothing_and_logs_one_error(monkeypatch, caplog):
    """vLLM loads general plugins without catching their errors: register() must not raise, or
    every vLLM process fails to start. It leaves vLLM's own backend in place instead."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_aiter_mla import plugin

    newest = tuple(map(int, _track_versions()[0].split(".")))
    unsupported = f"{newest[0]}.{newest[1] + 1}.0"
    before = AttentionBackendEnum.ROCM_AITER_MLA.get_path()
    AttentionBackendEnum.ROCM_AITER_MLA.clear_override()
    builtin = AttentionBackendEnum.ROCM_AITER_MLA.get_path()
    monkeypatch.setattr(plugin, "_installed_vllm_version", lambda: unsupported)
    try:
        with caplog.at_level(logging.ERROR, logger="vllm.aiter_mla"):
            plugin.register()
        assert AttentionBackendEnum.ROCM_AITER_MLA.get_path() == builtin != plugin.ROCM_BACKEND_PATH
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and unsupported in errors[0] and "built-in" in errors[0], errors
    finally:
        if before == plugin.ROCM_BACKEND_PATH:
            from vllm.v1.attention.backends.registry import register_backend

            register_backend(AttentionBackendEnum.ROCM_AITER_MLA, before)


def test_without_the_runtime_the_plugin_registers_nothing_and_logs_one_error(monkeypatch, caplog):
    """The runtime missing (a plugin installed alone): register() names it in one line, vLLM's own
    backend stays."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_aiter_mla import plugin

    before = AttentionBackendEnum.ROCM_AITER_MLA.get_path()
    AttentionBackendEnum.ROCM_AITER_MLA.clear_override()
    builtin = AttentionBackendEnum.ROCM_AITER_MLA.get_path()
    # a None entry makes the import fail as a missing package does
    monkeypatch.setitem(sys.modules, "rocm_vllm_runtime", None)
    monkeypatch.setitem(sys.modules, "rocm_vllm_runtime.distributions", None)
    try:
        with caplog.at_level(logging.ERROR, logger="vllm.aiter_mla"):
            plugin.register()
        assert AttentionBackendEnum.ROCM_AITER_MLA.get_path() == builtin != plugin.ROCM_BACKEND_PATH
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "rocm_vllm_runtime" in errors[0] and "built-in" in errors[0], errors
    finally:
        if before == plugin.ROCM_BACKEND_PATH:
            from vllm.v1.attention.backends.registry import register_backend

            register_backend(AttentionBackendEnum.ROCM_AITER_MLA, before)


@pytest.mark.parametrize("found,status", [(None, 1), ("0.0.1", 1)])
def test_build_check_stops_in_one_line(found, status, monkeypatch, capsys):
    from vllm_aiter_mla import plugin

    monkeypatch.setattr(plugin, "_installed_vllm_version", lambda: found)
    assert plugin.main(["check"]) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "versions.json tracks" in err[0]
    monkeypatch.setattr(plugin, "_installed_vllm_version", lambda: _track_versions()[-1])
    assert plugin.main(["check"]) == 0
    assert plugin.main([]) == 2


VALIDATION_GRID = [
    dict(dtype=dtype, kv_cache_dtype=kv, head_size=head, block_size=block, use_dcp=dcp, use_non_causal=nc)
    for dtype in ("bfloat16", "float16", "float32")
    for kv in ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
    for head in (576, 512, 320)
    for block in (None, 1, 16)
    for dcp in (False, True)
    for nc in (False, True)
]


def test_vllms_validation_of_this_backend_is_the_built_ins():
    """The registered backend is vLLM's built-in ROCM_AITER_MLA for vLLM's selection: for every
    dtype, KV dtype, latent size, block size, DCP and non-causal setting, vLLM's validation gives
    the same reasons (so the plugin never moves a model to another backend)."""
    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    from vllm_aiter_mla.backend import AiterMLABackend

    for case in VALIDATION_GRID:
        kwargs = dict(case, dtype=getattr(torch, case["dtype"]), use_mla=True, has_sink=False, use_sparse=False,
                      use_mm_prefix=False, use_per_head_quant_scales=False,
                      device_capability=DeviceCapability(9, 4), attn_type="decoder")
        try:
            expected = builtin.AiterMLABackend.validate_configuration(**kwargs)
        except ImportError:  # the built-in's non-causal check imports AITER
            with pytest.raises(ImportError):
                AiterMLABackend.validate_configuration(**kwargs)
            continue
        assert AiterMLABackend.validate_configuration(**kwargs) == expected, case
    assert AiterMLABackend.supports_dcp() is builtin.AiterMLABackend.supports_dcp()
    assert AiterMLABackend.get_name() == "ROCM_AITER_MLA"
