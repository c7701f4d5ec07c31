#!/usr/bin/env bash
# Tag images that were pushed by digest, once every target of the build is in the registry
# (ci/pipeline/amd-runner/publish.sh's last step).
#
#   ci/pipeline/amd-runner/tag.sh GRAPH METADATA
#
# GRAPH: the resolved graph (`docker buildx bake --print`, publish.sh's bake-print.json): the targets
# asked for (its default group) and their tags. METADATA: the build's metadata file (bake --metadata-file, or one `docker buildx build
# --metadata-file` per target merged into {target: metadata}): each target's pushed digest
# (containerimage.digest). Every tag is checked against the registry before any is set:
# - a tag that does not exist yet, or already points to the pushed digest: set (or kept);
# - a tag that points to another digest: refused, nothing tagged, one line naming the tag and both
#   digests; PUBLISH_FORCE=1 moves it. MOVABLE_TAGS (space-separated tag names) move without
#   asking: a branch's tag follows its newest commit. Only branch tags (branch-<name>, publish.sh's
#   namespace for branches, which no release tag has) can be movable: any other name is refused.
# A target without a pushed digest in METADATA (its build or push failed): nothing tagged.
#
# Settings: PUBLISH_FORCE (0|1), MOVABLE_TAGS, DOCKER (docker command, default docker).
set -euo pipefail

if [ "$#" -ne 2 ]; then
  echo "usage: $0 GRAPH METADATA" >&2
  exit 2
fi
docker_cmd=${DOCKER:-docker}
force=${PUBLISH_FORCE:-0}
case "$force" in
  0|1) ;;
  *) echo "error: PUBLISH_FORCE=$force: set 0 or 1" >&2; exit 1 ;;
esac
for name in ${MOVABLE_TAGS:-}; do
  case "$name" in
    branch-?*) ;;
    *) echo "error: MOVABLE_TAGS names $name, which is no branch's tag (branch-<name>): only a branch's tag moves without PUBLISH_FORCE=1" >&2; exit 1 ;;
  esac
done

# "<target> <image>@<digest> <tag>" per tag, from the graph and the metadata.
plan=$(python3 - "$1" "$2" <<'PY'
import json, re, sys
try:
    graph = json.load(open(sys.argv[1]))
    targets = graph["target"]
    metadata = json.load(open(sys.argv[2]))
except (OSError, ValueError, KeyError, TypeError) as exc:
    sys.exit(f"error: cannot read the graph {sys.argv[1]} or the build metadata {sys.argv[2]} ({exc!r}): nothing tagged")
# The targets asked for (the graph's default group, its groups expanded): a target that is only
# another's context (base for serve) is built, not published.
groups = {name: group.get("targets", []) for name, group in (graph.get("group") or {}).items()}
asked, todo = set(), list(groups.get("default", sorted(targets)))
while todo:
    name = todo.pop()
    if name in groups and name not in targets:
        todo += groups.pop(name)
    else:
        asked.add(name)
for name, target in sorted(targets.items()):
    if name not in asked:
        continue
    digest = (metadata.get(name) or {}).get("containerimage.digest", "") if isinstance(metadata, dict) else ""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest or ""):
        sys.exit(f"error: {name} has no pushed digest in {sys.argv[2]} (its build or push failed): nothing tagged")
    for tag in target.get("tags") or []:
        image = tag.rsplit(":", 1)[0] if ":" in tag.rsplit("/", 1)[-1] else tag
        print(name, f"{image}@{digest}", tag)
PY
)

current_digest() {  # the digest TAG points to now; nothing when the registry has no such tag
  local out err rc
  # docker's answer (stdout, the manifest's JSON) and its messages (stderr) apart, with no file: a
  # warning or a registry's JSON error body is never read as the manifest
  {
    IFS= read -r -d '' err || true
    IFS= read -r -d '' out || true
  } < <({ rc=0; out=$("$docker_cmd" buildx imagetools inspect --format '{{json .Manifest}}' "$1") || rc=$?
          printf '\0%s:%s\0' "$rc" "$out"; } 2>&1)
  rc=${out%%:*}
  out=${out#*:}
  if [ "$rc" = 0 ]; then
    python3 -c '
import json, re, sys
try:
    digest = json.loads(sys.stdin.read())["digest"]
except (ValueError, KeyError, TypeError, IndexError) as exc:
    digest = exc
if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
    sys.exit(f"error: cannot read tag {sys.argv[1]} from its registry (the answer of docker buildx imagetools "
             f"inspect is not a manifest with a sha256 digest: {str(digest)[:80]!r}): nothing tagged")
print(digest)' "$1" <<<"$out"
  elif grep -qiE 'not found|manifest unknown|name unknown' <<<"$err"; then
    return 0
  else
    echo "error: cannot read tag $1 from its registry ($(grep -v '^[[:space:]]*$' <<<"$err" | tail -n 1)): nothing tagged" >&2
    return 1
  fi
}

refused=()
to_set=()
while read -r target ref tag; do
  [ -n "$target" ] || continue
  want=${ref##*@}
  have=$(current_digest "$tag")
  if [ -z "$have" ] || [ "$have" = "$want" ]; then
    to_set+=("$ref $tag")
    continue
  fi
  movable=0
  for name in ${MOVABLE_TAGS:-}; do
    if [ "${tag##*:}" = "$name" ]; then movable=1; fi
  done
  if [ "$force" = 1 ] || [ "$movable" = 1 ]; then
    echo "== moving $tag from $have to $want$([ "$movable" = 1 ] && echo " (a branch's tag)" || echo " (PUBLISH_FORCE=1)")" >&2
    to_set+=("$ref $tag")
  else
    refused+=("$tag points to $have, not $want")
  fi
done <<<"$plan"
if [ "${#refused[@]}" -gt 0 ]; then
  echo "error: $(IFS=';'; echo "${refused[*]}" | sed 's/;/; /g'): nothing tagged; set PUBLISH_FORCE=1 to move them" >&2
  exit 1
fi
for entry in "${to_set[@]}"; do
  read -r ref tag <<<"$entry"
  if ! out=$("$docker_cmd" buildx imagetools create --tag "$tag" "$ref" 2>&1); then
    echo "error: tagging $tag failed ($(tail -n 1 <<<"$out"))" >&2
    exit 1
  fi
  echo "== tagged $tag -> ${ref##*@}" >&2
done
