"""Installed versions of the stack, read from package metadata (nothing GPU-bound is imported)."""
from __future__ import annotations

from importlib import metadata

# label -> import name
PACKAGES: dict[str, str] = {
    "vllm": "vllm",
    "torch": "torch",
    "aiter": "aiter",
    "backend": "vllm_aiter_mla",
}


def installed_version(import_name: str) -> str:
    """Version of the distribution that provides `import_name`; '' when not installed."""
    try:
        dists = metadata.packages_distributions().get(import_name, [])
    except Exception:  # noqa: BLE001 - broken metadata must not break the report
        dists = []
    for dist in dists or [import_name]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


def stack_versions() -> dict[str, str]:
    return {label: installed_version(name) for label, name in PACKAGES.items()}
