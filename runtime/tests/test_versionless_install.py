"""An installed distribution whose package metadata has no version (a broken or hand-made
install) is named as such by every reader of installed versions, never reported as "not
installed" and never a traceback: the plugin's build check and its registration,
the self-test report, the image manifest's vLLM step and the build
scripts' pinned distributions. Metadata that is not UTF-8 is one line naming the distribution
(the self-test report is still written); the plugin's registration never raises.

The distributions are real `.dist-info` folders on sys.path, read by importlib.metadata as the
image's would be."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocm_vllm_runtime import manifest as mf
from rocm_vllm_runtime import report
from rocm_vllm_runtime.versions import NO_VERSION_SHOWN, installed, stack_versions

ROOT = Path(__file__).resolve().parents[2]


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
    from rocm_vllm_runtime.distributions import NO_VERSION, version_of

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


def test_the_report_shows_installed_without_a_version(versionless):
    versions = stack_versions()
    assert versions["vllm"] == versions["aiter"] == NO_VERSION_SHOWN
    text = report.render(report.to_json([], versions, [], "none"))
    assert f"vllm {NO_VERSION_SHOWN}" in text and "(not installed)" not in text


def test_the_manifest_step_refuses_a_vllm_without_a_version(versionless):
    with pytest.raises(mf.ManifestError, match=r"vLLM in the vllm stage \(distribution vllm\) has no version"):
        mf.with_vllm(None, {"VLLM_VERSION": "0.33.0", "GPU_ARCHS": "gfx942"})


# ------------------------------------------------------------------ metadata that is not UTF-8

@pytest.fixture
def not_utf8(tmp_path, monkeypatch):
    """vllm installed with a METADATA file that is not UTF-8 text (a Latin-1 byte in its
    summary), found before any real install; the folder is returned for child processes."""
    root = tmp_path / "site"
    folder = root / "vllm-0.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\nSummary: caf\xe9\n")
    (folder / "top_level.txt").write_text("vllm\n")
    monkeypatch.syspath_prepend(str(root))
    return root


def test_the_reader_names_metadata_that_is_not_utf8(not_utf8):
    from rocm_vllm_runtime.distributions import MetadataError, version_of

    with pytest.raises(MetadataError, match=r"^the package metadata of the installed vllm is not UTF-8 text "
                                            r"\(byte \d+\): reinstall it \(pip install --force-reinstall vllm\)$"):
        version_of("vllm")


def test_the_plugin_check_names_metadata_that_is_not_utf8(not_utf8):
    proc = subprocess.run([sys.executable, "-m", "vllm_aiter_mla.plugin", "check"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(not_utf8), *sys.path])}, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "not UTF-8" in err[0] and "reinstall" in err[0], err


def test_registration_never_raises_on_metadata_that_is_not_utf8(not_utf8, caplog):
    from vllm_aiter_mla import plugin

    with caplog.at_level(logging.ERROR, logger="vllm.aiter_mla"):
        plugin.register()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "not UTF-8" in errors[0] and "not registered" in errors[0], errors


def test_selftest_writes_its_report_beside_metadata_that_is_not_utf8(not_utf8, tmp_path):
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "test_selector.py").write_text("def test_ok():\n    assert True\n")
    out = tmp_path / "report.json"
    env = {**os.environ, "SELFTEST_SUITES": str(suites), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": os.pathsep.join([str(not_utf8), *sys.path])}
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime", "selector", "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    from rocm_vllm_runtime.versions import UNREADABLE_SHOWN

    assert json.loads(out.read_text())["versions"]["vllm"] == UNREADABLE_SHOWN


def test_the_manifest_step_names_metadata_that_is_not_utf8(not_utf8, tmp_path, capsys):
    rc = mf.main(["vllm", "--out", str(tmp_path / "m.json")], env={"VLLM_VERSION": "0.33.0", "GPU_ARCHS": "gfx942"})
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "not UTF-8" in err[0] and "vllm" in err[0], err


def test_bench_names_entry_points_that_are_not_utf8(tmp_path, monkeypatch):
    """The bench leaves other vLLM plugins out by their entry points: an installed distribution's
    entry_points.txt that is not UTF-8 is one line, through the same reader."""
    from rocm_vllm_runtime import bench
    from rocm_vllm_runtime.distributions import MetadataError

    folder = tmp_path / "site/other_plugin-1.0.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text("Metadata-Version: 2.1\nName: other-plugin\nVersion: 1.0\n")
    (folder / "entry_points.txt").write_bytes(b"[vllm.general_plugins]\ncaf\xe9 = other_plugin:register\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(MetadataError, match=r"^the metadata of an installed distribution with vllm\.general_plugins "
                                            r"entry points is not UTF-8 text \(byte \d+\): reinstall"):
        bench.plugin_names()


# ------------------------------------------------------------------ the plugin never stops vLLM

@pytest.fixture(scope="module")
def registry():
    """vLLM's backend registry, imported once (its import takes seconds, past the examples' deadline)."""
    import vllm.v1.attention.backends.registry as registry

    return registry


@settings(derandomize=True, max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(failure=st.sampled_from([ValueError, OSError, RuntimeError, ImportError, KeyError,
                                AttributeError, TypeError, UnicodeDecodeError, RecursionError]),
       text=st.text(max_size=60), where=st.sampled_from(["version", "registry"]))
def test_registration_never_raises(failure, text, where, registry, monkeypatch, caplog):
    """Whatever goes wrong while registering (reading vLLM's version, vLLM's registry) is one error
    line and no exception: vLLM loads general plugins without catching their errors."""
    from vllm_aiter_mla import plugin

    exc = UnicodeDecodeError("utf-8", b"\xe9", 0, 1, text) if failure is UnicodeDecodeError else failure(text)

    def fail(*_args, **_kwargs):
        raise exc

    if where == "version":
        monkeypatch.setattr(plugin, "_installed_vllm_version", fail)
    else:
        monkeypatch.setattr(plugin, "vllm_version_problem", lambda found: None)
        monkeypatch.setattr(registry, "register_backend", fail)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="vllm.aiter_mla"):
        plugin.register()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "not registered" in errors[0] and "\n" not in errors[0], errors


# ------------------------------------------------------------------ the build scripts' reader

def pinned_dists(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    return subprocess.run([sys.executable, str(ROOT / "docker/pinned_dists.py"), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_pinned_dists_names_a_torch_without_a_version_as_installed(tmp_path):
    site = tmp_path / "site"
    dist_info(site, "torch", None, "torch")
    (site / "torch-0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: torch\n"
                                                     "Requires-Dist: triton-rocm==3.8.0\n")
    dist_info(site, "triton-rocm", "3.8.0", "triton")
    dist_info(site, "amdsmi", "26.0.0", "amdsmi")
    proc = pinned_dists(site, "constraints", str(tmp_path / "c.txt"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "not installed" not in err[0], err
    assert "torch installed without a version" in err[0], err
    proc = pinned_dists(site, "snapshot", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "s.json").read_text())["torch"] == ""


def test_pinned_dists_names_torch_metadata_that_is_not_utf8(tmp_path):
    site = tmp_path / "site"
    (site / "torch-0.dist-info").mkdir(parents=True)
    (site / "torch-0.dist-info/METADATA").write_bytes(b"Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n"
                                                      b"Summary: caf\xe9\nRequires-Dist: triton-rocm==3.8.0\n")
    proc = pinned_dists(site, "snapshot", str(tmp_path / "s.json"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "torch" in err[0] and "not UTF-8" in err[0], err
