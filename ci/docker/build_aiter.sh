#!/usr/bin/env bash
# Build the AITER wheel with prebuilt kernels: build_aiter.sh SRC WHEEL_DIR
# Settings (build args): GPU_ARCHS (;-separated, required: the default "native" needs a GPU),
# MAX_JOBS (empty: derived from CPUs and memory), AITER_MEM_PER_JOB_GIB (memory budget of one
# compile job, default 4), AITER_TAG (wheel version).
set -euo pipefail
src=${1:?source directory} out=${2:?wheel directory}
: "${GPU_ARCHS:?set the GPU_ARCHS build arg (e.g. gfx942;gfx950)}" "${AITER_TAG:?set AITER_TAG}"
per_job=${AITER_MEM_PER_JOB_GIB:-4}

cpus=$(nproc)
mem_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
for limit in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do
  if [ -r "$limit" ] && [ "$(cat "$limit")" != max ]; then
    lim_kib=$(( $(cat "$limit") / 1024 ))
    [ "$lim_kib" -lt "$mem_kib" ] && mem_kib=$lim_kib
  fi
done
mem_gib=$(( mem_kib / 1024 / 1024 ))
by_mem=$(( mem_gib / per_job ))
if [ -z "${MAX_JOBS:-}" ]; then
  MAX_JOBS=$(( by_mem < cpus ? by_mem : cpus ))
  source="derived"
else
  source="given"
fi
echo "aiter-wheel: MAX_JOBS=$MAX_JOBS ($source; builder: $cpus CPUs, $mem_gib GiB available, AITER_MEM_PER_JOB_GIB=$per_job), GPU_ARCHS=$GPU_ARCHS"
if [ "$MAX_JOBS" -lt 1 ] || [ "$by_mem" -lt 1 ]; then
  echo "aiter-wheel: ERROR: the builder has $mem_gib GiB available, less than one compile job needs ($per_job GiB, AITER_MEM_PER_JOB_GIB): give the builder more memory" >&2
  exit 1
fi
if [ "$MAX_JOBS" -gt "$by_mem" ]; then
  echo "aiter-wheel: WARNING: MAX_JOBS=$MAX_JOBS exceeds what memory allows ($by_mem jobs of $per_job GiB); expect OOM" >&2
fi

export PREBUILD_KERNELS=1 GPU_ARCHS MAX_JOBS AITER_USE_SYSTEM_TRITON=1
export SETUPTOOLS_SCM_PRETEND_VERSION=${AITER_TAG#v}
export CCACHE_DIR=${CCACHE_DIR:-/root/.cache/ccache}
[ -f /run/secrets/ca-bundle ] && export PIP_CERT=/run/secrets/ca-bundle
cd "$src"
# Build requirements from AITER's own list (at the pinned commit), without touching torch/triton.
if [ -f requirements.txt ]; then
  grep -viE '^(torch|triton|pytorch-triton)' requirements.txt >/tmp/aiter-build-reqs.txt || true
  python -m pip install -r /tmp/aiter-build-reqs.txt
fi
python -m pip install setuptools wheel setuptools_scm
start=$(date +%s)
python setup.py bdist_wheel --dist-dir "$out"
echo "aiter-wheel: built $(ls "$out"/*.whl) in $(( $(date +%s) - start ))s"
