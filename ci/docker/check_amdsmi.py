#!/usr/bin/env python3
"""Check that the AMD SMI Python package imports in this image.

vLLM detects ROCm by importing amdsmi ("Failed to infer device type" without it); importing it
needs no GPU. Exit status 1 with one line naming the script that installs it.
"""
from __future__ import annotations

import importlib
import sys


def check_amdsmi() -> list[str]:
    try:
        module = importlib.import_module("amdsmi")
    except Exception as exc:  # ImportError, or OSError when libamd_smi.so cannot be loaded
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return [f"import amdsmi failed ({detail}): vLLM would fail with 'Failed to infer device type'; "
                f"install it from the ROCm image (ci/docker/install_amdsmi.sh in the torch stage)"]
    print(f"amdsmi-check: amdsmi from {getattr(module, '__file__', '?')}")
    return []


def main() -> int:
    problems = check_amdsmi()
    for line in problems:
        print(f"amdsmi-check: ERROR: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
