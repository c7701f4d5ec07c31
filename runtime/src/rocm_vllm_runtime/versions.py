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


# What the report shows for a distribution whose metadata has no version (never "not installed").
NO_VERSION_SHOWN = "(installed, no version in its metadata)"


class Installed(NamedTuple):
    distribution: str
    version: str  # "" when the distribution's metadata has no Version


def installed(*names: str) -> Installed | None:
    """The first of the distributions `names` that is installed, with its version ("" when its
    metadata has none: installed all the same); None when none is (e.g. installed("amd-aiter",
    "aiter"): the AITER wheel's name changed)."""
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        try:
            version = dist.metadata.get("Version")
        except (KeyError, AttributeError):  # no metadata file at all
            version = None
        return Installed(name, str(version).strip() if version else "")
    return None


def requires(name: str) -> list[str]:
    """The Requires-Dist lines of an installed distribution; [] when it is not installed."""
    try:
        return list(metadata.requires(name) or [])
    except metadata.PackageNotFoundError:
        return []


def installed_version(import_name: str) -> str:
    """Version of the distribution that provides `import_name`; '' when not installed,
    NO_VERSION_SHOWN when installed without a version in its metadata."""
    try:
        dists = metadata.packages_distributions().get(import_name, [])
    except Exception:  # noqa: BLE001 - broken metadata must not break the report
        dists = []
    found = installed(*(dists or [import_name]))
    if found is None:
        return ""
    return found.version or NO_VERSION_SHOWN


def stack_versions() -> dict[str, str]:
    return {label: installed_version(name) for label, name in PACKAGES.items()}
