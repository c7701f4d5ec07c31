#!/usr/bin/env bash
# Triton for a therock track, built from source as vLLM's own TheRock base builds it: the pinned
# repository at the pinned commit (versions.json tracks.<track>.therock.triton), one wheel into DEST,
# its version checked against the pin.
#
#   build_triton.sh DEST
#
# Settings (build args): TRITON_REPOSITORY, TRITON_COMMIT, TRITON_VERSION, MAX_JOBS, ALLOW_UNRESOLVED
# (1: build the default branch head of an unresolved commit; development only). The build runs
# without isolation on the hash-pinned requirements-build.txt. Triton's own build fetches the LLVM
# its commit names (cmake/llvm-hash.txt): part of the pinned commit, not of this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "triton-wheel: ERROR: $*" >&2; exit 1; }
warn() { echo "triton-wheel: WARNING: $*" >&2; }
# shellcheck source=lib.sh
source "$here/lib.sh"
dest=${1:?usage: build_triton.sh DEST}
: "${TRITON_REPOSITORY:?set the TRITON_REPOSITORY build arg}" "${TRITON_VERSION:?set the TRITON_VERSION build arg}"
: "${TRITON_COMMIT:?set the TRITON_COMMIT build arg}"
check_pin "the Triton commit" "$TRITON_COMMIT" therock
use_ca_bundle
src=$(mktemp -d)  # left in this stage's layer: only DEST leaves the stage
git -c advice.detachedHead=false clone --quiet -- "$TRITON_REPOSITORY" "$src" \
  || fail "cannot clone $TRITON_REPOSITORY (versions.json tracks.<track>.therock.triton.repository)"
if [ "$TRITON_COMMIT" != UNRESOLVED ]; then
  git -C "$src" -c advice.detachedHead=false checkout --quiet "$TRITON_COMMIT" \
    || fail "$TRITON_REPOSITORY has no commit $TRITON_COMMIT (tracks.<track>.therock.triton.commit)"
fi
head=$(git -C "$src" rev-parse HEAD)
[ "$TRITON_COMMIT" = UNRESOLVED ] || [ "$head" = "$TRITON_COMMIT" ] \
  || fail "checked out $head, not the pinned $TRITON_COMMIT"
echo "triton-wheel: $TRITON_REPOSITORY at $head"
# setup.py at the top (newer Triton) or under python/ (older)
project=$src
[ -f "$project/setup.py" ] || project=$src/python
[ -f "$project/setup.py" ] || fail "$TRITON_REPOSITORY at $head has no setup.py (top or python/)"
python -m pip install --require-hashes --no-deps -r "$here/requirements-build.txt"
derive_max_jobs triton-wheel TRITON_MEM_PER_JOB_GIB
mkdir -p "$dest"
(cd "$project" && python -m pip wheel --no-deps --no-build-isolation --wheel-dir "$dest" .)
wheels=("$dest"/triton-*.whl)
[ "${#wheels[@]}" = 1 ] && [ -f "${wheels[0]}" ] || fail "the build left no single triton wheel in $dest"
built=$(basename "${wheels[0]}" | cut -d- -f2)
# a wheel's file name writes the local version's '+' as is
[ "$built" = "$TRITON_VERSION" ] \
  || fail "built Triton $built, not the pinned $TRITON_VERSION (tracks.<track>.therock.triton.version): the commit and version disagree"
echo "triton-wheel: ${wheels[0]}"
