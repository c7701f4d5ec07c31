#!/usr/bin/env bash
# Triton for a therock track, built from source as vLLM's own TheRock base builds it: the pinned
# repository at the pinned commit (versions.json tracks.<track>.therock.triton), one wheel into DEST,
# its version checked against the pin.
#
#   build_triton.sh DEST
#
# Settings (build args): THEROCK_PINS (JSON: triton.repository, triton.commit, triton.version; read
# by lib.sh load_pins as THEROCK_TRITON_*), ALLOW_UNRESOLVED (1: accept an unresolved commit and
# build the repository's default branch head; development only), MAX_JOBS (compile jobs).
# Build tools come hash-pinned from requirements-build.txt (beside this script); the build runs
# without isolation, so it uses those. Triton's own build fetches the LLVM its commit names
# (cmake/llvm-hash.txt): that download is part of the pinned commit, not of this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "triton-wheel: ERROR: $*" >&2; exit 1; }
warn() { echo "triton-wheel: WARNING: $*" >&2; }
# shellcheck source=pin_check.sh
source "$here/pin_check.sh"
# shellcheck source=lib.sh
source "$here/lib.sh"
dest=${1:?usage: build_triton.sh DEST}
load_pins THEROCK_PINS
: "${THEROCK_TRITON_REPOSITORY:?THEROCK_PINS has no triton.repository}" "${THEROCK_TRITON_VERSION:?THEROCK_PINS has no triton.version}"
: "${THEROCK_TRITON_COMMIT:?THEROCK_PINS has no triton.commit}"
check_pin "the Triton commit" "$THEROCK_TRITON_COMMIT" therock
use_ca_bundle
src=$(mktemp -d)  # left in this stage's layer: only DEST leaves the stage
git -c advice.detachedHead=false clone --quiet -- "$THEROCK_TRITON_REPOSITORY" "$src" \
  || fail "cannot clone $THEROCK_TRITON_REPOSITORY (versions.json tracks.<track>.therock.triton.repository)"
if [ "$THEROCK_TRITON_COMMIT" != UNRESOLVED ]; then
  git -C "$src" -c advice.detachedHead=false checkout --quiet "$THEROCK_TRITON_COMMIT" \
    || fail "$THEROCK_TRITON_REPOSITORY has no commit $THEROCK_TRITON_COMMIT (tracks.<track>.therock.triton.commit)"
fi
head=$(git -C "$src" rev-parse HEAD)
[ "$THEROCK_TRITON_COMMIT" = UNRESOLVED ] || [ "$head" = "$THEROCK_TRITON_COMMIT" ] \
  || fail "checked out $head, not the pinned $THEROCK_TRITON_COMMIT"
echo "triton-wheel: $THEROCK_TRITON_REPOSITORY at $head"
# setup.py at the top (newer Triton) or under python/ (older)
project=$src
[ -f "$project/setup.py" ] || project=$src/python
[ -f "$project/setup.py" ] || fail "$THEROCK_TRITON_REPOSITORY at $head has no setup.py (top or python/)"
python -m pip install --require-hashes --no-deps -r "$here/requirements-build.txt"
derive_max_jobs triton-wheel TRITON_MEM_PER_JOB_GIB
mkdir -p "$dest"
(cd "$project" && python -m pip wheel --no-deps --no-build-isolation --wheel-dir "$dest" .)
wheels=("$dest"/triton-*.whl)
[ "${#wheels[@]}" = 1 ] && [ -f "${wheels[0]}" ] || fail "the build left no single triton wheel in $dest"
built=$(basename "${wheels[0]}" | cut -d- -f2)
# a wheel's file name writes the local version's '+' as is
[ "$built" = "$THEROCK_TRITON_VERSION" ] \
  || fail "built Triton $built, not the pinned $THEROCK_TRITON_VERSION (tracks.<track>.therock.triton.version): the commit and version disagree"
echo "triton-wheel: ${wheels[0]}"
