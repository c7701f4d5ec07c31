#!/usr/bin/env bash
# AITER's own requirements (requirements.txt of the pinned commit), installed from their hash lock:
# every wheel by its sha256, from PyPI's index alone (install_lock.sh, as the base image installs its
# other locks). The lock (docker/locks/aiter-<tag>.txt) is made by python3 -m tools.pins resolve aiter --write
# on a connected host; the base image's distributions (torch, Triton, amdsmi: pinned_dists.py FIXED)
# are left out of it, so nothing here replaces them.
#
#   aiter_requirements.sh SRC LOCKS_DIR CONSTRAINTS
#
# CONSTRAINTS (pinned_dists.py constraints) serve only the unresolved path. Settings: AITER_TAG,
# AITER_REQUIREMENTS_LOCK (in LOCKS_DIR), AITER_REQUIREMENTS_LOCK_SHA256 ("none": the commit has no
# requirements.txt), PYPI_INDEX_URL (default PyPI; a mirror, https:// or file://), ALLOW_UNRESOLVED.
# Each refusal below is one line, before anything is installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
die() { echo "aiter_requirements: ERROR: $*" >&2; exit 1; }
src=${1:?usage: aiter_requirements.sh SRC LOCKS_DIR CONSTRAINTS} locks=${2:?usage: aiter_requirements.sh SRC LOCKS_DIR CONSTRAINTS}
constraints=${3:?usage: aiter_requirements.sh SRC LOCKS_DIR CONSTRAINTS}
: "${AITER_TAG:?set the AITER_TAG build arg}" "${AITER_REQUIREMENTS_LOCK:?set the AITER_REQUIREMENTS_LOCK build arg}"
: "${AITER_REQUIREMENTS_LOCK_SHA256:?set the AITER_REQUIREMENTS_LOCK_SHA256 build arg}"
pinned=$AITER_REQUIREMENTS_LOCK_SHA256 index=${PYPI_INDEX_URL:-https://pypi.org/simple}
fix="python3 -m tools.pins resolve aiter --aiter-pin $AITER_TAG --force --write"
if [ ! -f "$src/requirements.txt" ]; then
  case "$pinned" in
    none) echo "aiter_requirements: AITER $AITER_TAG has no requirements.txt: nothing to install"; exit 0 ;;
    UNRESOLVED) echo "aiter_requirements: AITER $AITER_TAG has no requirements.txt (its lock is unresolved): nothing to install"; exit 0 ;;
    *) die "AITER $AITER_TAG's source has no requirements.txt, but versions.json pins a lock of one: the lock was made from another commit; make it again ($fix)" ;;
  esac
fi
case "$pinned" in
  UNRESOLVED)
    [ "${ALLOW_UNRESOLVED:-0}" = 1 ] \
      || die "the lock of AITER $AITER_TAG's requirements ($AITER_REQUIREMENTS_LOCK) is unresolved in versions.json (requirements_lock_sha256): run 'python3 -m tools.pins resolve aiter --write' on a host that reaches GitHub and PyPI, or build with ALLOW_UNRESOLVED=1 (development image)"
    echo "aiter_requirements: WARNING: AITER $AITER_TAG's requirements unlocked; installing $src/requirements.txt from PyPI without hash checks (ALLOW_UNRESOLVED=1, not a release build)" >&2
    python -m pip install -c "$constraints" -r "$src/requirements.txt"
    exit 0 ;;
  none) die "AITER $AITER_TAG's source has a requirements.txt, but versions.json pins none (requirements_lock_sha256 \"none\"): the pin was resolved from another commit; resolve it again ($fix)" ;;
esac
lock=$locks/$AITER_REQUIREMENTS_LOCK
[ -f "$lock" ] || die "no lock at $lock: make it with $fix on a connected host"
# The requirements.txt sha256 the lock's header records, read by the lock reader (lock_lines.py, beside this
# script): exit 1 where the lock records none, else (a file that is not a lock) its one line.
recorded=$(python "$here/lock_lines.py" input-sha256 "$lock" requirements.txt 2>&1) \
  || { [ $? != 1 ] || recorded="$AITER_REQUIREMENTS_LOCK records no requirements.txt sha256 (# input requirements.txt sha256:...)"
       die "$recorded: make it again ($fix)"; }
actual=$(sha256sum "$src/requirements.txt" | cut -d' ' -f1)
[ "$recorded" = "$actual" ] \
  || die "$AITER_REQUIREMENTS_LOCK was made from a requirements.txt with sha256 $recorded, not this source's $actual: the lock was made from another commit; make it again ($fix)"
PYTHON=python bash "$here/install_lock.sh" "$lock" "$index" "$pinned"
