#!/usr/bin/env bash
# Build a pure-Python package's wheel: build_project_wheel.sh SRC WHEEL_DIR [WHEEL_NAME]
# SRC: backend/ (WHEEL_NAME vllm_aiter_mla, the default) or runtime/ (rocm_vllm_runtime). The image's
# setuptools is used when it can build wheels (no index needed), else pip builds in isolation
# (needs an index; PIP_INDEX_URL/PIP_CERT).
# SOURCE_DATE_EPOCH makes the wheel byte-identical for identical sources.
set -euo pipefail
src=${1:?source directory} out=${2:?wheel directory} name=${3:-vllm_aiter_mla}
python=${PYTHON:-python3}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
use_ca_bundle
find "$src" \( -name __pycache__ -o -name '*.egg-info' -o -name '*.pyc' \) -prune -exec rm -rf {} +
if "$python" -B "$(dirname "$0")/wheel_build.py" setuptools; then
  echo "${name} wheel: building with the image's setuptools (no build isolation)"
  isolation=(--no-build-isolation)
else
  echo "${name} wheel: the image has no setuptools>=69 with wheel support: building in isolation (needs a package index)"
  isolation=()
fi
"$python" -m pip wheel --no-deps "${isolation[@]}" --wheel-dir "$out" "$src"
ls "$out"/"${name}"-*.whl
