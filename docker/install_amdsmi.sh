#!/usr/bin/env bash
# The AMD SMI Python package (`amdsmi`) from the ROCm stack, installed into the venv: vLLM
# detects a ROCm platform by importing it ("Failed to infer device type" without it).
# Source: AMD_SMI_SRC, which each stack's base stage sets: ${ROCM_PATH}/share/amd_smi on a ROCm
# image, the SDK core's share/amd_smi on TheRock (as vLLM's own base images install it); built in
# a copy, so the ROCm tree stays untouched.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
src=${AMD_SMI_SRC:?the base stage sets AMD_SMI_SRC (where the ROCm stack ships the amdsmi package)}
if [ ! -f "$src/pyproject.toml" ] && [ ! -f "$src/setup.py" ]; then
  echo "amdsmi: ERROR: $src holds no Python package: the ROCm stack lacks AMD SMI (a ROCm image: use a -complete one; TheRock: its core wheel)" >&2
  exit 1
fi
use_ca_bundle
work=$(mktemp -d)
cp -r "$src/." "$work/"
python -m pip install "$work"
rm -rf "$work"
python "$here/check_amdsmi.py"
