"""Selector suite: which attention backend vLLM picks for an MLA model, and why.

Runs the installed vLLM's real ROCm selection code (RocmPlatform reporting the arch of each
row; the same rows on every release track) with this package installed as a plugin. Needs no GPU: it runs in the
repository's CI on CPU and inside the image (`selftest selector`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from unittest import mock

import pytest

from rocm_vllm_runtime.guard import kfd_path
from rocm_vllm_runtime.manifest import AITER_DISTRIBUTIONS, Manifest, manifest_path, read_manifest, release
from rocm_vllm_runtime.serve import tiny_model
from rocm_vllm_runtime.versions import installed

from .rocm_fake import rocm_platform, select_for, select_mla_backend

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


# ---- never less than vLLM's built-in: selection with the plugin equals selection without it ----

# Configurations of an MLA layer (vLLM's AttentionSelectorConfig fields) that vLLM's built-in
# ROCM_AITER_MLA serves: with the plugin, vLLM's selection must land on ROCM_AITER_MLA exactly
# where it lands without it. `non_causal_kernels`: AITER reports non-causal decode kernels (an
# AITER of gfx950; the stand-in for what `import aiter` answers on such a host).
PARITY_ROWS = [
    ("bf16", "gfx942", {}, False),
    ("block-size-1", "gfx942", {"block_size": 1}, False),
    ("dcp", "gfx942", {"use_dcp": True}, False),
    ("dcp-fp8", "gfx950", {"use_dcp": True, "kv_cache_dtype": "fp8"}, False),
    ("fp16-model", "gfx942", {"dtype": "float16"}, False),
    ("fp16-model-fp16-kv", "gfx950", {"dtype": "float16", "kv_cache_dtype": "float16"}, False),
    ("fp8-e5m2", "gfx942", {"kv_cache_dtype": "fp8_e5m2"}, False),
    ("fp8-gfx950", "gfx950", {"kv_cache_dtype": "fp8"}, False),
    ("latent-512", "gfx942", {"head_size": 512}, False),
    ("latent-320", "gfx950", {"head_size": 320}, False),
    ("non-causal-gfx950", "gfx950", {"use_non_causal": True}, True),
    ("non-causal-dcp-gfx950", "gfx950", {"use_non_causal": True, "use_dcp": True}, True),
    ("adaptive-verification", "gfx942", {"use_adaptive_verification": True}, False),
    ("kv-connector", "gfx942", {"use_kv_connector": True}, False),
    # what the built-in does not serve either: the same other backend, or the same error
    ("non-causal-gfx942", "gfx942", {"use_non_causal": True}, False),
    ("sliding-window", "gfx942", {"has_sliding_window": True}, False),
    ("attention-sinks", "gfx942", {"has_sink": True}, False),
]
NOT_SERVED = ("non-causal-gfx942", "sliding-window", "attention-sinks")


def _parity_fields(fields: dict) -> dict:
    import torch

    return {k: getattr(torch, v) if k == "dtype" else v for k, v in fields.items()}


@contextlib.contextmanager
def _non_causal_kernels(present: bool):
    """AITER's answer to 'has mla_decode_fwd non-causal kernels here' (needs `import aiter`)."""
    import vllm._aiter_ops as aiter_ops
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    if not present:
        yield
        return
    with mock.patch.object(aiter_ops.rocm_aiter_ops, "mla_decode_supports_non_causal", classmethod(lambda cls: True)), \
            mock.patch.object(builtin, "_aiter_mla_non_causal_asm_kernels", lambda: True):
        yield


def _select_with_and_without_plugin(arch: str, fields: dict, non_causal_kernels: bool, backend: str | None):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_aiter_mla.plugin import register

    with rocm_platform(arch, ON, True), _non_causal_kernels(non_causal_kernels):
        with_plugin = select_for(_parity_fields(fields), backend)
        AttentionBackendEnum.ROCM_AITER_MLA.clear_override()
        try:
            without = select_for(_parity_fields(fields), backend)
        finally:
            register()
    return with_plugin, without


@pytest.mark.parametrize("backend", [None, "ROCM_AITER_MLA"], ids=["auto", "explicit"])
@pytest.mark.parametrize("row", PARITY_ROWS, ids=[r[0] for r in PARITY_ROWS])
def test_selection_with_the_plugin_lands_on_aiter_mla_wherever_vllm_alone_does(row, backend):
    name, arch, fields, non_causal_kernels = row
    with_plugin, without = _select_with_and_without_plugin(arch, fields, non_causal_kernels, backend)
    if without == VLLM_BUILTIN_AITER:
        assert with_plugin == OURS, f"{name}: vLLM alone picks its AITER MLA, with the plugin {with_plugin}"
    else:
        assert with_plugin == without.replace(VLLM_BUILTIN_AITER, OURS), f"{name}: {with_plugin} vs {without}"


