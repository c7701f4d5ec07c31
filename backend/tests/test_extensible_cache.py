"""vLLM's extensible KV cache (on by default in 0.34 on CUDA and ROCm) maps the cache's blocks only after
CUDA-graph capture, so the own path could not measure its decode calls on the real cache. Where the user
left the flag unset, the plugin turns it off while vLLM settles its config, in one start-up line naming the
flag that keeps it; where the user asked for it, it stays on (the adapters then warn at start-up)."""
from __future__ import annotations

import logging
import types

import pytest

from vllm_aiter_mla import extensible_cache
from vllm_aiter_mla.extensible_cache import FLAG, RESOLVER, keep_cache_mapped, turned_off


class FakeVllmConfig:
    """The shape of vLLM 0.34's resolver: an unset flag (None) is settled on where the platform supports it,
    once per config."""

    resolved = 0

    def __init__(self, requested: bool | None, use_mla: bool = True, backend: str | None = None,
                 connector: object | None = None):
        self.cache_config = types.SimpleNamespace(**{FLAG: requested})
        self.model_config = types.SimpleNamespace(use_mla=use_mla)
        self.attention_config = types.SimpleNamespace(backend=None if backend is None
                                                      else types.SimpleNamespace(name=backend))
        self.kv_transfer_config = connector

    def _resolve_extensible_kv_cache(self) -> None:
        type(self).resolved += 1
        if getattr(self.cache_config, FLAG) is None:
            setattr(self.cache_config, FLAG, True)


@pytest.fixture
def config_cls(monkeypatch):
    """A fresh fake config class with the plugin's wrapper installed, on a ROCm platform."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    cls = type("VllmConfig", (FakeVllmConfig,), {"resolved": 0})
    assert keep_cache_mapped(cls)
    return cls


def settled(cls, *args, **kwargs) -> bool:
    config = cls(*args, **kwargs)
    config._resolve_extensible_kv_cache()
    return getattr(config.cache_config, FLAG)


def test_left_unset_it_is_turned_off_in_one_line_naming_the_flag_that_keeps_it(config_cls, caplog):
    with caplog.at_level(logging.INFO, logger="vllm.aiter_mla"):
        assert settled(config_cls, None) is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "--enable-extensible-kv-cache" in lines[0] and "\n" not in lines[0], lines
    assert config_cls.resolved == 1  # the release's own resolver ran (its checks and errors kept)


@pytest.mark.parametrize("requested", [True, False])
def test_a_users_choice_is_kept(config_cls, caplog, requested):
    with caplog.at_level(logging.INFO, logger="vllm.aiter_mla"):
        assert settled(config_cls, requested) is requested
    assert not caplog.records


@pytest.mark.parametrize("case", [dict(use_mla=False), dict(backend="TRITON_MLA"), dict(connector=object())],
                         ids=["not-mla", "another-backend", "kv-connector"])
def test_where_the_own_path_does_not_serve_or_a_connector_needs_it_it_stays_on(config_cls, case):
    assert settled(config_cls, None, **case) is True


def test_asked_for_this_backend_by_name_it_is_turned_off(config_cls):
    assert settled(config_cls, None, backend="ROCM_AITER_MLA") is False


def test_a_config_without_a_model_is_left_as_the_release_settled_it(config_cls):
    config = config_cls(None)
    config.model_config = None  # vLLM builds such configs too (no model: nothing the own path serves)
    config._resolve_extensible_kv_cache()
    assert getattr(config.cache_config, FLAG) is True


def test_not_on_rocm_it_stays_on(config_cls, monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_rocm", lambda: False)
    assert settled(config_cls, None) is True


def test_the_resolver_is_wrapped_once_and_only_where_the_release_has_one():
    cls = type("VllmConfig", (FakeVllmConfig,), {"resolved": 0})
    assert keep_cache_mapped(cls) and not keep_cache_mapped(cls)  # vLLM registers plugins in every process
    assert not keep_cache_mapped(type("OlderVllmConfig", (), {}))


def test_the_decision():
    assert turned_off(None, True, True, True, False, False)
    for args in [(True, True, True, True, False, False), (None, False, True, True, False, False),
                 (None, True, False, True, False, False), (None, True, True, False, False, False),
                 (None, True, True, True, True, False), (None, True, True, True, False, True)]:
        assert not turned_off(*args), args


def test_the_running_releases_own_resolver_turns_an_unset_flag_on_and_the_plugin_off(monkeypatch):
    """Read from the running vLLM, not from a version: where its config has the flag, its own resolver (on a
    ROCm platform) turns an unset flag on, the plugin's wrapper turns it off (the KV cache then sized by vLLM's
    profiling, at its ordinary memory default) and keeps an explicit choice; where not, nothing is wrapped."""
    from vllm.config import CacheConfig, VllmConfig
    from vllm.platforms import current_platform

    has_flag = FLAG in getattr(CacheConfig, "__dataclass_fields__", {})
    assert callable(getattr(VllmConfig, RESOLVER, None)) == has_flag
    if not has_flag:
        assert extensible_cache.install() is False
        return
    resolver = getattr(VllmConfig, RESOLVER)  # the release's own, restored afterwards
    monkeypatch.setattr(VllmConfig, RESOLVER, getattr(resolver, "__wrapped__", resolver))
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: True)
    assert getattr(CacheConfig(), FLAG) is None

    def settle(**asked) -> CacheConfig:
        config = types.SimpleNamespace(
            cache_config=CacheConfig(**asked), kv_transfer_config=None,
            model_config=types.SimpleNamespace(use_mla=True),
            parallel_config=types.SimpleNamespace(enable_elastic_ep=False),
            attention_config=types.SimpleNamespace(backend=None))
        VllmConfig._resolve_extensible_kv_cache(config)
        return config.cache_config

    assert getattr(settle(), FLAG) is True  # the release's own default, before the plugin's wrapper
    assert extensible_cache.install() and not extensible_cache.install()
    off = settle()
    assert getattr(off, FLAG) is False and off.resolved_gpu_memory_utilization < 1.0
    assert getattr(settle(**{FLAG: True}), FLAG) is True
