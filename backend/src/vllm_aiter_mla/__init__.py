"""AITER MLA attention backend for vLLM on AMD Instinct GPUs (gfx942, gfx950).

Installed with pip, it registers itself as a vLLM general plugin (entry point
``aiter_mla``) and takes over vLLM's ``ROCM_AITER_MLA`` backend entry. The
kernel-facing logic lives in plain PyTorch modules (``planning``, ``decode``,
``reference``); ``routing`` decides which implementation runs a layer (this
package's or vLLM's built-in); ``backend`` holds the thin vLLM adapters.
"""

__version__ = "0.1.0"

# vLLM releases whose MLA classes and selection rules this package is written against: the
# release tracks of versions.json from the oldest up to the newest one the plugin was compared with
# (python3 -m tools.pins verify holds it to the tracks; the pin tool never widens it by itself).
SUPPORTED_VLLM = ">=0.32.0,<0.35"
