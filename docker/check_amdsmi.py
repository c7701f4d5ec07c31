#!/usr/bin/env python3
"""Check that the AMD SMI Python package imports in this image (vLLM detects ROCm by importing it,
"Failed to infer device type" without it; no GPU needed). Exit status 1 with one line."""
import importlib
import sys

if __name__ == "__main__":
    try:
        module = importlib.import_module("amdsmi")
    except Exception as exc:  # ImportError, or OSError when libamd_smi.so cannot be loaded
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        sys.exit(f"amdsmi-check: ERROR: import amdsmi failed ({detail}): vLLM would fail with 'Failed to infer "
                 "device type'; install it from the ROCm image (docker/install_amdsmi.sh in the torch stage)")
    print(f"amdsmi-check: amdsmi from {getattr(module, '__file__', '?')}")
