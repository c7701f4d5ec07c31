#!/usr/bin/env bash
# Build the images on an AMD build runner and push them with registry build cache, SBOM and
# provenance attestations.
#
#   ci/pipeline/amd-runner/publish.sh [TARGET...]        default targets: base serve ci
#
# Its python3 runs the pin tool and the pipeline's Python (python3 -m ci.pipeline: the commit tag and
# push settings read from the graph, tag.sh's checks): run it under uv (uv run --locked --project tools
# bash ...), whose environment, made from tools/uv.lock, has their libraries and the runtime package.
#
# Tags, cache refs and attestations are declared in docker-bake.hcl (PUSH=1); this script passes
# what differs per run:
# 1. `python3 -m tools.pins verify --strict`: a pushed image has every pin resolved (PUBLISH=print: no --strict).
# 2. `docker buildx bake --print` with PUSH=1, REGISTRY, TAG (the branch or git tag name of GIT_REF) and
#    VCS_REF=GIT_SHA: the resolved graph, written to RESULTS_DIR/bake-print.json.
# 3. ci/pipeline/amd-runner/build.sh with PUSH=1: each image pushed by digest only (ci/pipeline/publish.py),
#    so no tag is set while any target may fail.
# 4. ci/pipeline/amd-runner/tag.sh: every tag of the graph checked against the registry, then set.
# A registry that does not answer, or refuses the credentials (login.sh), stops the run in one line,
# before anything is tagged.
#
# Settings:
#   REGISTRY     image repository prefix, required (images: $REGISTRY/<target>:<tag>)
#   CACHE_REPO   build cache repository (default $REGISTRY/buildcache)
#   GIT_SHA      commit being built, 40 hex (default: git rev-parse HEAD)
#   GIT_REF      git ref being built, e.g. refs/tags/v1.0 or refs/heads/main (default $GITHUB_REF);
#                its name, with characters a tag cannot have replaced by '-', tags the images too
#                (a branch's as branch-<name>: v1.0 for the git tag, branch-main for the branch)
#   TRACK, AITER_PIN, GPU_ARCHS   as for bake (default: versions.json default_track, its AITER pin)
#   BUILDER      buildx builder to use; created with the docker-container driver when missing
#                (registry cache export and attestations need it). Empty: the current builder.
#   PUBLISH      push (default) | print (print the resolved graph, push nothing)
#   PUBLISH_FORCE  1: move tags that point to another digest (default 0: refuse)
#   RESULTS_DIR  where the resolved graph, tag.env (TAG=<tag>) and the build metadata are written
#                (default ./selftest-results)
#   DOCKER       docker command (default docker)
# When $GITHUB_OUTPUT is set, writes tag=<tag> and image-prefix=<REGISTRY> to it.
#
# The settings are checked, and the floating tag and the verify mode decided, by ci/pipeline/publish.py
# (python3 -m ci.pipeline plan) before anything runs; this script runs the commands.
# Exit status: 0 published (PUBLISH=print: the graph printed); 1 a setting refused, the build or its push
# failed, or a tag refused (one line each, nothing tagged); a failing verify or bake --print, its own.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../../.."

docker_cmd=${DOCKER:-docker}
results=${RESULTS_DIR:-selftest-results}
[ "$#" -gt 0 ] || set -- base serve ci
# The settings checked and what follows from them: ci/pipeline/publish.py (python3 -m ci.pipeline plan),
# one value a line; a refused setting is its one line, and nothing runs.
answer=$(GIT_SHA=${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || true)} python3 -m ci.pipeline plan "$@") || exit 1
mapfile -t plan <<<"$answer"
if [ "${#plan[@]}" -ne 7 ]; then
  echo "error: python3 -m ci.pipeline plan printed ${#plan[@]} lines, not the 7 this script reads: run the publish.sh of the same checkout as ci/pipeline" >&2
  exit 1
fi
mode=${plan[0]} registry=${plan[1]} sha=${plan[2]} name=${plan[3]} movable=${plan[4]} strict=${plan[5]}

# An empty setting means "the default": left to bake (an empty variable would override it).
for setting in TRACK AITER_PIN GPU_ARCHS CACHE_REPO; do
  if [ -z "${!setting:-}" ]; then unset "$setting"; fi
done
verify_args=()
if [ "$strict" = 1 ]; then verify_args+=(--strict); fi
if [ -n "${TRACK:-}" ]; then verify_args+=(--track "$TRACK"); fi
if [ -n "${AITER_PIN:-}" ]; then verify_args+=(--aiter-pin "$AITER_PIN"); fi
echo "== verify pins (${plan[6]})" >&2
python3 -m tools.pins verify "${verify_args[@]}" >&2

mkdir -p "$results"
results=$(cd "$results" && pwd)
export PUSH=1 REGISTRY=$registry TAG=$name VCS_REF=$sha RESULTS_DIR=$results
if [ -n "${CACHE_REPO:-}" ]; then export CACHE_REPO=${CACHE_REPO%/}; fi
graph=$results/bake-print.json
"$docker_cmd" buildx bake -f docker-bake.hcl -f docker-bake.pins.json --print "$@" >"$graph"
# The commit tag is each target's first tag (docker-bake.hcl, pushed_tags).
tag=$(python3 -m ci.pipeline commit-tag "$graph")
echo "== images: $REGISTRY/{$(IFS=,; echo "$*")}:$tag (every tag, cache ref and attestation: $graph)" >&2
echo "TAG=$tag" >"$results/tag.env"
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  { echo "tag=$tag"; echo "image-prefix=$REGISTRY"; } >>"$GITHUB_OUTPUT"
fi
if [ "$mode" = print ]; then
  cat "$graph"
  exit 0
fi

if [ -n "${BUILDER:-}" ]; then
  if ! "$docker_cmd" buildx inspect "$BUILDER" >/dev/null 2>&1; then
    echo "== creating buildx builder $BUILDER (docker-container driver)" >&2
    "$docker_cmd" buildx create --name "$BUILDER" --driver docker-container >&2
  fi
  export BUILDX_BUILDER=$BUILDER
fi

# Each target pushed by digest only, or by the engine's own builder under a scratch tag (publish.py push_settings).
inspect=$("$docker_cmd" buildx inspect ${BUILDER:+"$BUILDER"} 2>/dev/null || true)
driver=$(python3 -m ci.pipeline driver <<<"$inspect")
read -r -a unpublished < <(python3 -m ci.pipeline push-settings "$graph" "$driver" "$tag")
if [ "${#unpublished[@]}" -eq 0 ]; then
  echo "error: no push settings could be made from $graph (see above): nothing built, nothing tagged" >&2
  exit 1
fi
BAKE_ARGS="${unpublished[*]}" DOCKER="$docker_cmd" bash ci/pipeline/amd-runner/build.sh "$@" || {
  echo "error: the build or its push to $REGISTRY failed (exit $?; registry down or refusing, see above): nothing tagged" >&2
  exit 1
}
MOVABLE_TAGS=$movable DOCKER="$docker_cmd" bash ci/pipeline/amd-runner/tag.sh "$graph" "$results/bake-metadata.json"
