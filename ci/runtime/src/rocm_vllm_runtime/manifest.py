"""The image manifest: what the image was built from and for.

Location: env `ROCM_VLLM_MANIFEST` (default /opt/rocm-vllm/manifest.json).
Expected keys::

    {"gpu_archs": ["gfx942", "gfx950"],
     "aiter": {"version": "...", "commit": "<40 hex>", "ck_commit": "<40 hex>"},
     "vllm": {"version": "0.32.0", "commit": "<40 hex>"},
     "prebuilt_modules": ["module_mla_asm", ...]}

`"aiter": null` states that the image carries no AITER (e.g. a CPU image).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MANIFEST_ENV = "ROCM_VLLM_MANIFEST"
DEFAULT_MANIFEST = "/opt/rocm-vllm/manifest.json"


class ManifestError(ValueError):
    """The manifest is missing or malformed; the message names the path and setting."""


@dataclass(frozen=True)
class Manifest:
    gpu_archs: tuple[str, ...]
    aiter: Mapping[str, str] | None
    vllm: Mapping[str, str]
    prebuilt_modules: tuple[str, ...] = ()

    @property
    def aiter_commit(self) -> str:
        return (self.aiter or {}).get("commit", "") or ""


def manifest_path(env: Mapping[str, str]) -> str:
    return env.get(MANIFEST_ENV) or DEFAULT_MANIFEST


def _str_map(value: object, key: str, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ManifestError(f"{where}: key {key!r} must be an object")
    return {str(k): "" if v is None else str(v) for k, v in value.items()}


def parse_manifest(data: object, where: str = "manifest") -> Manifest:
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected a JSON object")
    archs = data.get("gpu_archs")
    if isinstance(archs, str):
        archs = [a for a in archs.replace(",", ";").split(";") if a.strip()]
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ManifestError(f"{where}: 'gpu_archs' must be a non-empty list of arch names")
    aiter = data.get("aiter")
    vllm = data.get("vllm", {})
    modules = data.get("prebuilt_modules", [])
    if not isinstance(modules, list):
        raise ManifestError(f"{where}: 'prebuilt_modules' must be a list")
    return Manifest(
        gpu_archs=tuple(a.strip() for a in archs),
        aiter=None if aiter is None else _str_map(aiter, "aiter", where),
        vllm=_str_map(vllm, "vllm", where),
        prebuilt_modules=tuple(str(m) for m in modules),
    )


def load_manifest(env: Mapping[str, str]) -> Manifest:
    """Read the manifest named by the environment; ManifestError says what to fix."""
    path = manifest_path(env)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ManifestError(
            f"image manifest not readable at {path} ({exc.strerror or exc}); "
            f"set {MANIFEST_ENV} to its path"
        ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"image manifest {path} is not valid JSON: {exc}") from None
    return parse_manifest(data, where=path)
