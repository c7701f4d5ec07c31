#!/usr/bin/env bash
# The kept test environments of .ci/run (its cache folder, ROCM_VLLM_TEST_CACHE): the one place
# that removes one.
#
#   test-cache.sh make VENV          create the folder VENV with this script's marker inside (a folder
#                                    already there is used as it is, never marked: it stays its owner's)
#   test-cache.sh use VENV CMD...    run CMD holding VENV's lock (shared: many test runs may use one
#                                    venv at once); CMD's exit status
#   test-cache.sh prune CACHE KEEP   remove each CACHE/venv-* other than KEEP that this script made
#                                    (its marker inside, not a symbolic link) and that no test run
#                                    uses (its lock taken exclusively, without waiting, for the
#                                    removal); everything else in CACHE is kept
set -euo pipefail

MARKER=.rocm-vllm-test-venv
LOCK=.rocm-vllm-test-venv.lock

usage() {
  echo "usage: $0 make VENV | use VENV CMD... | prune CACHE KEEP" >&2
  exit 2
}

made() {  # a real folder (not a link) with the marker, a regular file, inside
  [ -d "$1" ] && [ ! -L "$1" ] && [ -f "$1/$MARKER" ] && [ ! -L "$1/$MARKER" ]
}

case "${1:-}" in
  make)
    [ $# -eq 2 ] || usage
    if [ ! -e "$2" ] && [ ! -L "$2" ]; then
      mkdir -p "$2"
      echo "made by .ci/run: removed by ci/test-machine/test-cache.sh when no test run uses it" >"$2/$MARKER"
    fi
    ;;
  use)
    [ $# -ge 3 ] || usage
    venv=$2
    shift 2
    if made "$venv"; then
      exec flock --shared "$venv/$LOCK" "$@"
    fi
    exec "$@"
    ;;
  prune)
    [ $# -eq 3 ] || usage
    cache=$2 keep=$3
    for old in "$cache"/venv-*; do
      [ "$old" != "$keep" ] || continue
      if ! made "$old"; then
        [ -e "$old" ] || [ -L "$old" ] || continue  # the pattern matched nothing
        echo "keeping $old: not made by .ci/run (no $MARKER in it)"
        continue
      fi
      # Exclusive and without waiting: a test run holds the lock shared while it uses the venv.
      rc=0
      flock --exclusive --nonblock --conflict-exit-code 75 "$old/$LOCK" rm -rf -- "$old" || rc=$?
      case $rc in
        0) echo "removing an earlier test venv: $old" ;;
        75) echo "keeping $old: in use by a running test command" ;;
        *) echo "warning: $old could not be removed completely (see above)" >&2 ;;
      esac
    done
    ;;
  *) usage ;;
esac
