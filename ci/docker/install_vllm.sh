#!/usr/bin/env bash
# Install the vLLM wheel built by build_vllm.sh: install_vllm.sh WHEELS
# WHEELS holds vllm-*.whl and vLLM's requirements/ folder (its -r includes intact). The ROCm
# runtime requirements (requirements/rocm.txt) are installed under a constraints file that holds
# the base image's pinned distributions (torch, torchvision, torchaudio, Triton, amdsmi,
# amd-aiter) at their installed versions; the step fails when any of them changed anyway.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
wheels=${1:?wheel directory}
use_ca_bundle
[ -f "$wheels/requirements/rocm.txt" ] || { echo "vllm-built: ERROR: $wheels/requirements/rocm.txt missing: rebuild the vllm-wheel stage" >&2; exit 1; }
work=$(mktemp -d)
python "$here/pinned_dists.py" constraints "$work/constraints.txt"
python "$here/pinned_dists.py" snapshot "$work/before.json"
python -m pip install -c "$work/constraints.txt" -r "$wheels/requirements/rocm.txt" "$wheels"/vllm-*.whl
python "$here/pinned_dists.py" compare "$work/before.json" --step "vllm-built"
rm -rf "$work"