@pytest.mark.parametrize("row", [r for r in PARITY_ROWS if r[0] not in NOT_SERVED],
                         ids=[r[0] for r in PARITY_ROWS if r[0] not in NOT_SERVED])
def test_vllm_alone_serves_these_rows_with_its_aiter_mla(row):
    """The rows above are rows the built-in really serves (else the parity test proves nothing)."""
    name, arch, fields, non_causal_kernels = row
    _, without = _select_with_and_without_plugin(arch, fields, non_causal_kernels, None)
    assert without == VLLM_BUILTIN_AITER, f"{name}: vLLM alone picks {without}"


# ---- which implementation runs a layer: the own path, or vLLM's built-in (delegation) ----


def _tiny_model_dir() -> str:
    for candidate in (os.environ.get("TINY_MLA_MODEL"), tiny_model({}),
                      str(Path(__file__).resolve().parents[2] / "runtime" / "models" / "tiny-mla")):
        if candidate and (Path(candidate) / "config.json").is_file():
            return candidate
    pytest.fail("tiny MLA model not found: set TINY_MLA_MODEL to its directory")


def _vllm_config(arch: str, dtype: str = "bfloat16", tp: int = 1, dcp: int = 1, spec_tokens: int = 0,
                 kv: str = "auto", adaptive: bool = False, non_causal: bool = False):
    """A real VllmConfig of the tiny MLA model (16 heads), made as on a host with ``arch`` (the
    platform checks the config: vLLM's ROCm one, as there): `tp` divides its heads over GPUs."""
    with rocm_platform(arch, ON, True):
        return _make_vllm_config(dtype, tp, dcp, spec_tokens, kv, adaptive, non_causal)


def _make_vllm_config(dtype: str, tp: int, dcp: int, spec_tokens: int, kv: str, adaptive: bool, non_causal: bool):
    from vllm.config import AttentionConfig, CacheConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    model = ModelConfig(model=_tiny_model_dir(), skip_tokenizer_init=True, dtype=dtype)
    parallel = ParallelConfig(tensor_parallel_size=tp, decode_context_parallel_size=dcp)
    spec = None
    if spec_tokens:
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=spec_tokens, prompt_lookup_max=3,
                                 prompt_lookup_min=1, target_model_config=model, target_parallel_config=parallel)
    config = VllmConfig(model_config=model, parallel_config=parallel, speculative_config=spec,
                        cache_config=CacheConfig(cache_dtype=kv), attention_config=AttentionConfig())
    if adaptive:  # vLLM validates it against its drafting methods; the flag is what the built-in reads
        config.speculative_config.enable_adaptive_verification = True
    config.attention_config.use_non_causal = non_causal
    return config


def _measuring_kernels() -> contextlib.AbstractContextManager:
    """The kernels routing measures each decode call with: AITER's where it is installed (an AMD
    host), else the pure-PyTorch reference standing in for a right AITER."""
    from vllm_aiter_mla.kernels import KERNELS_ENV

    if importlib.util.find_spec("aiter") is not None:
        return contextlib.nullcontext()
    return mock.patch.dict(os.environ, {KERNELS_ENV: "reference"})


def _route(arch: str, config, kv: str = "auto"):
    from vllm_aiter_mla.backend import layer_route

    heads = config.model_config.get_num_attention_heads(config.parallel_config)
    with rocm_platform(arch, ON, True), _measuring_kernels():
        return layer_route(config, heads, 576, kv)


def _installed_release() -> tuple[int, int]:
    from vllm_aiter_mla.plugin import _installed_vllm_version

    major, minor = release(_installed_vllm_version()).split(".")[:2]
    return int(major), int(minor)


