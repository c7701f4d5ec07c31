"""Selector suite: which attention backend vLLM picks for an MLA model, and why.

Runs the installed vLLM's real ROCm selection code (RocmPlatform reporting the arch of each
row; the same rows on every release track) with this package installed as a plugin. Needs no GPU: it runs in the
repository's CI on CPU and inside the image (`selftest selector`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from rocm_vllm_runtime.manifest import AITER_DISTRIBUTIONS, Manifest, manifest_path, read_manifest, release
from rocm_vllm_runtime.versions import installed

from .rocm_fake import rocm_platform, select_mla_backend

OURS = "vllm_aiter_mla.backend.AiterMLABackend"
TRITON = "vllm.v1.attention.backends.mla.triton_mla.TritonMLABackend"
VLLM_BUILTIN_AITER = "vllm.v1.attention.backends.mla.rocm_aiter_mla.AiterMLABackend"

ON = {"VLLM_ROCM_USE_AITER": "1"}
ON_MLA_OFF = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MLA": "0"}
ON_MLA_ON = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MLA": "1"}
OFF = {"VLLM_ROCM_USE_AITER": "0"}
UNSET: dict[str, str] = {}

# arch, environment, aiter importable, --attention-backend, --block-size -> class path
# (or "error" for a ValueError; see test_no_valid_backend_names_block_size_and_backends).
DECISION_TABLE = [
    # AITER on (VLLM_ROCM_USE_AITER=1, MLA switch default or 1) on CDNA3/CDNA4: ours.
    ("gfx942", ON, True, None, None, OURS),
    ("gfx942", ON, True, None, 1, OURS),
    ("gfx942", ON, True, None, 16, OURS),
    ("gfx942", ON, True, None, 64, OURS),
    ("gfx942", ON_MLA_ON, True, None, 16, OURS),
    ("gfx950", ON, True, None, None, OURS),
    ("gfx950", ON, True, None, 1, OURS),
    ("gfx950", ON_MLA_ON, True, None, 64, OURS),
    # AITER off, MLA switch off, aiter missing, or an arch AITER does not support: Triton.
    ("gfx942", UNSET, True, None, None, TRITON),
    ("gfx942", OFF, True, None, 16, TRITON),
    ("gfx942", OFF, True, None, 64, TRITON),
    ("gfx942", ON_MLA_OFF, True, None, 16, TRITON),
    ("gfx942", ON, False, None, 16, TRITON),
    ("gfx942", ON, False, None, None, TRITON),
    ("gfx950", OFF, True, None, 64, TRITON),
    ("gfx90a", ON, True, None, 16, TRITON),
    ("gfx90a", ON, True, None, None, TRITON),
    # Block sizes Triton MLA cannot take, with AITER unavailable: no backend.
    ("gfx942", OFF, True, None, 1, "error"),
    ("gfx942", ON_MLA_OFF, True, None, 1, "error"),
    ("gfx942", ON, False, None, 1, "error"),
    ("gfx90a", ON, True, None, 1, "error"),
    # Explicit choice wins over the switches, for every block size.
    ("gfx942", OFF, True, "ROCM_AITER_MLA", None, OURS),
    ("gfx942", OFF, True, "ROCM_AITER_MLA", 1, OURS),
    ("gfx942", UNSET, True, "ROCM_AITER_MLA", 16, OURS),
    ("gfx942", ON, True, "ROCM_AITER_MLA", 64, OURS),
    ("gfx950", ON_MLA_OFF, True, "ROCM_AITER_MLA", 1, OURS),
    ("gfx942", ON, True, "TRITON_MLA", 16, TRITON),
    ("gfx942", ON, True, "TRITON_MLA", 64, TRITON),
]


def _row_id(row: tuple) -> str:
    arch, env, found, backend, block, expected = row
    env_s = ",".join(f"{k.removeprefix('VLLM_ROCM_USE_')}={v}" for k, v in env.items()) or "env-unset"
    aiter = "aiter" if found else "no-aiter"
    return f"{arch}-{env_s}-{aiter}-{backend or 'auto'}-bs{block}-{expected.rsplit('.', 1)[-1]}"


@pytest.fixture(scope="module", autouse=True)
def plugin_loaded():
    """Load general plugins the way every vLLM process does (entry points)."""
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    load_general_plugins()
    yield
    assert AttentionBackendEnum.ROCM_AITER_MLA.get_path() == OURS


@pytest.mark.parametrize("row", DECISION_TABLE, ids=[_row_id(r) for r in DECISION_TABLE])
def test_decision_table(row):
    arch, env, aiter_found, backend, block_size, expected = row
    with rocm_platform(arch, env, aiter_found):
        if expected == "error":
            with pytest.raises(ValueError):
                select_mla_backend(block_size, backend)
        else:
            assert select_mla_backend(block_size, backend) == expected


def test_no_valid_backend_names_block_size_and_backends():
    with rocm_platform("gfx942", OFF, True), pytest.raises(ValueError) as err:
        select_mla_backend(1, None)
    message = str(err.value)
    assert "block_size=1" in message
    assert "TRITON_MLA" in message
    assert "block_size not supported" in message


def test_explicit_backend_that_cannot_serve_fails_with_reason():
    with rocm_platform("gfx942", ON, True), pytest.raises(ValueError) as err:
        select_mla_backend(1, "TRITON_MLA")
    assert "TRITON_MLA" in str(err.value)
    assert "block_size not supported" in str(err.value)


def test_without_the_plugin_vllm_builtin_aiter_mla_is_selected():
    """The documented comparison switch: leave `aiter_mla` out of VLLM_PLUGINS."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    AttentionBackendEnum.ROCM_AITER_MLA.clear_override()
    try:
        with rocm_platform("gfx942", ON, True):
            assert select_mla_backend(16, None) == VLLM_BUILTIN_AITER
            assert select_mla_backend(1, "ROCM_AITER_MLA") == VLLM_BUILTIN_AITER
    finally:
        from vllm_aiter_mla.plugin import register

        register()


