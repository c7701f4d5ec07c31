#!/usr/bin/env bash
# Run the in-image self-tests on this AMD GPU host and publish the results.
#
#   ci/pipeline/amd-runner/selftest.sh [SUITE] [-- PYTEST_ARGS...]     SUITE: selector|smoke|bench|accuracy|all (default all)
#
# Writes RESULTS_DIR/selftest.json, selftest.xml (JUnit), selftest.log and, for
# bench, bench.json and server logs; appends the summary to $GITHUB_STEP_SUMMARY
# when a pipeline provides one. Exits with the self-test's status (0 pass,
# 1 a check failed, 2 a suite could not run).
#
# Settings:
#   IMAGE           image to test (default ${REGISTRY:-localhost/rocm-vllm}/ci:${TAG:-dev})
#   RESULTS_DIR     host directory for the results (default ./selftest-results)
#   RENDER_GID      numeric GID of the host's render group (default: owner group of
#                   the first $DRI_DIR/renderD* node)
#   DRI_DIR         default /dev/dri;  KFD_PATH  default /dev/kfd
#   SHM_SIZE        shared memory of the container (default 16g)
#   JIT_CACHE_VOLUME  Docker volume kept for AITER's JIT cache (default rocm-vllm-aiter-jit)
#   HF_CACHE        host directory mounted as the Hugging Face cache (optional)
#   ACCURACY_DATA_DIR  host directory with the accuracy suite's task data (e.g. gsm8k/test.jsonl,
#                   gsm8k/train.jsonl), mounted read-only at /data/accuracy (ACCURACY_DATA's default)
#   ACCURACY_REFERENCE_DIR  host directory with an earlier accuracy run's results (its accuracy.json
#                   and lm-eval samples, e.g. an earlier RESULTS_DIR), mounted read-only at
#                   /data/accuracy-reference as ACCURACY_REFERENCE: its reference backends are not served again
#   HIP_VISIBLE_DEVICES, PYTEST_ADDOPTS, BENCH_*, ACCURACY_*  passed into the container when set
#                   (PYTEST_ADDOPTS reaches every suite's pytest, e.g. -o junit_logging=system-out)
#   DOCKER          docker command (default docker)
set -euo pipefail

docker_cmd=${DOCKER:-docker}
image=${IMAGE:-${REGISTRY:-localhost/rocm-vllm}/ci:${TAG:-dev}}
results=${RESULTS_DIR:-selftest-results}
dri=${DRI_DIR:-/dev/dri}
kfd=${KFD_PATH:-/dev/kfd}
suite=all
if [ "$#" -gt 0 ] && [ "$1" != "--" ]; then
  suite=$1
  shift
fi

[ -e "$kfd" ] \
  || { echo "error: no $kfd on this host: load the amdgpu driver (ROCm) or run on an AMD GPU runner" >&2; exit 1; }
if [ -z "${RENDER_GID:-}" ]; then
  render_node=$(ls "$dri"/renderD* 2>/dev/null | head -n 1 || true)
  if [ -z "$render_node" ]; then
    echo "error: no $dri/renderD* node on this host: load the amdgpu driver, or set RENDER_GID" >&2
    exit 1
  fi
  RENDER_GID=$(stat -c %g "$render_node")
fi

mkdir -p "$results"
results=$(cd "$results" && pwd)
args=(run --rm
  --device "$kfd:/dev/kfd" --device "$dri:/dev/dri"
  --group-add video --group-add "$RENDER_GID"
  --ipc=host --security-opt seccomp=unconfined --cap-add SYS_PTRACE
  --shm-size "${SHM_SIZE:-16g}"
  -v "$results:/results"
  -v "${JIT_CACHE_VOLUME:-rocm-vllm-aiter-jit}:/var/cache/aiter-jit"
  -e SELFTEST_RESULTS_DIR=/results)
[ -z "${HF_CACHE:-}" ] || args+=(-v "$HF_CACHE:/root/.cache/huggingface")
[ -z "${ACCURACY_DATA_DIR:-}" ] || args+=(-v "$ACCURACY_DATA_DIR:/data/accuracy:ro")
if [ -n "${ACCURACY_REFERENCE_DIR:-}" ]; then
  if [ ! -f "$ACCURACY_REFERENCE_DIR/accuracy.json" ]; then
    echo "error: ACCURACY_REFERENCE_DIR=$ACCURACY_REFERENCE_DIR holds no accuracy.json: name the results directory of an earlier accuracy run" >&2
    exit 2
  fi
  args+=(-v "$(cd "$ACCURACY_REFERENCE_DIR" && pwd):/data/accuracy-reference:ro" -e ACCURACY_REFERENCE=/data/accuracy-reference)
fi
for name in HIP_VISIBLE_DEVICES PYTEST_ADDOPTS $(compgen -e | grep -E '^(BENCH|ACCURACY)_' | grep -vE '^ACCURACY_(DATA|REFERENCE)_DIR$' || true); do
  [ -z "${!name:-}" ] || args+=(-e "$name=${!name}")
done

echo "== selftest $suite in $image (render GID $RENDER_GID, results $results)"
set +e
"$docker_cmd" "${args[@]}" "$image" selftest "$suite" \
  --json /results/selftest.json --junit /results/selftest.xml "$@" 2>&1 | tee "$results/selftest.log"
status=${PIPESTATUS[0]}
set -e

if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  {
    echo '```'
    sed -n '/selftest summary/,$p' "$results/selftest.log"
    echo '```'
  } >>"$GITHUB_STEP_SUMMARY"
fi
echo "== selftest $suite exit $status; results: $results/selftest.json, $results/selftest.xml"
exit "$status"
