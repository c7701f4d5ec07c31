#!/usr/bin/env python3
"""Wheels the build steps make (standard library only; setuptools is only probed).

    wheel_build.py setuptools            exit status 0 where this Python's setuptools builds a wheel
                                         without build isolation (setuptools 69 or later, with bdist_wheel
                                         from setuptools >= 70.1 or from the wheel package), 1 where not
    wheel_build.py vllm OUT VLLM_VERSION OUT holds exactly one vLLM wheel and it is VLLM_VERSION (a local
                                         label such as +rocm72 aside); else one line naming what differs,
                                         exit status 1

Run with `python3 -B` in build steps (docker/build_project_wheel.sh, docker/build_vllm.sh).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

MIN_SETUPTOOLS = 69


def setuptools_builds_wheels() -> bool:
    try:
        setuptools = importlib.import_module("setuptools")
        major = int(setuptools.__version__.split(".")[0])
    except (ImportError, ValueError, AttributeError):
        return False
    for provider in ("setuptools.command.bdist_wheel", "wheel"):
        try:
            importlib.import_module(provider)
        except ImportError:
            continue
        return major >= MIN_SETUPTOOLS
    return False


def built_vllm_wheel(out: Path, want: str) -> str:
    """The name of OUT's one vLLM wheel, when it is the pinned release; else ValueError saying what differs."""
    wheels = sorted(out.glob("vllm-*.whl"))
    if len(wheels) != 1:
        raise ValueError(f"expected one vLLM wheel in {out}, found {len(wheels)}")
    found = wheels[0].name.split("-")[1]
    if found.split("+")[0] != want:
        raise ValueError(f"built vLLM {found} but versions.json pins VLLM_VERSION={want}: check vllm.tag/commit")
    return wheels[0].name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setuptools")
    vllm = sub.add_parser("vllm")
    vllm.add_argument("out", type=Path)
    vllm.add_argument("version")
    ns = parser.parse_args(argv)
    if ns.cmd == "setuptools":
        return 0 if setuptools_builds_wheels() else 1
    try:
        name = built_vllm_wheel(ns.out, ns.version)
    except ValueError as exc:
        print(f"vllm-wheel: ERROR: {exc}", file=sys.stderr)
        return 1
    print(f"vllm-wheel: OK {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
