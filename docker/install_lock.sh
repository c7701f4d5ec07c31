#!/usr/bin/env bash
# A hash lock of wheels from one index, installed exactly: every wheel by its sha256, from that index
# alone. The one way the base image installs a wheel set resolve locked (TheRock's ROCm SDK, device
# wheels and PyTorch: therock_sdk.sh; the ROCm PyTorch wheels of a rocm-image track: install_torch.sh).
#
#   install_lock.sh LOCK INDEX_URL LOCK_SHA256
#
# LOCK: name==version --hash=sha256:... lines made against INDEX_URL alone (python3 -m tools.pins
#   resolve), installed --no-deps; nothing else (lock_lines.py checks it before pip reads it).
# LOCK_SHA256: the lock's sha256 as versions.json pins it: another lock is refused before anything
#   is installed.
# INDEX_URL: the index the lock was made against (never PyPI beside it, never a nightly index: PyPI
#   holds same-named placeholder projects, rocm, rocm-sdk-core, ..., so a second index could
#   substitute one). https://, or file:// for a local mirror.
# pip runs --isolated: no PIP_* variable (PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS) and no pip.conf can add
# an index or a wheel directory; PIP_CERT, where set, is passed on explicitly. Wheels only.
set -euo pipefail
lock=${1:-} index=${2:-} pinned=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "install_lock: ERROR: $*" >&2; exit 1; }
[ -n "$lock" ] && [ -n "$index" ] && [ -n "$pinned" ] || die "usage: install_lock.sh LOCK INDEX_URL LOCK_SHA256"
[ -f "$lock" ] || die "no lock at $lock: make it with python3 -m tools.pins resolve --write (uv pip compile --generate-hashes against $index alone) on a connected host"
[[ "$pinned" =~ ^[0-9a-f]{64}$ ]] || die "LOCK_SHA256 '$pinned' is not a sha256 (unresolved? the lock's hash is pinned by python3 -m tools.pins resolve --write)"
actual=$(sha256sum "$lock" | cut -d' ' -f1)
[ "$actual" = "$pinned" ] || die "$lock has sha256 $actual, not the pinned $pinned: it is not the lock versions.json names"
case "$index" in
  https://*|file://*) ;;
  *) die "INDEX_URL (${index%%:*}:...) is not an https:// (or local file://) index" ;;
esac
why=$("${PYTHON:-python3}" "$here/lock_lines.py" "$lock" 2>&1) \
  || die "${why:-$lock: cannot be read as a lock}; make it again with python3 -m tools.pins resolve --force --write"
cert=()
[ -n "${PIP_CERT:-}" ] && cert=(--cert "$PIP_CERT")
"${PYTHON:-python3}" -m pip install --isolated --disable-pip-version-check --no-cache-dir --no-deps \
  --require-hashes --only-binary=:all: "${cert[@]}" --index-url "$index" -r "$lock"
