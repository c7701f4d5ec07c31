#!/usr/bin/env bash
# TheRock ROCm SDK of a therock track, installed into the image's Python: every wheel of the track's
# hash lock (the SDK, the device wheels of each GPU arch, torch/torchvision/torchaudio +rocm and
# their dependencies) from TheRock's release index alone, then `rocm-sdk init` (which unpacks the
# devel tree), then a check that ROCM_PATH, which the stage's ENV sets from the SDK's location, is
# the SDK the wheels put there, and one copy of each runtime library (therock_links.sh).
#
#   therock_sdk.sh LOCKS_DIR
#
# Settings (build args): THEROCK_INDEX_URL, THEROCK_LOCK (a file name in LOCKS_DIR),
# THEROCK_LOCK_SHA256. An unresolved
# lock stops the step (install_lock.sh names the pin), whatever ALLOW_UNRESOLVED says: TheRock's
# wheels are never installed without their hashes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
die() { echo "therock-sdk: ERROR: $*" >&2; exit 1; }
locks=${1:?usage: therock_sdk.sh LOCKS_DIR}
: "${THEROCK_INDEX_URL:?THEROCK_INDEX_URL is empty: this track is not on the therock stack (ROCM_STACK)}"
: "${THEROCK_LOCK:?set the THEROCK_LOCK build arg}" "${THEROCK_LOCK_SHA256:?set the THEROCK_LOCK_SHA256 build arg}"
: "${ROCM_PATH:?the therock stage sets ROCM_PATH}"
use_ca_bundle
PYTHON=python bash "$here/install_lock.sh" "$locks/$THEROCK_LOCK" "$THEROCK_INDEX_URL" "$THEROCK_LOCK_SHA256"
command -v rocm-sdk >/dev/null || die "the lock $THEROCK_LOCK installed no rocm-sdk command: it lacks TheRock's rocm wheel"
rocm-sdk init
root=$(rocm-sdk path --root) || die "rocm-sdk path --root failed after rocm-sdk init"
[ "$(realpath -m "$root")" = "$(realpath -m "$ROCM_PATH")" ] \
  || die "the SDK's root is $root but the stage sets ROCM_PATH=$ROCM_PATH: fix the therock stage's ENV in Dockerfile.rocm_base"
[ -d "$ROCM_PATH/lib" ] || die "ROCM_PATH=$ROCM_PATH has no lib/ after rocm-sdk init"
bash "$here/therock_links.sh"
python -c 'import torch; print("therock-sdk: torch", torch.__version__, "hip", torch.version.hip)'
