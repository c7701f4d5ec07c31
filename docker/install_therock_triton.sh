#!/usr/bin/env bash
# The torch stage of a therock track: the Triton wheel the image built from the pinned commit
# (triton-wheel stage) installed beside TheRock's torch, and torch made to require exactly it.
#
#   install_therock_triton.sh WHEELS_DIR
#
# TheRock's torch names a Triton of its own; vLLM's TheRock base builds the one vLLM's kernels are
# made for and deletes torch's requirement. Here it is rewritten to the Triton installed, so `pip
# check` holds and every later step's constraints keep this Triton.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
die() { echo "therock-triton: ERROR: $*" >&2; exit 1; }
wheels=${1:?usage: install_therock_triton.sh WHEELS_DIR}
: "${TRITON_VERSION:?set the TRITON_VERSION build arg}"
use_ca_bundle
python -m pip install --require-hashes --no-deps -r "$here/requirements-scripts.txt"
found=("$wheels"/triton-*.whl)
[ "${#found[@]}" = 1 ] && [ -f "${found[0]}" ] || die "$wheels holds no single triton wheel (the triton-wheel stage builds it)"
python -m pip install --no-deps --no-index "${found[0]}"
python "$here/pinned_dists.py" torch-triton-set "triton==$TRITON_VERSION"
python -m pip check || die "dependency conflict after installing Triton $TRITON_VERSION beside TheRock's torch"
python "$here/pinned_dists.py" torch-triton --expect "triton==$TRITON_VERSION"
python -c 'import torch, triton; print("therock-triton: torch", torch.__version__, "hip", torch.version.hip, "triton", triton.__version__)'
