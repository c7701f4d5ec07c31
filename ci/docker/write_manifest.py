#!/usr/bin/env python3
"""Write the image manifest (default /opt/rocm-vllm/manifest.json) from the build args in the
environment, the verified AITER commits and the prebuilt module list.

    write_manifest.py --aiter-pins aiter-pins.json --modules modules.txt [--out PATH]

Keys: schema, gpu_archs, rocm {version, image}, python {version}, pytorch {index_url, wheels {<name>:
{package, version, sha256, installed}}}, aiter {version, tag, repository, commit, ck_commit, pinned},
prebuilt_modules, vllm {version, tag, repository, commit}, source_date_epoch, unresolved.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
from pathlib import Path


WHEEL_ARGS = {
    "torch": ("TORCH_PACKAGE", "TORCH_VERSION", "TORCH_SHA256"),
    "triton": ("TRITON_PACKAGE", "TRITON_VERSION", "TRITON_SHA256"),
    "torchvision": ("TORCHVISION_PACKAGE", "TORCHVISION_VERSION", "TORCHVISION_SHA256"),
    "torchaudio": ("TORCHAUDIO_PACKAGE", "TORCHAUDIO_VERSION", "TORCHAUDIO_SHA256"),
}


def installed(package: str):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_triton() -> str | None:
    """The Triton distribution the installed torch requires (its name changes between releases)."""
    try:
        requires = importlib.metadata.requires("torch") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for req in requires:
        name = req.split(";")[0].split("=")[0].split("<")[0].split(">")[0].split("(")[0].strip()
        if "triton" in name.lower():
            return name
    return None


def build_manifest(env: dict, aiter_pins: dict, modules: list[str]) -> dict:
    def pin(name):
        value = env.get(name, "UNRESOLVED")
        return None if value in ("", "UNRESOLVED") else value

    unresolved = sorted(k for k, v in env.items() if v == "UNRESOLVED" or v.endswith("@sha256:UNRESOLVED"))
    wheels = {}
    for key, (pkg_arg, ver_arg, sha_arg) in WHEEL_ARGS.items():
        package = env.get(pkg_arg, key)
        if package in ("", "UNRESOLVED"):  # development build: what torch requires
            package = (torch_triton() if key == "triton" else None) or key
        wheels[key] = {"package": package, "version": pin(ver_arg), "sha256": pin(sha_arg),
                       "installed": installed(package)}
    return {
        "schema": 1,
        "gpu_archs": [a for a in env.get("GPU_ARCHS", "").split(";") if a],
        "rocm": {"version": pin("ROCM_VERSION"), "image": env.get("ROCM_IMAGE")},
        "python": {"version": pin("PYTHON_VERSION")},
        "pytorch": {"index_url": env.get("TORCH_INDEX_URL"), "wheels": wheels},
        "aiter": {
            # The AITER wheel is distributed as amd-aiter (older builds: aiter).
            "version": installed("amd-aiter") or installed("aiter") or env.get("AITER_TAG", "").lstrip("v"),
            "tag": aiter_pins.get("tag"),
            "repository": aiter_pins.get("repository"),
            "commit": aiter_pins.get("commit"),
            "ck_commit": aiter_pins.get("ck_commit"),
            "pinned": bool(aiter_pins.get("pinned")),
        },
        "prebuilt_modules": sorted(modules),
        "vllm": {"version": pin("VLLM_VERSION"), "tag": pin("VLLM_TAG"),
                 "repository": pin("VLLM_REPO"), "commit": pin("VLLM_COMMIT")},
        "source_date_epoch": int(env["SOURCE_DATE_EPOCH"]) if env.get("SOURCE_DATE_EPOCH") else None,
        "unresolved": unresolved,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--aiter-pins", type=Path, required=True)
    parser.add_argument("--modules", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("/opt/rocm-vllm/manifest.json"))
    ns = parser.parse_args(argv)
    manifest = build_manifest(dict(os.environ), json.loads(ns.aiter_pins.read_text()),
                              ns.modules.read_text().split())
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
