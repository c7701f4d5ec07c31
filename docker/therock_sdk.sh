#!/usr/bin/env bash
# TheRock ROCm SDK of a therock track in the image's Python: the track's hash lock (SDK, device
# wheels, torch/torchvision/torchaudio +rocm, their dependencies) from TheRock's index alone,
# `rocm-sdk init` (unpacks the devel tree), a check that the stage's ROCM_PATH is that SDK, and one
# copy of each runtime library (therock_links.sh).
#
#   therock_sdk.sh LOCKS_DIR
#
# Settings (build args): THEROCK_INDEX_URL, THEROCK_LOCK (in LOCKS_DIR), THEROCK_LOCK_SHA256. An
# unresolved lock stops the step whatever ALLOW_UNRESOLVED says: never installed without hashes.
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
