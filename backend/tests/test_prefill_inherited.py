"""The own path's prefill is vLLM's built-in prefill of the release it runs on: the own impl is
the built-in impl with the own decode, so a release's prefill features (0.34's fused k-concat
and gfx950 fused chunked-context gather) are the own path's too, and the own builder hands the
built-in's prefill code what it reads. Run on every track (0.32 here, 0.33 and 0.34 in their
track environments)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadata, MLACommonMetadataBuilder
from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin

from vllm_aiter_mla import vllm_builtin
from vllm_aiter_mla.backend import AiterMLAImpl, AiterMLAMetadata, AiterMLAMetadataBuilder, DecodeKernelsMixin

# What the own impl defines itself: the decode entry, the profile-run reservation of its decode
# work buffers, its constructor (the built-in's, then the own decode's set-up), and two class
# facts about its decode (no LSE returned, no DCP).
# process_weights_after_loading collects the decode calls' measurement begun at the model's construction,
# then runs the built-in's (below)
OWN_DECODE = {"__init__", "forward_mqa", "reserve_workspace", "process_weights_after_loading",
              "can_return_lse_for_decode", "supports_dcp"}
SCRIPT = Path(__file__).with_name("context_gather_interpreted.py")


def _members(cls: type) -> set[str]:
    return {name for name in vars(cls) if name == "__init__" or not name.startswith(("__", "_abc_"))}


def test_the_own_impl_is_the_builtin_impl_with_the_own_decode():
    assert issubclass(AiterMLAImpl, builtin.AiterMLAImpl)
    upstream = set().union(*(_members(c) for c in builtin.AiterMLAImpl.__mro__ if c is not object))
    overridden = (_members(AiterMLAImpl) | _members(DecodeKernelsMixin)) & upstream
    assert overridden <= OWN_DECODE, "the own impl overrides more than its decode: " + ", ".join(
        sorted(overridden - OWN_DECODE))
    assert {"__init__", "forward_mqa"} <= overridden


def test_the_own_weight_processing_collects_the_measurement_then_runs_the_builtins(monkeypatch):
    done = []
    monkeypatch.setattr(builtin.AiterMLAImpl, "process_weights_after_loading",
                        lambda self, act_dtype: done.append(("built-in", act_dtype)))
    monkeypatch.setattr(DecodeKernelsMixin, "_collect_route", lambda self: done.append(("collected",)))
    AiterMLAImpl.process_weights_after_loading(object.__new__(AiterMLAImpl), "bfloat16")
    assert done == [("collected",), ("built-in", "bfloat16")]


def test_every_prefill_method_of_the_builtin_is_the_own_paths():
    """forward_mha and whatever the release's built-in adds to it (0.34: _concat_k_nope_k_pe,
    _compute_prefill_context, _gather_context_chunk, ...) resolve to the built-in's code."""
    for name in _members(builtin.AiterMLAImpl) - OWN_DECODE:
        assert inspect.getattr_static(AiterMLAImpl, name) is inspect.getattr_static(builtin.AiterMLAImpl, name), name
    assert AiterMLAImpl.forward_mha is builtin.AiterMLAImpl.forward_mha
    assert AiterMLAImpl.forward_mqa is DecodeKernelsMixin.forward_mqa


def test_the_own_metadata_is_the_builtins_so_its_prefill_code_accepts_it():
    """0.34's _compute_prefill_context asserts the built-in's metadata class. The common builder
    makes it from the common fields alone, so every field the built-in adds has a default: its
    fp8 prefill fields stay empty (those layers are routed to the built-in), and its forward_mha
    takes the bf16 path."""
    assert issubclass(AiterMLAMetadata, builtin.AiterMLAMetadata)
    common = {f.name for f in dataclasses.fields(MLACommonMetadata)}
    added = [f for f in dataclasses.fields(AiterMLAMetadata) if f.name not in common]
    assert all(f.default is None for f in added if f.name.startswith("fp8_prefill_")), added
    assert all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
               for f in added), [f.name for f in added]


def _builtin_predicate(release_source: str) -> str | None:
    """The expression vLLM's built-in builder assigns to ``_supports_fused_gather``."""
    tree = ast.parse(release_source)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "_supports_fused_gather"):
            return ast.unparse(node.value)
    return None


