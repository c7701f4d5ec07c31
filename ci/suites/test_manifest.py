"""Selector suite, image part: the plugin is registered and the installed stack is the manifest's.

Runs in the image (`selftest selector`, no GPU needed). Without an image manifest
(this repository's CI) the manifest checks skip; ROCM_VLLM_MANIFEST names the file.
"""
from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

CI_DIR = Path(__file__).resolve().parent.parent
if str(CI_DIR) not in sys.path:
    sys.path.insert(0, str(CI_DIR))

from selftest.manifest import Manifest, ManifestError, load_manifest, manifest_path  # noqa: E402
from selftest.versions import installed_version  # noqa: E402

PLUGIN_PACKAGE = "vllm_aiter_mla"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    path = manifest_path(os.environ)
    if not Path(path).exists() and "ROCM_VLLM_MANIFEST" not in os.environ:
        pytest.skip(f"no image manifest at {path} (not in an image)")
    try:
        return load_manifest(os.environ)
    except ManifestError as exc:
        pytest.fail(str(exc))


def _release(version: str) -> str:
    """'0.32.0+rocm7.2.3.git5df63a72' -> '0.32.0' (local build tags are labels)."""
    return version.split("+", 1)[0]


def test_backend_plugin_is_registered() -> None:
    plugins = [ep for ep in entry_points(group="vllm.general_plugins")
               if ep.value.split(":", 1)[0].split(".", 1)[0] == PLUGIN_PACKAGE]
    assert plugins, f"no vllm.general_plugins entry point of {PLUGIN_PACKAGE} (is the backend installed?)"
    for ep in plugins:
        assert callable(ep.load())


def test_vllm_version_is_the_manifests(manifest: Manifest) -> None:
    wanted = manifest.vllm.get("version", "")
    if not wanted:
        pytest.skip("manifest names no vLLM version")
    assert _release(installed_version("vllm")) == _release(wanted)


def test_aiter_version_is_the_manifests(manifest: Manifest) -> None:
    if manifest.aiter is None:
        pytest.skip("manifest states the image has no AITER")
    wanted = manifest.aiter.get("version", "")
    found = installed_version("aiter")
    assert found, "aiter is not installed but the manifest lists it"
    if wanted:
        assert _release(found) == _release(wanted)


def test_manifest_pins_full_commits(manifest: Manifest) -> None:
    commits = {"vllm.commit": manifest.vllm.get("commit", "")}
    if manifest.aiter is not None:
        commits |= {"aiter.commit": manifest.aiter.get("commit", ""),
                    "aiter.ck_commit": manifest.aiter.get("ck_commit", "")}
    bad = {k: v for k, v in commits.items()
           if v and not (len(v) == 40 and all(c in "0123456789abcdef" for c in v))}
    assert not bad, f"manifest commits must be 40-hex: {bad}"
