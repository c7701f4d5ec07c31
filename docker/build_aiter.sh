#!/usr/bin/env bash
# Build the AITER wheel with prebuilt kernels: build_aiter.sh SRC WHEEL_DIR [LOCKS_DIR]
# (LOCKS_DIR: where the stage mounts docker/locks; aiter_requirements.sh stops without it)
# Settings (build args): GPU_ARCHS (required: the default "native" needs a GPU), MAX_JOBS and
# AITER_MEM_PER_JOB_GIB (lib.sh derive_max_jobs; MAX_JOBS also bounds AITER_FLYDSL_AOT_WORKERS),
# AITER_TAG (the wheel version), aiter_requirements.sh's, HIP_KITTENS_DIR (the pinned HipKittens
# checkout; empty: this AITER does not use HipKittens).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
src=${1:?source directory} out=${2:?wheel directory} locks=${3:-}
: "${GPU_ARCHS:?set the GPU_ARCHS build arg (e.g. gfx942;gfx950)}" "${AITER_TAG:?set the AITER_TAG build arg}"

derive_max_jobs aiter-wheel AITER_MEM_PER_JOB_GIB
export AITER_FLYDSL_AOT_WORKERS=${AITER_FLYDSL_AOT_WORKERS:-$MAX_JOBS}
export PREBUILD_KERNELS=1 GPU_ARCHS AITER_USE_SYSTEM_TRITON=1
export CCACHE_DIR=${CCACHE_DIR:-/root/.cache/ccache}
if [ -n "${HIP_KITTENS_DIR:-}" ]; then
  if [ -n "$(ls -A "$HIP_KITTENS_DIR" 2>/dev/null)" ]; then
    export HIP_KITTENS_DIR
  else
    unset HIP_KITTENS_DIR
  fi
fi
echo "aiter-wheel: GPU_ARCHS=$GPU_ARCHS, AITER_FLYDSL_AOT_WORKERS=$AITER_FLYDSL_AOT_WORKERS, HipKittens: ${HIP_KITTENS_DIR:-not used by this AITER}"
use_ca_bundle
work=$(mktemp -d)
python "$here/pinned_dists.py" constraints "$work/constraints.txt"
python "$here/pinned_dists.py" snapshot "$work/before.json"
# Build tools, hash-pinned; then AITER's own requirements (requirements.txt of the pinned commit) from
# their hash lock in LOCKS_DIR (aiter_requirements.sh): torch, Triton and amdsmi stay the base image's.
python -m pip install --require-hashes --no-deps -r "$here/requirements-build.txt"
bash "$here/aiter_requirements.sh" "$src" "$locks" "$work/constraints.txt"
python "$here/pinned_dists.py" compare "$work/before.json" --step "aiter-wheel (build requirements)"
start=$(date +%s)
(cd "$src" && SETUPTOOLS_SCM_PRETEND_VERSION=${AITER_TAG#v} python setup.py bdist_wheel --dist-dir "$out")
python "$here/pinned_dists.py" compare "$work/before.json" --step "aiter-wheel (setup.py)"
rm -rf "$work"
echo "aiter-wheel: built $(ls "$out"/*.whl) in $(( $(date +%s) - start ))s"
