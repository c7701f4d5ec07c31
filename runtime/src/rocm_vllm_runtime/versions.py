"""Installed distributions, as the image's runtime reports them (nothing GPU-bound is imported).

`installed(*names)` is this package's one way to ask rocm_vllm_runtime.distributions, the one reader
of installed metadata: the image manifest's writers and the self-test report both go through it.
"""
from __future__ import annotations

from typing import NamedTuple

from rocm_vllm_runtime.distributions import MetadataError, find, providers_of, requires_of

# label -> import name
PACKAGES: dict[str, str] = {"vllm": "vllm", "torch": "torch", "aiter": "aiter", "backend": "vllm_aiter_mla"}

# What the report shows for a distribution whose metadata has no version (never "not installed").
NO_VERSION_SHOWN = "(installed, no version in its metadata)"
# What it shows for one whose metadata cannot be read (not UTF-8, ...): the report is still written.
UNREADABLE_SHOWN = "(installed, its metadata cannot be read: reinstall it)"
requires = requires_of  # the manifest's writer reads torch's Requires-Dist through this module


class Installed(NamedTuple):
    distribution: str
    version: str  # "" when the distribution's metadata has no Version


def installed(*names: str) -> Installed | None:
    """distributions.find as an Installed (e.g. installed("amd-aiter", "aiter"): the AITER wheel's name
    changed); None when none is installed."""
    found = find(*names)
    return None if found is None else Installed(*found)


def installed_version(import_name: str) -> str:
    """Version of the distribution that provides `import_name`; '' when not installed,
    NO_VERSION_SHOWN when installed without a version in its metadata, UNREADABLE_SHOWN when its
    metadata cannot be read."""
    try:
        found = installed(*(providers_of(import_name) or [import_name]))
    except MetadataError:
        return UNREADABLE_SHOWN
    if found is None:
        return ""
    return found.version or NO_VERSION_SHOWN


def stack_versions() -> dict[str, str]:
    return {label: installed_version(name) for label, name in PACKAGES.items()}
