#!/usr/bin/env bash
# The ROCm PyTorch wheels of a rocm-image track: torch, torchvision, torchaudio, the Triton torch
# requires and everything else they require, from the track's PyTorch hash lock, every wheel by its
# sha256, from the PyTorch index alone (install_lock.sh, as therock_sdk.sh installs TheRock's lock).
#
#   install_torch.sh LOCKS_DIR [INDEX_URL]
#
# Settings (build args): PYTORCH_INDEX_URL, PYTORCH_LOCK (in LOCKS_DIR), PYTORCH_LOCK_SHA256,
# TORCH_VERSION, TORCHVISION_VERSION, TORCHAUDIO_VERSION, ALLOW_UNRESOLVED. INDEX_URL: a mirror of
# that index (https:// or file://).
# The lock must hold the pinned versions, and torch must require the Triton it holds. An unresolved
# lock stops the step unless ALLOW_UNRESOLVED=1 (development only: the pinned versions from the
# index alone, unhashed). When torch's Triton is not the distribution `triton`, an alias `triton`
# of its version is recorded (pinned_dists.py triton-alias) so nothing pulls PyPI's CUDA triton.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
die() { echo "install_torch: ERROR: $*" >&2; exit 1; }
locks=${1:?usage: install_torch.sh LOCKS_DIR [INDEX_URL]}
: "${PYTORCH_INDEX_URL:?PYTORCH_INDEX_URL is empty: this track is not on the rocm-image stack (ROCM_STACK)}"
: "${PYTORCH_LOCK:?set the PYTORCH_LOCK build arg}" "${PYTORCH_LOCK_SHA256:?set the PYTORCH_LOCK_SHA256 build arg}"
wanted=()
for name in torch torchvision torchaudio; do
  var=${name^^}_VERSION
  [ -n "${!var:-}" ] && [ "${!var}" != UNRESOLVED ] || die "set the $var build arg (the track's pytorch.torch.$name)"
  wanted+=("$name==${!var}")
done
index=${2:-$PYTORCH_INDEX_URL}
use_ca_bundle
# What pinned_dists.py (below and in every later build step) imports: packaging, hash-pinned.
python -m pip install --require-hashes --no-deps -r "$here/requirements-scripts.txt"
if [ "$PYTORCH_LOCK_SHA256" != UNRESOLVED ]; then
  lock=$locks/$PYTORCH_LOCK
  PYTHON=python bash "$here/install_lock.sh" "$lock" "$index" "$PYTORCH_LOCK_SHA256"
  # The lock's pins, name==version each, read by the lock reader (lock_lines.py, beside this script).
  listed=$(python "$here/lock_lines.py" pins "$lock" 2>&1) || die "$listed"
  mapfile -t pins <<<"$listed"
  for req in "${wanted[@]}"; do
    [[ " ${pins[*]} " == *" $req "* ]] \
      || die "$PYTORCH_LOCK holds no $req: the lock was made from other versions; make it again (python3 -m tools.pins resolve wheels --force --write)"
  done
  # The Triton the lock holds (uv resolved torch's own requirement): torch must require exactly it.
  tritons=()
  for pin in "${pins[@]}"; do
    if [[ ${pin%%==*} == *triton* ]]; then tritons+=("$pin"); fi
  done
  [ "${#tritons[@]}" = 1 ] \
    || die "$PYTORCH_LOCK holds ${#tritons[@]} Triton distributions (${tritons[*]:-none}), not the one torch requires: make it again (python3 -m tools.pins resolve wheels --force --write)"
  python "$here/pinned_dists.py" torch-triton --expect "${tritons[0]}"
else
  [ "${ALLOW_UNRESOLVED:-0}" = 1 ] \
    || die "the PyTorch lock ($PYTORCH_LOCK) is unresolved in versions.json (lock_sha256): run 'python3 -m tools.pins resolve wheels --write' on a host that reaches $PYTORCH_INDEX_URL, or build with ALLOW_UNRESOLVED=1 (development image)"
  echo "install_torch: WARNING: PyTorch lock unresolved; installing ${wanted[*]} and their requirements from $index without hash checks (ALLOW_UNRESOLVED=1, not a release build)" >&2
  cert=()
  [ -n "${PIP_CERT:-}" ] && cert=(--cert "$PIP_CERT")
  python -m pip install --isolated --disable-pip-version-check --no-cache-dir "${cert[@]}" --index-url "$index" \
    "${wanted[@]}"
  python "$here/pinned_dists.py" torch-triton
fi
python "$here/pinned_dists.py" triton-alias
python -m pip check || die "dependency conflict after installing the PyTorch wheels"
python -c 'import torch; print("torch", torch.__version__, "hip", torch.version.hip)'
