"""The kernel loaders a test replaces: the adapters (``backend``) load AITER's kernels and vLLM's Triton
decode for their own calls, the start-up measurement's state (``measure_state``) for its measurements;
a test gives both the same ones."""
from __future__ import annotations

from collections.abc import Callable

from vllm_aiter_mla import backend, measure_state

LOADING_MODULES = (backend, measure_state)


def use_kernels(monkeypatch, load_kernels: Callable | None = None, load_triton_decode: Callable | None = None) -> None:
    """Every module that loads kernels loads them with ``load_kernels`` / ``load_triton_decode`` (where given)."""
    for module in LOADING_MODULES:
        if load_kernels is not None:
            monkeypatch.setattr(module, "load_kernels", load_kernels)
        if load_triton_decode is not None:
            monkeypatch.setattr(module, "load_triton_decode", load_triton_decode)
