#!/usr/bin/env bash
# Follow upstream and propose the results as pull requests. Never pushes to the base branch:
# each change goes to a branch of its own and a pull request carries it.
#
#   uv run --locked --project tools bash ci/pipeline/propose-pins.sh
#
# (under uv, python3 is the tools' environment, made from tools/uv.lock)
#
# 1. New vLLM releases (python3 -m tools.pins discover): one pull request per release, on the branch
#    pins/vllm-<version>, adding it as the default release track from its sdist (AITER named by its
#    ROCm base Dockerfile), with its pins resolved where upstream answers, `verify --strict`, the
#    tests of PINS_TESTS, what changed upstream and newer AITER tags in the description.
# 2. The existing pins re-resolved (python3 -m tools.pins resolve) on PINS_BRANCH, as before.
#
# Settings:
#   PINS_WHAT     what `python3 -m tools.pins resolve` resolves (default "aiter vllm")
#   PINS_RELEASE_WHAT  what is resolved for a new release's track (default "aiter vllm")
#   PINS_TESTS    command run on a new release's proposal (default: the pins, sdist and track tests
#                 through bash ci/test.sh); its exit status goes into the description
#   PINS_UP_TO    leave out vLLM releases after this one (default: none)
#   PINS_SDIST_CACHE  where discover keeps sdists (default ~/.cache/rocm-vllm-pins)
#   PINS_PYTHON   Python with uv for `tools.pins lock` (default .venv/bin/python when present, else python3:
#                 run under `uv run --locked --project tools`, the tools' environment, which has uv)
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
files=(versions.json docker-bake.pins.json Dockerfile.rocm_base Dockerfile.rocm backend/src/vllm_aiter_mla/__init__.py)

[ "$branch" != "$base" ] \
  || { echo "error: PINS_BRANCH is the base branch '$base': set PINS_BRANCH to a branch of its own" >&2; exit 1; }
git diff --quiet HEAD -- "${files[@]}" \
  || { echo "error: ${files[*]} have uncommitted changes: run in a clean checkout" >&2; exit 1; }
