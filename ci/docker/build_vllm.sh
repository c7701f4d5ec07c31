#!/usr/bin/env bash
# Build the vLLM wheel for ROCm from a verified checkout: build_vllm.sh SRC WHEEL_DIR
# Settings (build args): GPU_ARCHS (;-separated, becomes PYTORCH_ROCM_ARCH), MAX_JOBS (empty:
# derived from CPUs and memory, VLLM_MEM_PER_JOB_GIB per compile job, default 4), VLLM_VERSION.
# Runs in the base image: the ROCm compilers, the pinned torch and triton are there; the build
# uses them (no build isolation), so pip never replaces the ROCm torch with another build.
set -euo pipefail
src=${1:?source directory} out=${2:?wheel directory}
: "${GPU_ARCHS:?set the GPU_ARCHS build arg (e.g. gfx942;gfx950)}" "${VLLM_VERSION:?set VLLM_VERSION}"
per_job=${VLLM_MEM_PER_JOB_GIB:-4}

cpus=$(nproc)
mem_gib=$(( $(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) / 1024 / 1024 ))
by_mem=$(( mem_gib / per_job ))
if [ -z "${MAX_JOBS:-}" ]; then
  MAX_JOBS=$(( by_mem < cpus ? by_mem : cpus ))
fi
echo "vllm-wheel: MAX_JOBS=$MAX_JOBS (builder: $cpus CPUs, $mem_gib GiB available, VLLM_MEM_PER_JOB_GIB=$per_job), PYTORCH_ROCM_ARCH=$GPU_ARCHS"
if [ "$MAX_JOBS" -lt 1 ]; then
  echo "vllm-wheel: ERROR: the builder has $mem_gib GiB available, less than one compile job needs ($per_job GiB, VLLM_MEM_PER_JOB_GIB): give the builder more memory or set MAX_JOBS" >&2
  exit 1
fi

python - <<'PY' || { echo "vllm-wheel: ERROR: the base image's torch is not a ROCm build: rebuild the base target (docker buildx bake base)" >&2; exit 1; }
import torch, sys
sys.exit(0 if torch.version.hip else 1)
PY

export PYTORCH_ROCM_ARCH=$GPU_ARCHS MAX_JOBS VLLM_TARGET_DEVICE=rocm
export CCACHE_DIR=${CCACHE_DIR:-/root/.cache/ccache}
if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi
cd "$src"
# Build requirements other than torch (cmake, ninja, setuptools-scm, ...); torch stays as installed.
grep -v -E '^\s*(torch|triton|pytorch-triton)' requirements/rocm-build.txt > /tmp/vllm-build-reqs.txt
python -m pip install -r /tmp/vllm-build-reqs.txt
python -m pip wheel --no-deps --no-build-isolation --wheel-dir "$out" .
ls "$out"/vllm-*.whl >/dev/null || { echo "vllm-wheel: ERROR: no vLLM wheel in $out" >&2; exit 1; }
# Runtime requirements of the ROCm build, for the installing stage (torch lines dropped).
grep -v -E '^\s*(torch|triton|pytorch-triton)' requirements/rocm.txt > "$out/requirements-rocm.txt"
if [ -f requirements/common.txt ]; then cp requirements/common.txt "$out/common.txt"; fi
python - "$out" "$VLLM_VERSION" <<'PY'
import pathlib, sys
out, want = pathlib.Path(sys.argv[1]), sys.argv[2]
wheel = next(out.glob("vllm-*.whl")).name
found = wheel.split("-")[1]
if found.split("+")[0] != want:
    sys.exit(f"vllm-wheel: ERROR: built vLLM {found} but versions.json pins VLLM_VERSION={want}: check vllm.tag/commit")
print(f"vllm-wheel: OK {wheel}")
PY
