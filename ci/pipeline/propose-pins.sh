#!/usr/bin/env bash
# Resolve pins against upstream and propose the result as a pull request. Never pushes
# to the base branch: the change goes to its own branch and a pull request carries it,
# with the resolve and `verify --strict` output in its description.
#
#   ci/pipeline/propose-pins.sh
#
# Settings:
#   PINS_WHAT     what `python3 -m ci.pins resolve` resolves (default "aiter vllm")
#   PINS_BRANCH   branch the proposal is pushed to, force-updated (default pins/resolve)
#   PINS_BASE     base branch of the pull request (default main)
#   PINS_REMOTE   git remote to push the branch to (default origin)
#   PINS_AUTHOR   commit author "Name <email>" (default github-actions[bot])
#   RESULTS_DIR   where resolve.log, verify.log and pr-body.md go (default ./pins-results)
#   GH            GitHub CLI command (default gh; it reads GH_TOKEN)
# Exit: 0 nothing to propose or the pull request is open; 1 resolve or git/gh failed.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."

gh_cmd=${GH:-gh}
what=${PINS_WHAT:-aiter vllm}
branch=${PINS_BRANCH:-pins/resolve}
base=${PINS_BASE:-main}
remote=${PINS_REMOTE:-origin}
author=${PINS_AUTHOR:-github-actions[bot] <41898282+github-actions[bot]@users.noreply.github.com>}
results=${RESULTS_DIR:-pins-results}
files=(versions.json Dockerfile.rocm_base Dockerfile.rocm)

if [ "$branch" = "$base" ]; then
  echo "error: PINS_BRANCH is the base branch '$base': set PINS_BRANCH to a branch of its own" >&2
  exit 1
fi
if ! git diff --quiet HEAD -- "${files[@]}"; then
  echo "error: ${files[*]} have uncommitted changes: run in a clean checkout" >&2
  exit 1
fi
mkdir -p "$results"
read -r -a items <<<"$what"

echo "== python3 -m ci.pins resolve ${items[*]} --write"
set +e
python3 -m ci.pins resolve "${items[@]}" --write >"$results/resolve.log" 2>&1
status=$?
set -e
cat "$results/resolve.log"
if [ "$status" -ne 0 ]; then
  echo "error: python3 -m ci.pins resolve failed (exit $status): see the line above; nothing proposed" >&2
  exit 1
fi
if git diff --quiet HEAD -- "${files[@]}"; then
  echo "== pins unchanged: nothing to propose"
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    echo "Pins: nothing to propose (\`resolve ${items[*]}\` changed nothing)." >>"$GITHUB_STEP_SUMMARY"
  fi
  exit 0
fi

set +e
python3 -m ci.pins verify --strict >"$results/verify.log" 2>&1
verify_status=$?
set -e
cat "$results/verify.log"

body=$results/pr-body.md
{
  echo "Pins resolved by \`python3 -m ci.pins resolve ${items[*]} --write\`:"
  echo
  echo '```'
  cat "$results/resolve.log"
  echo '```'
  echo
  echo "\`python3 -m ci.pins verify --strict\` (exit $verify_status):"
  echo
  echo '```'
  cat "$results/verify.log"
  echo '```'
  echo
  echo "Proposed by the scheduled pins job (ci/pipeline/propose-pins.sh); the images are built when this merges."
} >"$body"

name=${author%% <*}
email=${author#*<}
email=${email%>}
git switch --quiet -C "$branch"
git -c "user.name=$name" -c "user.email=$email" commit --quiet \
  -m "pins: resolve ${items[*]} (verify --strict exit $verify_status)" -- "${files[@]}"
git push --quiet --force "$remote" "HEAD:refs/heads/$branch"

number=$("$gh_cmd" pr list --head "$branch" --base "$base" --state open --json number --jq '.[0].number')
if [ -n "$number" ]; then
  "$gh_cmd" pr edit "$number" --body-file "$body"
  echo "== updated pull request #$number from $branch"
else
  "$gh_cmd" pr create --base "$base" --head "$branch" --title "pins: resolve ${items[*]}" --body-file "$body"
  echo "== opened a pull request from $branch into $base"
fi
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  cat "$body" >>"$GITHUB_STEP_SUMMARY"
fi
