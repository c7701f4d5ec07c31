"""Versions of installed distributions, read from their package metadata (nothing is imported).

Three answers, kept apart: ``None`` (none of the names is installed), ``""`` (installed, but its
metadata has no ``Version``: a broken or hand-made install, which must not read as "not
installed"), or the version. Plain standard library: the plugin, the kernel contract and the
image's runtime ask through the same rule.
"""
from __future__ import annotations

from importlib import metadata

NO_VERSION = ""


def version_of(*names: str) -> str | None:
    """The version of the first of ``names`` that is installed; ``NO_VERSION`` when its metadata
    has none; ``None`` when none of them is installed."""
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        try:
            found = dist.metadata.get("Version")
        except (KeyError, AttributeError):  # no metadata file at all
            found = None
        return str(found).strip() if found else NO_VERSION
    return None


def no_version_problem(what: str, names: tuple[str, ...]) -> str:
    """One line for an install whose metadata has no version."""
    return (f"{what} is installed, but its package metadata ({' or '.join(names)}) has no version, so it "
            f"cannot be checked: reinstall {what} (pip install --force-reinstall)")