mkdir -p "$results"
read -r -a items <<<"$what"
read -r -a release_items <<<"${PINS_RELEASE_WHAT:-aiter vllm}"
tests_cmd=${PINS_TESTS:-bash ci/test.sh tests/test_pins.py tests/test_discover.py tests/test_vllm_source.py tests/test_tracks.py tests/test_aiter_calls.py}
# The Python that runs `tools.pins lock` (it needs uv: tools/uv.lock and tests/requirements.lock install it).
pins_python=${PINS_PYTHON:-python3}
[ -n "${PINS_PYTHON:-}" ] || [ ! -x .venv/bin/python ] || pins_python=.venv/bin/python
discover_args=(--sdist-cache "${PINS_SDIST_CACHE:-$HOME/.cache/rocm-vllm-pins}")
if [ -n "${PINS_UP_TO:-}" ]; then discover_args+=(--up-to "$PINS_UP_TO"); fi
name=${author%% <*}
email=${author#*<}
email=${email%>}
start=$(git rev-parse HEAD)

# A section of a pull request's body: the line $1, then standard input as a code block.
section() { echo "$1"; echo; echo '```'; cat; echo '```'; }

# Push HEAD to $1 and open (or update) its pull request into $base with title $2 and body file $3.
propose() {
  git push --quiet --force "$remote" "HEAD:refs/heads/$1"
  local number
  number=$("$gh_cmd" pr list --head "$1" --base "$base" --state open --json number --jq '.[0].number')
  if [ -n "$number" ]; then
    "$gh_cmd" pr edit "$number" --body-file "$3"
    echo "== updated pull request #$number from $1"
  else
    "$gh_cmd" pr create --base "$base" --head "$1" --title "$2" --body-file "$3"
    echo "== opened a pull request from $1 into $base"
  fi
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$3" >>"$GITHUB_STEP_SUMMARY"
  fi
}

echo "== python3 -m tools.pins discover --list"
if ! releases=$(python3 -m tools.pins discover --list "${discover_args[@]}"); then
  echo "error: python3 -m tools.pins discover failed: see the line above; nothing proposed" >&2
  exit 1
fi
for version in $releases; do
  echo "== vLLM $version: python3 -m tools.pins discover --release $version --write"
  git switch --quiet --detach "$start"
  out=$results/vllm-$version
  mkdir -p "$out"
  if ! python3 -m tools.pins discover --release "$version" --write --aiter-tags "${discover_args[@]}" \
      --summary "$out/summary.md" >"$out/discover.log" 2>&1; then
    cat "$out/discover.log"
    echo "error: python3 -m tools.pins discover --release $version failed: see the line above; nothing proposed" >&2
    exit 1
  fi
  cat "$out/discover.log"
  # the track discover added: the newest (the default only where its stack is built here)
  names=$(python3 -m tools.pins tracks --names)
  track=${names%%$'\n'*}
  built_names=$(python3 -m tools.pins tracks --names --built)
  built=0
  if grep -qxF -- "$track" <<<"$built_names"; then built=1; fi
  set +e
  python3 -m tools.pins resolve "${release_items[@]}" --track "$track" --write >"$out/resolve.log" 2>&1
  resolve_status=$?
  python3 -m tools.pins verify --strict --track "$track" >"$out/verify.log" 2>&1
  verify_status=$?
  # the new track's lock of vLLM's runtime requirements (uv: the test environment's, PINS_PYTHON)
  lock=docker/locks/vllm-$track-rocm.txt
  if [ "$built" = 1 ]; then
    "$pins_python" -m tools.pins lock "vllm-$track" "${discover_args[@]:0:2}" >"$out/lock.log" 2>&1
    lock_status=$?
  else
    echo "no lock: track $track's ROCm stack is not built here yet, so no image installs it" >"$out/lock.log"
    lock_status=0
  fi
  [ -f "$lock" ] && git add -- "$lock"
  # a therock track's TheRock lock, where PINS_RELEASE_WHAT has resolve make it (therock)
  therock_lock=docker/locks/therock-$track.txt
  [ -f "$therock_lock" ] && git add -- "$therock_lock"
  bash -c "$tests_cmd" >"$out/tests.log" 2>&1
  tests_status=$?
  set -e
  body=$out/pr-body.md
  {
    echo "vLLM $version was released: proposed as the release track $track (\`python3 -m tools.pins discover\`)."
    echo
    cat "$out/summary.md"
    echo
    section "\`python3 -m tools.pins resolve ${release_items[*]} --track $track --write\` (exit $resolve_status):" \
      <"$out/resolve.log"
    echo
    section "\`python3 -m tools.pins verify --strict --track $track\` (exit $verify_status):" <"$out/verify.log"
    echo
    section "\`python3 -m tools.pins lock vllm-$track\` (exit $lock_status):" <"$out/lock.log"
    echo
    tail -n 20 "$out/tests.log" | section "Tests (\`$tests_cmd\`): exit $tests_status; last lines:"
  } >"$body"
  git switch --quiet -C "pins/vllm-$version"
  git -c "user.name=$name" -c "user.email=$email" commit --quiet \
    -m "pins: vLLM $version as release track $track (tests exit $tests_status)" -- "${files[@]}" \
    $([ -f "$lock" ] && echo "$lock") $([ -f "$therock_lock" ] && echo "$therock_lock")
  propose "pins/vllm-$version" "pins: vLLM $version as release track $track" "$body"
done
git switch --quiet --detach "$start"

echo "== python3 -m tools.pins resolve ${items[*]} --write"
python3 -m tools.pins resolve "${items[@]}" --write >"$results/resolve.log" 2>&1 && status=0 || status=$?
cat "$results/resolve.log"
if [ "$status" -ne 0 ]; then
  echo "error: python3 -m tools.pins resolve failed (exit $status): see the line above; nothing proposed" >&2
  exit 1
fi
if git diff --quiet HEAD -- "${files[@]}"; then
  echo "== pins unchanged: nothing to propose"
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    echo "Pins: nothing to propose (\`resolve ${items[*]}\` changed nothing)." >>"$GITHUB_STEP_SUMMARY"
  fi
  exit 0
fi

python3 -m tools.pins verify --strict >"$results/verify.log" 2>&1 && verify_status=0 || verify_status=$?
cat "$results/verify.log"

body=$results/pr-body.md
{
  section "Pins resolved by \`python3 -m tools.pins resolve ${items[*]} --write\`:" <"$results/resolve.log"
  echo
  section "\`python3 -m tools.pins verify --strict\` (exit $verify_status):" <"$results/verify.log"
  echo
  echo "Proposed by the scheduled pins job (ci/pipeline/propose-pins.sh); the images are built when this merges."
} >"$body"

git switch --quiet -C "$branch"
git -c "user.name=$name" -c "user.email=$email" commit --quiet \
  -m "pins: resolve ${items[*]} (verify --strict exit $verify_status)" -- "${files[@]}"
propose "$branch" "pins: resolve ${items[*]}" "$body"
