#!/usr/bin/env bash
# The AMD SMI Python package (`amdsmi`) from the ROCm image, installed into the venv: vLLM
# detects a ROCm platform by importing it ("Failed to infer device type" without it).
# Source: ${ROCM_PATH}/share/amd_smi, the package the ROCm image ships (as vLLM's own base
# image installs it); built in a copy, so the ROCm tree stays untouched.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
src=${ROCM_PATH:-/opt/rocm}/share/amd_smi
if [ ! -f "$src/pyproject.toml" ] && [ ! -f "$src/setup.py" ]; then
  echo "amdsmi: ERROR: $src holds no Python package: the ROCm image (ROCM_IMAGE) lacks AMD SMI; use a -complete ROCm image" >&2
  exit 1
fi
use_ca_bundle
work=$(mktemp -d)
cp -r "$src/." "$work/"
python -m pip install "$work"
rm -rf "$work"
python "$here/check_amdsmi.py"
