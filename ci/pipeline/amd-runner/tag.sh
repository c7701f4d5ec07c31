#!/usr/bin/env bash
# Tag images that were pushed by digest, once every target of the build is in the registry
# (ci/pipeline/amd-runner/publish.sh's last step).
#
#   ci/pipeline/amd-runner/tag.sh GRAPH METADATA
#
# GRAPH: the resolved graph (`docker buildx bake --print`, publish.sh's bake-print.json): the targets
# asked for (its default group) and their tags. METADATA: the build's metadata file (bake --metadata-file,
# or one `docker buildx build --metadata-file` per target merged into {target: metadata}): each target's
# pushed digest. Every tag is checked against the registry before any is set; a tag on another digest is
# refused, nothing tagged, unless PUBLISH_FORCE=1 or it is one of MOVABLE_TAGS (branch tags, branch-<name>:
# a branch's tag follows its newest commit). A target without a pushed digest: nothing tagged.
#
# Settings: PUBLISH_FORCE (0|1), MOVABLE_TAGS, DOCKER (docker command, default docker).
# The logic is ci/pipeline/publish.py's (python3 -m ci.pipeline tag); its python3 needs the runtime
# package: run under uv as publish.sh is (uv run --locked --project tools bash ...).
set -euo pipefail

if [ "$#" -ne 2 ]; then
  echo "usage: $0 GRAPH METADATA" >&2
  exit 2
fi
# run from the repository root (python3 -m ci.pipeline), the files named as given from here
graph=$(realpath -ms -- "$1")
metadata=$(realpath -ms -- "$2")
cd "$(dirname "$(readlink -f "$0")")/../../.."
exec python3 -m ci.pipeline tag "$graph" "$metadata"
