#!/usr/bin/env bash
# The pinned ROCm wheels of PyTorch, Triton, torchvision and torchaudio, hash-checked.
# Settings (build args): PYTORCH_PINS (JSON: index_url and wheels.<name>.package/version/sha256
# for torch, triton, torchvision, torchaudio: the track's pytorch section; read by lib.sh
# load_pins as PYTORCH_INDEX_URL and PYTORCH_WHEELS_<NAME>_PACKAGE/_VERSION/_SHA256);
# ALLOW_UNRESOLVED=1 installs unresolved pins without hash checks (development images only).
# Triton's distribution name and version are the ones versions.json records (read from torch's
# own metadata by `python3 -m ci.pins resolve wheels`); the installed torch must require exactly
# them. When they are unresolved (development images), the Triton torch requires is installed.
# Then, when that distribution is not named `triton`, an alias distribution `triton` of the same
# version is recorded (pinned_dists.py triton-alias) so that nothing pulls PyPI's CUDA triton.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
load_pins PYTORCH_PINS
: "${PYTORCH_INDEX_URL:?PYTORCH_PINS has no index_url}"
req=$(mktemp --suffix=.txt)
hashes=1
triton_from_torch=0
for name in TORCH TRITON TORCHVISION TORCHAUDIO; do
  pkg_var=PYTORCH_WHEELS_${name}_PACKAGE ver_var=PYTORCH_WHEELS_${name}_VERSION sha_var=PYTORCH_WHEELS_${name}_SHA256
  # Each must be in PYTORCH_PINS (an unresolved pin is UNRESOLVED, a value).
  pkg=${!pkg_var:?PYTORCH_PINS has no wheels.${name,,}.package} ver=${!ver_var:?PYTORCH_PINS has no wheels.${name,,}.version}
  sha=${!sha_var:?PYTORCH_PINS has no wheels.${name,,}.sha256}
  if [ "$pkg" = UNRESOLVED ] || [ "$ver" = UNRESOLVED ] || [ "$sha" = UNRESOLVED ]; then
    if [ "${ALLOW_UNRESOLVED:-0}" != 1 ]; then
      echo "install_torch: ERROR: pytorch.wheels.${name,,} unresolved in versions.json: run 'python3 -m ci.pins resolve wheels --write' on a connected machine, or build with ALLOW_UNRESOLVED=1 (development image)" >&2
      exit 1
    fi
    echo "install_torch: WARNING: $name pin unresolved; installing without a hash check (ALLOW_UNRESOLVED=1, not a release build)" >&2
    hashes=0
    if [ "$name" = TRITON ] && { [ "$pkg" = UNRESOLVED ] || [ "$ver" = UNRESOLVED ]; }; then
      triton_from_torch=1
    elif [ "$ver" = UNRESOLVED ]; then echo "$pkg"; else echo "$pkg==$ver"; fi >>"$req"
  else
    echo "$pkg==$ver --hash=sha256:$sha" >>"$req"
  fi
done
use_ca_bundle
# What pinned_dists.py (below and in every later build step) imports: packaging, hash-pinned.
python -m pip install --require-hashes --no-deps -r "$here/requirements-scripts.txt"
flags=(--no-deps)
[ "$hashes" = 1 ] && flags+=(--require-hashes)
# Step 1: exactly the pinned wheels, hash-checked, from the ROCm wheel index.
python -m pip install "${flags[@]}" --index-url "$PYTORCH_INDEX_URL" -r "$req"
if [ "$triton_from_torch" = 1 ]; then
  triton_req=$(python "$here/pinned_dists.py" torch-triton)
  echo "install_torch: WARNING: Triton pin unresolved; installing $triton_req, the one torch requires" >&2
  python -m pip install --no-deps --index-url "$PYTORCH_INDEX_URL" "$triton_req"
  echo "$triton_req" >>"$req"
else
  python "$here/pinned_dists.py" torch-triton --expect "$PYTORCH_WHEELS_TRITON_PACKAGE==$PYTORCH_WHEELS_TRITON_VERSION"
fi
# Step 2: their pure-Python dependencies (numpy, sympy, ...) from PyPI; the pinned wheels
# are already installed, so pip cannot replace them (not hash-pinned yet: docs/building.md).
sed 's/ --hash=.*//' "$req" >"$req.deps"
python -m pip install -r "$req.deps"
python -m pip check || { echo "install_torch: ERROR: dependency conflict after installing the pinned wheels" >&2; exit 1; }
python "$here/pinned_dists.py" triton-alias
rm -f "$req" "$req.deps"
python -c 'import torch; print("torch", torch.__version__, "hip", torch.version.hip)'
