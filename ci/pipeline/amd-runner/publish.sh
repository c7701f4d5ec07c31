#!/usr/bin/env bash
# Build the images on an AMD build runner and push them with registry build cache, SBOM and
# provenance attestations.
#
#   ci/pipeline/amd-runner/publish.sh [TARGET...]        default targets: base serve ci
#
# 1. `python3 -m ci.pins verify --strict`: a pushed image has every pin resolved
#    (PUBLISH=print: verify without --strict).
# 2. `python3 -m ci.pipeline bake-file`: a bake file with, per target, the tags
#    vllm<version>-aiter<12 hex>-<12 hex of GIT_SHA> (+ the git tag or branch name of GIT_REF),
#    cache-from/cache-to type=registry (one cache ref per target, keyed so that a vLLM bump
#    reuses the AITER layers) and attest type=sbom / type=provenance,mode=max.
# 3. ci/pipeline/amd-runner/build.sh with that file and --push.
#
# Settings:
#   REGISTRY     image repository prefix, required (images: $REGISTRY/<target>:<tag>)
#   CACHE_REPO   build cache repository (default $REGISTRY/buildcache)
#   GIT_SHA      commit being built (default: git rev-parse HEAD)
#   GIT_REF      git ref being built, e.g. refs/tags/v1.0 (default $GITHUB_REF)
#   TRACK, AITER_PIN, GPU_ARCHS   as for bake (default: versions.json default_track, its AITER pin)
#   BUILDER      buildx builder to use; created with the docker-container driver when missing
#                (registry cache export and attestations need it). Empty: the current builder.
#   PUBLISH      push (default) | print (resolve the graph with `bake --print`, push nothing)
#   RESULTS_DIR  where the bake file and metadata are written (default ./selftest-results)
#   DOCKER       docker command (default docker)
# When $GITHUB_OUTPUT is set, writes tag=<tag> and image-prefix=<REGISTRY> to it.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../../.."

docker_cmd=${DOCKER:-docker}
results=${RESULTS_DIR:-selftest-results}
mode=${PUBLISH:-push}
if [ "$#" -eq 0 ]; then
  set -- base serve ci
fi
case "$mode" in
  push) bake_mode=--push ;;
  print) bake_mode=--print ;;
  *) echo "error: PUBLISH=$mode: set PUBLISH to push or print" >&2; exit 1 ;;
esac
if [ -z "${REGISTRY:-}" ]; then
  echo "error: REGISTRY is not set: set REGISTRY to the repository prefix to push to (e.g. ghcr.io/org/rocm-vllm)" >&2
  exit 1
fi
sha=${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || true)}
ref=${GIT_REF:-${GITHUB_REF:-}}
pin_args=()
if [ -n "${TRACK:-}" ]; then pin_args+=(--track "$TRACK"); fi
if [ -n "${AITER_PIN:-}" ]; then pin_args+=(--aiter-pin "$AITER_PIN"); fi

if [ "$mode" = push ]; then
  echo "== verify pins (python3 -m ci.pins verify --strict)" >&2
  python3 -m ci.pins verify --strict "${pin_args[@]}" >&2
else
  echo "== verify pins (python3 -m ci.pins verify; not --strict: PUBLISH=print pushes nothing)" >&2
  python3 -m ci.pins verify "${pin_args[@]}" >&2
fi

mkdir -p "$results"
results=$(cd "$results" && pwd)
case "$results" in
  *[[:space:]]*) echo "error: RESULTS_DIR '$results' contains whitespace: set RESULTS_DIR to a path without spaces" >&2; exit 1 ;;
esac
bake_file=$results/publish.bake.json
python3 -m ci.pipeline bake-file --registry "$REGISTRY" --sha "$sha" --ref "$ref" \
  --cache-repo "${CACHE_REPO:-}" --gpu-archs "${GPU_ARCHS:-}" "${pin_args[@]}" "$@" >"$bake_file"
tag=$(python3 -m ci.pipeline tag --sha "$sha" "${pin_args[@]}")
echo "== images: ${REGISTRY%/}/{$(IFS=,; echo "$*")}:$tag (bake file $bake_file)" >&2
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  { echo "tag=$tag"; echo "image-prefix=${REGISTRY%/}"; } >>"$GITHUB_OUTPUT"
fi

if [ -n "${BUILDER:-}" ]; then
  if ! "$docker_cmd" buildx inspect "$BUILDER" >/dev/null 2>&1; then
    echo "== creating buildx builder $BUILDER (docker-container driver)" >&2
    "$docker_cmd" buildx create --name "$BUILDER" --driver docker-container >&2
  fi
  export BUILDX_BUILDER=$BUILDER
fi

export TAG=$tag VCS_REF=$sha RESULTS_DIR=$results
BAKE_ARGS="$bake_mode -f $bake_file" DOCKER="$docker_cmd" exec bash ci/pipeline/amd-runner/build.sh "$@"