def test_vllm_plugins_filter_leaves_plugin_out(monkeypatch):
    from vllm.plugins import load_plugins_by_group

    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    assert "aiter_mla" not in load_plugins_by_group("vllm.general_plugins")
    monkeypatch.setenv("VLLM_PLUGINS", "aiter_mla")
    assert "aiter_mla" in load_plugins_by_group("vllm.general_plugins")


def test_plugin_entry_point_is_registered():
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("aiter_mla") == "vllm_aiter_mla.plugin:register"


def test_installed_vllm_is_supported_by_backend():
    from vllm_aiter_mla.plugin import _installed_vllm_version, check_vllm_version

    check_vllm_version(_installed_vllm_version())


def test_plugin_took_over_vllms_aiter_mla_entry():
    """Outside its supported vLLM range the plugin registers nothing (so vLLM keeps running on its
    built-in backend): an image where that happens fails here, in one line naming the versions."""
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_aiter_mla import SUPPORTED_VLLM
    from vllm_aiter_mla.plugin import _installed_vllm_version

    load_general_plugins()
    path = AttentionBackendEnum.ROCM_AITER_MLA.get_path()
    assert path == OURS, (f"ROCM_AITER_MLA is {path}, not this backend: the plugin did not register on vLLM "
                          f"{_installed_vllm_version()} (it supports {SUPPORTED_VLLM})")


def _manifest() -> Manifest:
    path = Path(manifest_path(os.environ))
    if not path.is_file():
        pytest.skip(f"no image manifest at {path} (not running inside the image)")
    return read_manifest(path)


@pytest.mark.image
def test_installed_vllm_matches_image_manifest():
    from vllm_aiter_mla.plugin import _installed_vllm_version

    recorded = _manifest().vllm
    expected = recorded.version
    if not expected:
        pytest.skip("the image manifest records no vLLM version")
    found = release(_installed_vllm_version())
    assert found == release(expected)
    if recorded.track:  # the release track the image was built for (versions.json tracks)
        assert found.startswith(recorded.track + "."), f"vLLM {found} is not of track {recorded.track}"


@pytest.mark.image
def test_installed_aiter_matches_image_manifest():
    aiter = _manifest().aiter
    expected = aiter.version if aiter else None
    if not expected:
        pytest.skip("the image manifest records no AITER version")
    found = installed(*AITER_DISTRIBUTIONS)
    assert found is not None and found.version == expected, f"installed {found}, manifest {expected}"


@pytest.mark.image
def test_installed_ray_matches_image_manifest():
    """Ray (serving across hosts: compose.ray.yaml, deploy/) imports, at the version the image's
    manifest records from its lock (ci/docker/requirements-ray.txt)."""
    recorded = _manifest().ray
    expected = recorded.version if recorded else None
    assert expected, "the image manifest records no Ray version (ray.version): rebuild the image from Dockerfile.rocm"
    import ray

    assert ray.__version__ == expected, (f"ray {ray.__version__} is installed but the image manifest records "
                                        f"{expected}: rebuild the image (ci/docker/requirements-ray.txt)")


@pytest.mark.gpu
def test_vllm_platform_is_rocm_on_an_amd_host():
    """Inside the image on an AMD host vLLM must detect ROCm (it does so through `import amdsmi`);
    otherwise it fails later with "Failed to infer device type". Run in a fresh process: the
    tests above replace vLLM's current platform."""
    kfd = os.environ.get("ROCM_VLLM_KFD_PATH") or "/dev/kfd"
    if not os.path.exists(kfd):
        pytest.skip(f"no {kfd}: no AMD GPU in this container")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    probe = "from vllm.platforms import current_platform as p; print(type(p).__name__, p.is_rocm())"
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split()[-1:] == ["True"], (
        "vLLM's platform is not ROCm (amdsmi missing, or no GPU visible): "
        + (proc.stdout + proc.stderr)[-1500:])
