"""Shared set-up of the self-test suites (they run in this repository and in the image)."""

import os
import sys
from pathlib import Path

# vLLM decides pin-memory and device defaults at import: say "CPU" unless the image
# (or the user) already chose a device.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# Helpers of the suites (e.g. rocm_fake) import by bare name.
sys.path.insert(0, str(Path(__file__).resolve().parent))
