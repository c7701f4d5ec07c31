#!/usr/bin/env bash
# Build the images on an AMD runner with `docker buildx bake` (docker-bake.hcl).
#
#   ci/pipeline/amd-runner/build.sh [TARGET...]        default targets: ci serve
#
# Bake variables come from the environment (REGISTRY, TAG, GPU_ARCHS, MAX_JOBS, PUSH,
# CACHE_REPO, CACHE_FROM, CACHE_TO, VCS_REF, ...; see docker-bake.hcl). Other settings:
#   BAKE_ARGS    extra arguments for bake (default --load, none with PUSH=1: the images are
#                pushed; e.g. "--print")
#   RESULTS_DIR  where the build metadata is written (default ./selftest-results)
#   DOCKER       docker command (default docker)
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../../.."

docker_cmd=${DOCKER:-docker}
results=${RESULTS_DIR:-selftest-results}
[ "$#" -gt 0 ] || set -- ci serve
command -v "$docker_cmd" >/dev/null 2>&1 \
  || { echo "error: '$docker_cmd' not found: install Docker with buildx or set DOCKER" >&2; exit 1; }
VCS_REF=${VCS_REF:-$(git rev-parse HEAD 2>/dev/null || true)}
export VCS_REF
mkdir -p "$results"

default_args=--load
if [ "${PUSH:-0}" = 1 ]; then default_args=; fi
read -r -a extra <<<"${BAKE_ARGS:-$default_args}"
echo "== bake ${*} (REGISTRY=${REGISTRY:-<bake default>} TAG=${TAG:-<bake default>} GPU_ARCHS=${GPU_ARCHS:-<versions file>})" >&2
start=$(date +%s)
# docker-bake.pins.json is the bake file of the pins (python3 -m tools.pins render makes it from versions.json).
"$docker_cmd" buildx bake -f docker-bake.hcl -f docker-bake.pins.json --metadata-file "$results/bake-metadata.json" \
  "${extra[@]}" "$@"
echo "== built ${*} in $(( $(date +%s) - start ))s; metadata: $results/bake-metadata.json" >&2
