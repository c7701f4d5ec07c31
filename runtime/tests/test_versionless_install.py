"""An installed distribution whose package metadata has no version (a broken or hand-made
install) is named as such by every reader of installed versions, never reported as "not
installed" and never a traceback: the plugin's build check and its registration, the kernel
contract's table choice, the self-test report and the image manifest's vLLM step.

The distributions are real `.dist-info` folders on sys.path, read by importlib.metadata as the
image's would be."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rocm_vllm_runtime import manifest as mf
from rocm_vllm_runtime import report
from rocm_vllm_runtime.versions import NO_VERSION_SHOWN, installed, stack_versions


def dist_info(root: Path, name: str, version: str | None, top_level: str) -> None:
    """A `.dist-info` folder for `name` (import name `top_level`); METADATA without a Version
    line when version is None."""
    folder = root / f"{name.replace('-', '_')}-0.dist-info"
    folder.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}"] + ([f"Version: {version}"] if version else [])
    (folder / "METADATA").write_text("\n".join(lines) + "\n")
    (folder / "top_level.txt").write_text(top_level + "\n")


@pytest.fixture
def versionless(tmp_path, monkeypatch):
    """vllm and amd-aiter installed without a version, found before any real install."""
    root = tmp_path / "site"
    dist_info(root, "vllm", None, "vllm")
    dist_info(root, "amd-aiter", None, "aiter")
    monkeypatch.syspath_prepend(str(root))
    return root


def test_the_readers_tell_no_version_from_not_installed(versionless):
    from vllm_aiter_mla.distributions import NO_VERSION, version_of

    assert version_of("vllm") == NO_VERSION and version_of("no-such-distribution-xyz") is None
    assert installed("vllm") == ("vllm", "")
    assert installed("no-such-distribution-xyz") is None


def test_the_plugin_check_names_the_missing_version(versionless, capsys):
    from vllm_aiter_mla import plugin

    assert plugin.main(["check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "no version" in err[0] and "not installed" not in err[0] and "reinstall vLLM" in err[0]


def test_registration_logs_one_line_naming_the_missing_version(versionless, caplog):
    from vllm_aiter_mla import plugin

    with caplog.at_level(logging.ERROR, logger="vllm.aiter_mla"):
        plugin.register()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "no version" in errors[0] and "not installed" not in errors[0], errors


def test_the_kernel_contract_names_the_missing_aiter_version(versionless, monkeypatch):
    from vllm_aiter_mla import contract

    monkeypatch.delenv(contract.TABLE_ENV, raising=False)
    contract.installed_aiter_version.cache_clear()
    monkeypatch.setattr(contract, "installed_aiter_version", contract.installed_aiter_version.__wrapped__)
    with pytest.raises(ValueError, match="AITER is installed, but its package metadata .* has no version"):
        contract.active_table({})


def test_the_report_shows_installed_without_a_version(versionless):
    versions = stack_versions()
    assert versions["vllm"] == versions["aiter"] == NO_VERSION_SHOWN
    text = report.render(report.to_json([], versions, [], "none"))
    assert f"vllm {NO_VERSION_SHOWN}" in text and "(not installed)" not in text


def test_the_manifest_step_refuses_a_vllm_without_a_version(versionless):
    with pytest.raises(mf.ManifestError, match=r"vLLM in the vllm stage \(distribution vllm\) has no version"):
        mf.with_vllm(None, {"VLLM_VERSION": "0.33.0", "GPU_ARCHS": "gfx942"})
