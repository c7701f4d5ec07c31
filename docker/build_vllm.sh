#!/usr/bin/env bash
# Build the vLLM wheel for ROCm from a verified checkout, in the base image: the ROCm compilers
# and the pinned torch, Triton, amdsmi and AITER are there, the build uses them (no build
# isolation) and nothing installed here may replace them (constraints + before/after check).
#
#   build_vllm.sh check SRC OUT   no install, no compile: SRC has every file the build reads, its
#                                 triton_kernels commit is pinned, the build tools satisfy its
#                                 requirements/build/rocm.txt, VLLM_LOCK was made from its
#                                 requirements/rocm.txt (copied to OUT/requirements-lock.txt)
#   build_vllm.sh deps  SRC OUT   check, then install the hash-pinned build tools
#   build_vllm.sh wheel SRC OUT   compile OUT/vllm-*.whl
#   build_vllm.sh all   SRC OUT   deps, then wheel
#
# Settings (build args): GPU_ARCHS (becomes PYTORCH_ROCM_ARCH), VLLM_VERSION, MAX_JOBS and
# VLLM_MEM_PER_JOB_GIB (lib.sh derive_max_jobs), TRITON_KERNELS_COMMIT, TRITON_KERNELS_SRC_DIR
# (that package, fetched by the source stage: vLLM's CMake then clones nothing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
fail() { echo "vllm-wheel: ERROR: $*" >&2; exit 1; }

step=${1:-} src=${2:-} out=${3:-}
case "$step" in check|deps|wheel|all) ;; *) echo "usage: $0 check|deps|wheel|all SRC OUT" >&2; exit 2 ;; esac
[ -n "$src" ] && [ -n "$out" ] || { echo "usage: $0 $step SRC OUT" >&2; exit 2; }
[ -d "$src" ] || fail "$src: no vLLM source directory (the vllm-src build context)"
mkdir -p "$out"
use_ca_bundle

check() {
  python "$here/vllm_requirements.py" files "$src"
  case "${TRITON_KERNELS_COMMIT:-UNRESOLVED}" in
    UNRESOLVED) echo "vllm-wheel: WARNING: the triton_kernels commit is unresolved in versions.json: the one vLLM's CMake names is not checked" >&2 ;;
    *) python "$here/vllm_requirements.py" triton-kernels "$src" "$TRITON_KERNELS_COMMIT" ;;
  esac
  python "$here/vllm_requirements.py" build-tools "$src" "$here/requirements-build.txt"
  : "${VLLM_LOCK:?set VLLM_LOCK to the track's lock of vLLM's runtime requirements (docker/locks/vllm-<track>-rocm.txt)}"
  python "$here/vllm_requirements.py" lock "$src" "$VLLM_LOCK"
  cp "$VLLM_LOCK" "$out/requirements-lock.txt"
}

deps() {
  check
  python "$here/pinned_dists.py" snapshot "$out/pins-before.json"
  python -m pip install --require-hashes --no-deps -r "$here/requirements-build.txt"
  python "$here/pinned_dists.py" compare "$out/pins-before.json" --step "vllm-wheel (build tools)"
  rm -f "$out/pins-before.json"
}

wheel() {
  : "${GPU_ARCHS:?set the GPU_ARCHS build arg (e.g. gfx942;gfx950)}" "${VLLM_VERSION:?set VLLM_VERSION}"
  : "${TRITON_KERNELS_SRC_DIR:?set TRITON_KERNELS_SRC_DIR to the pinned ROCm triton_kernels package (the triton-kernels-src stage)}"
  [ -f "$TRITON_KERNELS_SRC_DIR/__init__.py" ] \
    || fail "TRITON_KERNELS_SRC_DIR=$TRITON_KERNELS_SRC_DIR is not the triton_kernels package (no __init__.py): check the triton-kernels-src build context"
  derive_max_jobs vllm-wheel VLLM_MEM_PER_JOB_GIB
  python -c 'import sys, torch; sys.exit(0 if torch.version.hip else 1)' \
    || fail "the base image's torch is not a ROCm build: rebuild the base target (docker buildx bake base)"
  export PYTORCH_ROCM_ARCH=$GPU_ARCHS VLLM_TARGET_DEVICE=rocm TRITON_KERNELS_SRC_DIR
  export CCACHE_DIR=${CCACHE_DIR:-/root/.cache/ccache}
  echo "vllm-wheel: PYTORCH_ROCM_ARCH=$PYTORCH_ROCM_ARCH, triton_kernels from $TRITON_KERNELS_SRC_DIR"
  # vLLM's Rust frontend (the vllm-rs binary, used only with VLLM_USE_RUST_FRONTEND=1 or
  # VLLM_USE_RUST_BENCH=1) is an optional extension of setup.py unless VLLM_REQUIRE_RUST_FRONTEND
  # is set; the base image carries no Rust toolchain, so it is not built and the Python server is.
  unset VLLM_REQUIRE_RUST_FRONTEND
  if ! command -v cargo >/dev/null 2>&1; then
    echo "vllm-wheel: no Rust toolchain: vLLM's optional Rust frontend (vllm-rs) is not built; VLLM_USE_RUST_FRONTEND and VLLM_USE_RUST_BENCH stay unsupported in this image"
  fi
  python "$here/pinned_dists.py" snapshot "$out/pins-before.json"
  (cd "$src" && python -m pip wheel --no-deps --no-build-isolation --wheel-dir "$out" .)
  python "$here/pinned_dists.py" compare "$out/pins-before.json" --step "vllm-wheel (compile)"
  rm -f "$out/pins-before.json"
  python -B "$here/wheel_build.py" vllm "$out" "$VLLM_VERSION"
}

case "$step" in
  check) check ;;
  deps) deps ;;
  wheel) wheel ;;
  all) deps && wheel ;;
esac
