"""Installed distributions, read from package metadata (nothing GPU-bound is imported).

`installed(*names)` is the one way this package asks what is installed: the image manifest's
writers and the self-test report both go through it.
"""
from __future__ import annotations

from importlib import metadata
from typing import NamedTuple

# label -> import name
PACKAGES: dict[str, str] = {
    "vllm": "vllm",
    "torch": "torch",
    "aiter": "aiter",
    "backend": "vllm_aiter_mla",
}


class Installed(NamedTuple):
    distribution: str
    version: str


def installed(*names: str) -> Installed | None:
    """The first of the distributions `names` that is installed, with its version; None when
    none is (e.g. installed("amd-aiter", "aiter"): the AITER wheel's name changed)."""
    for name in names:
        try:
            return Installed(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return None


def requires(name: str) -> list[str]:
    """The Requires-Dist lines of an installed distribution; [] when it is not installed."""
    try:
        return list(metadata.requires(name) or [])
    except metadata.PackageNotFoundError:
        return []


def installed_version(import_name: str) -> str:
    """Version of the distribution that provides `import_name`; '' when not installed."""
    try:
        dists = metadata.packages_distributions().get(import_name, [])
    except Exception:  # noqa: BLE001 - broken metadata must not break the report
        dists = []
    found = installed(*(dists or [import_name]))
    return found.version if found else ""


def stack_versions() -> dict[str, str]:
    return {label: installed_version(name) for label, name in PACKAGES.items()}