# name, arch, config settings, built-in predicate patches (or the kernels the measurement runs) -> "own" or a
# word of the delegation reason
ROUTE_ROWS = [
    ("bf16-16-heads", "gfx942", {}, {}, "own"),
    ("bf16-16-heads-gfx950", "gfx950", {}, {}, "own"),
    ("fp8-kv-gfx942", "gfx942", {"kv": "fp8"}, {}, "own"),
    ("mtp-2", "gfx942", {"spec_tokens": 1}, {}, "own"),
    ("dcp", "gfx942", {"tp": 2, "dcp": 2}, {}, "decode context parallelism"),
    ("fp16-model", "gfx942", {"dtype": "float16"}, {}, "model dtype float16"),
    ("fp16-kv", "gfx950", {"dtype": "float16", "kv": "float16"}, {}, "float16"),
    ("fp8-e5m2", "gfx942", {"kv": "fp8_e5m2"}, {}, "fp8_e5m2"),
    ("non-causal", "gfx950", {"non_causal": True}, {}, "non-causal"),
    # MTP with 4+ speculative tokens on gfx942: the built-in's own calls, measured at start-up (0.34's
    # built-in verifies these with its Triton kernel: delegated for that reason there)
    ("mtp-5-bf16-gfx942", "gfx942", {"spec_tokens": 4}, {}, "own"),
    ("mtp-8-bf16-gfx942", "gfx942", {"spec_tokens": 7}, {}, "own"),
    ("mtp-5-fp8-gfx942", "gfx942", {"spec_tokens": 4, "kv": "fp8"}, {}, "own"),
    ("mtp-8-fp8-gfx942", "gfx942", {"spec_tokens": 7, "kv": "fp8"}, {}, "own"),
    # 8 heads bf16 past query length 4: the built-in decodes those without work buffers
    ("8-heads-mtp-5-gfx942", "gfx942", {"tp": 2, "spec_tokens": 4}, {}, "without persistent work buffers"),
    # the built-in's own predicates, as they answer on a gfx950 host with AITER's kernels
    ("fp8-prefill-gfx950", "gfx950", {"kv": "fp8"}, {"_fp8_mla_prefill_supported": True}, "fp8 prefill"),
    ("8-heads-gfx950", "gfx950", {"tp": 2}, {}, "unpadded"),
    ("8-heads-gfx942", "gfx942", {"tp": 2}, {}, "own"),
]


@pytest.mark.parametrize("row", ROUTE_ROWS, ids=[r[0] for r in ROUTE_ROWS])
def test_each_layer_runs_the_own_path_or_vllms_built_in(row):
    name, arch, settings, patches, expected = row
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

    config = _vllm_config(arch, **settings)
    if settings.get("spec_tokens", 0) >= 4 and hasattr(builtin, "_asm_causal_verify_unsupported"):
        expected = "Triton kernel"  # the release's built-in verifies past query length 4 itself
    with contextlib.ExitStack() as stack:
        for attr, value in patches.items():
            stack.enter_context(mock.patch.object(builtin, attr, lambda value=value: value))
        route = _route(arch, config, settings.get("kv", "auto"))
    if expected == "own":
        assert route.own, f"{name}: {route.describe()}"
        # the own path calls AITER with the built-in's head count, read from the running release
        heads = config.model_config.get_num_attention_heads(config.parallel_config)
        with rocm_platform(arch, ON, True):
            assert route.decode_heads == builtin.AiterMLAHelper.get_actual_mla_num_heads(heads), name
    else:
        assert not route.own and expected in "; ".join(route.reasons), f"{name}: {route.describe()}"


def test_adaptive_verification_follows_the_built_in_of_the_running_vllm():
    """0.33's built-in verifies variable-length drafts (QueryLenSupport.VARLEN): delegated there;
    0.32's built-in verifies uniform drafts, as the own path does: own."""
    config = _vllm_config("gfx942", spec_tokens=2, adaptive=True)
    route = _route("gfx942", config)
    if _installed_release() >= (0, 33):
        assert not route.own and "adaptive" in route.reasons[0]
    else:
        assert route.own, route.describe()


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
    manifest records from its lock (docker/requirements-ray.txt)."""
    recorded = _manifest().ray
    expected = recorded.version if recorded else None
    assert expected, "the image manifest records no Ray version (ray.version): rebuild the image from Dockerfile.rocm"
    import ray

    assert ray.__version__ == expected, (f"ray {ray.__version__} is installed but the image manifest records "
                                        f"{expected}: rebuild the image (docker/requirements-ray.txt)")


@pytest.mark.gpu
def test_vllm_platform_is_rocm_on_an_amd_host():
    """Inside the image on an AMD host vLLM must detect ROCm (it does so through `import amdsmi`);
    otherwise it fails later with "Failed to infer device type". Run in a fresh process: the
    tests above replace vLLM's current platform."""
    kfd = kfd_path(os.environ)
    if not os.path.exists(kfd):
        pytest.skip(f"no {kfd}: no AMD GPU in this container")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    probe = "from vllm.platforms import current_platform as p; print(type(p).__name__, p.is_rocm())"
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split()[-1:] == ["True"], (
        "vLLM's platform is not ROCm (amdsmi missing, or no GPU visible): "
        + (proc.stdout + proc.stderr)[-1500:])
