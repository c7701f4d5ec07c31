#!/usr/bin/env bash
# Build the images on an AMD build runner and push them with registry build cache, SBOM and
# provenance attestations.
#
#   ci/pipeline/amd-runner/publish.sh [TARGET...]        default targets: base serve ci
#
# Its python3 runs the pin tool and the pipeline's Python (python3 -m ci.pipeline: the commit tag and
# push settings read from the graph, tag.sh's checks): run it under uv (uv run --locked --project tools/pins
# bash ...), whose environment, made from tools/pins/uv.lock, has their libraries and the runtime package.
#
# Tags, cache refs and attestations are declared in docker-bake.hcl (PUSH=1); this script passes
# what differs per run:
# 1. `python3 -m tools.pins verify --strict`: a pushed image has every pin resolved
#    (PUBLISH=print: verify without --strict).
# 2. `docker buildx bake --print` with PUSH=1, REGISTRY, TAG (the branch or git tag name of
#    GIT_REF) and VCS_REF=GIT_SHA: the resolved graph, written to RESULTS_DIR/bake-print.json.
#    Tags vllm<version>-aiter<12 hex>-<12 hex of GIT_SHA> (+ branch-<branch name> or the git tag name),
#    cache-from/cache-to type=registry (one ref per target in CACHE_REPO, keyed so that a vLLM
#    bump reuses the AITER layers), attest type=sbom / type=provenance,mode=max.
# 3. ci/pipeline/amd-runner/build.sh with PUSH=1: bake builds that graph and pushes each image by
#    digest only (its output with push-by-digest=true; with the engine's own builder, which cannot,
#    under the scratch tag <name>:unpublished-<commit tag>): no tag is set while any target may fail.
# 4. ci/pipeline/amd-runner/tag.sh: every tag of the graph checked against the registry, then set.
#    A tag that already points to another digest is refused (nothing tagged, one line) unless
#    PUBLISH_FORCE=1; the branch's own tag (GIT_REF refs/heads/<name>: branch-<name>) moves to the
#    new commit. A git tag whose name starts with branch- is refused before anything runs.
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
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../../.."

docker_cmd=${DOCKER:-docker}
results=${RESULTS_DIR:-selftest-results}
mode=${PUBLISH:-push}
if [ "$#" -eq 0 ]; then
  set -- base serve ci
fi
case "$mode" in
  push|print) ;;
  *) echo "error: PUBLISH=$mode: set PUBLISH to push or print" >&2; exit 1 ;;
esac
registry=${REGISTRY:-}
if [ -z "$registry" ]; then
  echo "error: REGISTRY is not set: set REGISTRY to the repository prefix to push to (e.g. ghcr.io/org/rocm-vllm)" >&2
  exit 1
fi
case "$registry" in
  localhost/*) echo "error: REGISTRY '$registry' is not a registry to push to: set REGISTRY (e.g. ghcr.io/org/rocm-vllm)" >&2; exit 1 ;;
  *[A-Z]*) echo "error: REGISTRY '$registry' has upper-case letters, which image names cannot have: set REGISTRY in lower case" >&2; exit 1 ;;
esac
sha=${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || true)}
if ! [[ $sha =~ ^[0-9a-f]{40}$ ]]; then
  echo "error: GIT_SHA '$sha' is not a full 40-hex commit id: set GIT_SHA to the commit being built" >&2
  exit 1
fi
# The floating tag: the branch or git tag name (none for other refs, e.g. refs/pull/1/merge).
ref=${GIT_REF:-${GITHUB_REF:-}}
name=
branch=0
case "$ref" in
  refs/tags/*|refs/heads/*) name=${ref#refs/*/} ;;
esac
case "$ref" in
  refs/heads/*) branch=1 ;;
esac
name=${name//[^A-Za-z0-9_.-]/-}
while [[ $name == [.-]* ]]; do name=${name#?}; done
# Branches and releases have a tag namespace each: a branch's tag is branch-<name> (it moves to each
# new commit), a git tag's is its name (it never moves without PUBLISH_FORCE=1), and no git tag's
# name may start with branch-: a branch named v1.0 tags branch-v1.0, never the release v1.0.
if [ "$branch" = 1 ] && [ -n "$name" ]; then
  name=branch-$name
elif [[ $name == branch-* ]]; then
  echo "error: the git tag ${ref#refs/tags/} would tag the images $name, in the namespace of branch tags (branch-<branch>, moved by every push to that branch): name the release without the branch- prefix" >&2
  exit 1
fi
name=${name:0:128}

# An empty setting means "the default": left to bake (an empty variable would override it).
for setting in TRACK AITER_PIN GPU_ARCHS CACHE_REPO; do
  if [ -z "${!setting:-}" ]; then unset "$setting"; fi
done
pin_args=()
if [ -n "${TRACK:-}" ]; then pin_args+=(--track "$TRACK"); fi
if [ -n "${AITER_PIN:-}" ]; then pin_args+=(--aiter-pin "$AITER_PIN"); fi

# The CPU images (serve-cpu, ci-cpu, group cpu) build from the CPU vLLM image (VLLM_CPU_IMAGE) and
# none of the ROCm pins: publishing only them does not need every ROCm pin resolved.
cpu_only=1
for target in "$@"; do
  case "$target" in
    serve-cpu|ci-cpu|cpu) ;;
    *) cpu_only=0 ;;
  esac
done
if [ "$mode" = push ] && [ "$cpu_only" = 1 ]; then
  echo "== verify pins (python3 -m tools.pins verify; not --strict: the CPU images $* build from none of the ROCm pins)" >&2
  python3 -m tools.pins verify "${pin_args[@]}" >&2
elif [ "$mode" = push ]; then
  echo "== verify pins (python3 -m tools.pins verify --strict)" >&2
  python3 -m tools.pins verify --strict "${pin_args[@]}" >&2
else
  echo "== verify pins (python3 -m tools.pins verify; not --strict: PUBLISH=print pushes nothing)" >&2
  python3 -m tools.pins verify "${pin_args[@]}" >&2
fi

mkdir -p "$results"
results=$(cd "$results" && pwd)
export PUSH=1 REGISTRY=${registry%/} TAG=$name VCS_REF=$sha RESULTS_DIR=$results
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

# Each target's output as the graph declares it, pushed by digest only: the tags are set by tag.sh.
# The engine's own builder (docker driver) cannot push by digest: there each image is pushed under one
# scratch tag, <name>:unpublished-<commit tag>, which no consumer takes, and tagged the same way.
driver=$("$docker_cmd" buildx inspect ${BUILDER:+"$BUILDER"} 2>/dev/null | sed -n 's/^Driver: *//p' | head -n 1 || true)
read -r -a unpublished < <(python3 -m ci.pipeline push-settings "$graph" "$driver" "$tag")
if [ "${#unpublished[@]}" -eq 0 ]; then
  echo "error: no push settings could be made from $graph (see above): nothing built, nothing tagged" >&2
  exit 1
fi
status=0
BAKE_ARGS="${unpublished[*]}" DOCKER="$docker_cmd" bash ci/pipeline/amd-runner/build.sh "$@" || status=$?
if [ "$status" != 0 ]; then
  echo "error: the build or its push to $REGISTRY failed (exit $status; registry down or refusing, see above): nothing tagged" >&2
  exit 1
fi
movable=
if [ "$branch" = 1 ] && [ -n "$name" ]; then movable=$name; fi
MOVABLE_TAGS=$movable DOCKER="$docker_cmd" bash ci/pipeline/amd-runner/tag.sh "$graph" "$results/bake-metadata.json"