def test_the_fused_gather_predicate_is_the_builtins():
    """builtin_fused_context_gather applies the running release's own predicate: if upstream
    changes it, this fails until the own builder follows."""
    source = inspect.getsource(builtin)
    predicate = _builtin_predicate(source)
    has_method = hasattr(builtin.AiterMLAMetadataBuilder, "_build_context_chunk_kv_indices")
    assert (predicate is not None) == has_method
    if predicate is not None:
        assert predicate == "self._kv_cache_dtype_str != 'fp8_ds_mla' and on_gfx950()"
        build = inspect.getsource(builtin.AiterMLAMetadataBuilder.build)
        assert "self.dcp_world_size == 1\n            and self._supports_fused_gather" in build


@pytest.mark.parametrize(("gfx950", "kv", "dcp", "fused"), [
    (True, "auto", 1, True), (True, "fp8", 1, True), (True, "fp8_ds_mla", 1, False), (True, "auto", 2, False),
    (False, "auto", 1, False)])
def test_fused_gather_where_the_builtin_builder_would(monkeypatch, gfx950, kv, dcp, fused):
    monkeypatch.setattr(vllm_builtin, "on_rocm", lambda: True)
    monkeypatch.setattr(vllm_builtin, "_on_gfx950", lambda: gfx950)
    has_method = hasattr(builtin.AiterMLAMetadataBuilder, "_build_context_chunk_kv_indices")
    assert vllm_builtin.builtin_fused_context_gather(kv, dcp) == (fused and has_method)


def _built(monkeypatch, fused: bool, chunked: bool):
    prefill = types.SimpleNamespace(chunked_context=object() if chunked else None)
    monkeypatch.setattr(MLACommonMetadataBuilder, "build",
                        lambda self, *a, **k: types.SimpleNamespace(prefill=prefill, context_chunk_kv_indices=None))
    calls = []
    monkeypatch.setattr(builtin.AiterMLAMetadataBuilder, "_build_context_chunk_kv_indices",
                        lambda self, p: calls.append((self, p)) or ["indices"], raising=False)
    own = object.__new__(AiterMLAMetadataBuilder)
    own._fused_context_gather = fused
    return own, AiterMLAMetadataBuilder.build(own, 0, None), calls, prefill


@pytest.mark.parametrize(("fused", "chunked"), [(True, True), (True, False), (False, True)])
def test_the_builder_makes_the_gather_indices_once_a_step_only_when_used(monkeypatch, fused, chunked):
    own, metadata, calls, prefill = _built(monkeypatch, fused, chunked)
    if fused and chunked:
        assert metadata.context_chunk_kv_indices == ["indices"] and calls == [(own, prefill)]
    else:
        assert metadata.context_chunk_kv_indices is None and calls == []


def test_the_gather_indices_are_the_context_slots_in_the_interpreter(monkeypatch):
    """On a release with the fused gather (0.34): the indices the own builder hands the built-in's
    prefill code are the context's KV slots, by the release's own kernel in Triton's interpreter.
    On a release without it: no configuration turns it on, not even gfx950 with a bf16 cache."""
    if not hasattr(builtin.AiterMLAMetadataBuilder, "_build_context_chunk_kv_indices"):
        monkeypatch.setattr(vllm_builtin, "on_rocm", lambda: True)
        monkeypatch.setattr(vllm_builtin, "_on_gfx950", lambda: True)
        assert not vllm_builtin.builtin_fused_context_gather("auto", 1)
        return
    path = [str(SCRIPT.parents[1] / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
    run = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok: ") == 4 and "DIFFERENT" not in run.stdout


def test_the_builtins_constructor_accepts_every_head_count_the_own_path_serves(monkeypatch):
    """The own impl runs the built-in's constructor, which refuses head counts it cannot pad: every
    count routing gives the own path is one it accepts (else the own path would stop at start-up
    where the built-in runs), with and without AITER's native H24 kernels."""
    from routing_cases import FP8, facts  # noqa: PLC0415

    from vllm_aiter_mla.routing import choose_route  # noqa: PLC0415

    for native_h24 in (False, True):
        monkeypatch.setattr(builtin, "_aiter_mla_native_h24_supported", lambda native_h24=native_h24: native_h24)
        own = [n for n in range(1, 300) for kv in ({}, FP8)
               if choose_route(facts(num_heads=n, decode_heads=vllm_builtin.decode_heads(n), **kv)).own]
        assert own and 16 in own and 128 in own and 24 in own
        refused = sorted({n for n in own if not builtin.AiterMLAHelper.is_valid_num_heads(n)})
        assert refused == [], f"the built-in's constructor refuses {refused} heads, which the own path would take"
