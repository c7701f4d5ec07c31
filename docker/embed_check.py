"""The vLLM image the backend is embedded into, checked against what the backend supports.

Run in Dockerfile.rocm's backend-installed stage, on the vLLM image (VLLM_IMAGE, or vLLM built
here), with the backend just installed on PYTHONPATH:

    PYTHONPATH=<staged site-packages> python3 -B embed_check.py

What is supported is the backend's own declaration: vllm_aiter_mla.SUPPORTED_VLLM (a vLLM release in
that range; vllm_aiter_mla.plugin judges it) and the release track being built (VLLM_TRACK,
VLLM_VERSION: the image must hold that release, as the image manifest records it). AITER: the backend
makes the calls vLLM's built-in makes and measures them at start-up, so it takes any AITER release,
or none (a CPU vLLM image, the backend's CPU development mode).

Settings (build args): VLLM_IMAGE (empty: vLLM built here), VLLM_TRACK, VLLM_VERSION.
Supported: one line on stdout naming the image, its vLLM and its AITER (or "no AITER"); exit 0.
Else one line on stderr naming the image, what it has, what is supported and the setting to change;
exit 1. Standard library, the backend package and the runtime's reader of installed metadata
(rocm_vllm_runtime.distributions) only.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

from rocm_vllm_runtime.distributions import (AITER_DISTRIBUTIONS, NO_VERSION, VLLM_DISTRIBUTIONS, MetadataError, find,
                                             no_version_problem)
from vllm_aiter_mla import SUPPORTED_VLLM
from vllm_aiter_mla.plugin import vllm_version_problem

SUPPORTED = f"vllm-aiter-mla supports vLLM {SUPPORTED_VLLM} (releases only) with any AITER, or none on a CPU image"

Lookup = Callable[..., "tuple[str, str] | None"]


class Refused(ValueError):
    """The image cannot take the backend (one line: the image, what it has, what to change)."""


def release(version: str) -> str:
    """The release of a local version: 0.32.0+cpu -> 0.32.0 (the image manifest's rule)."""
    return version.split("+", 1)[0]


def _installed(name: str, found: tuple[str, str] | None) -> str:
    if found is None:
        return f"no {name}"
    dist, version = found
    return f"{name} {version} ({dist})" if version != NO_VERSION else f"{name} ({dist}, no version in its metadata)"


def embedded(env: Mapping[str, str], lookup: Lookup = find) -> str:
    """The one line saying what the backend is embedded into; Refused when it is not supported."""
    image = env.get("VLLM_IMAGE", "")
    track = env.get("VLLM_TRACK", "")
    want = env.get("VLLM_VERSION", "")
    where = f"VLLM_IMAGE={image}" if image else "the vLLM built here (VLLM_IMAGE empty)"
    fix = f"set VLLM_IMAGE to an image with vLLM {want}" if want else "set VLLM_IMAGE to an image of a supported vLLM"
    try:
        vllm = lookup(*VLLM_DISTRIBUTIONS)
        aiter = lookup(*AITER_DISTRIBUTIONS)
    except MetadataError as exc:
        raise Refused(f"{where}: {exc}") from None
    has = f"{_installed('vLLM', vllm)} and {_installed('AITER', aiter)}"
    if vllm is None:
        raise Refused(f"{where} has {has} ({' or '.join(VLLM_DISTRIBUTIONS)}); {SUPPORTED}: {fix}")
    found = vllm[1]
    if found == NO_VERSION:
        raise Refused(f"{where} has {has}; {no_version_problem('vLLM', VLLM_DISTRIBUTIONS)}, or {fix}")
    if vllm_version_problem(found):
        raise Refused(f"{where} has {has}; {SUPPORTED}: {fix}, or TRACK to a release track of versions.json")
    if want and release(found) != want:
        raise Refused(f"{where} has {has}; track {track or '(VLLM_TRACK empty)'} embeds vLLM {want} ({SUPPORTED}): "
                      f"set TRACK to the track of vLLM {release(found)}, or VLLM_IMAGE to an image with vLLM {want}")
    return f"embedded: {where}: {has} (track {track or 'unnamed'}; supported: vLLM {SUPPORTED_VLLM}, any AITER or none)"


def main(env: Mapping[str, str] | None = None, lookup: Lookup = find) -> int:
    try:
        line = embedded(os.environ if env is None else env, lookup)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
