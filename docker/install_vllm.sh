#!/usr/bin/env bash
# Install the vLLM wheel built by build_vllm.sh: install_vllm.sh WHEELS
# WHEELS holds vllm-*.whl and requirements-lock.txt (vLLM's ROCm runtime requirements, hash-locked,
# without the base image's pinned distributions). Both are installed without dependency resolution;
# pip check proves the set complete, and the step fails when a pinned distribution changed anyway.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
wheels=${1:?wheel directory}
use_ca_bundle
[ -f "$wheels/requirements-lock.txt" ] || { echo "vllm-built: ERROR: $wheels/requirements-lock.txt missing: rebuild the vllm-wheel stage" >&2; exit 1; }
work=$(mktemp -d)
python "$here/pinned_dists.py" snapshot "$work/before.json"
python -m pip install --require-hashes --no-deps -r "$wheels/requirements-lock.txt"
python -m pip install --no-deps --no-index "$wheels"/vllm-*.whl
python -m pip check || { echo "vllm-built: ERROR: vLLM's locked requirements conflict with the base image (pip check above): run python3 -m tools.pins lock vllm, or change the pins in versions.json" >&2; exit 1; }
python "$here/pinned_dists.py" compare "$work/before.json" --step "vllm-built"
rm -rf "$work"
