#!/usr/bin/env bash
# The pinned ROCm wheels of PyTorch, Triton, torchvision and torchaudio, hash-checked.
# Settings (build args): TORCH_INDEX_URL and <NAME>_PACKAGE/_VERSION/_SHA256 for NAME in
# TORCH TRITON TORCHVISION TORCHAUDIO; ALLOW_UNRESOLVED=1 installs unresolved pins without
# hash checks (development images only).
set -euo pipefail
: "${TORCH_INDEX_URL:?set the TORCH_INDEX_URL build arg}"
# Each must be set (UNRESOLVED is a value): the loop below reads them by name.
: "${TORCH_PACKAGE:?}" "${TORCH_VERSION:?}" "${TORCH_SHA256:?}" \
  "${TRITON_PACKAGE:?}" "${TRITON_VERSION:?}" "${TRITON_SHA256:?}" \
  "${TORCHVISION_PACKAGE:?}" "${TORCHVISION_VERSION:?}" "${TORCHVISION_SHA256:?}" \
  "${TORCHAUDIO_PACKAGE:?}" "${TORCHAUDIO_VERSION:?}" "${TORCHAUDIO_SHA256:?}"
req=$(mktemp --suffix=.txt)
hashes=1
for name in TORCH TRITON TORCHVISION TORCHAUDIO; do
  pkg_var=${name}_PACKAGE ver_var=${name}_VERSION sha_var=${name}_SHA256
  pkg=${!pkg_var:?set the ${name}_PACKAGE build arg} ver=${!ver_var:-UNRESOLVED} sha=${!sha_var:-UNRESOLVED}
  if [ "$ver" = UNRESOLVED ] || [ "$sha" = UNRESOLVED ]; then
    if [ "${ALLOW_UNRESOLVED:-0}" != 1 ]; then
      echo "install_torch: ERROR: ${name}_VERSION/${name}_SHA256 unresolved in versions.json: run 'python3 -m ci.pins resolve wheels --write' on a connected machine, or build with ALLOW_UNRESOLVED=1 (development image)" >&2
      exit 1
    fi
    echo "install_torch: WARNING: $pkg pin unresolved; installing without a hash check (ALLOW_UNRESOLVED=1, not a release build)" >&2
    hashes=0
    if [ "$ver" = UNRESOLVED ]; then echo "$pkg"; else echo "$pkg==$ver"; fi >>"$req"
  else
    echo "$pkg==$ver --hash=sha256:$sha" >>"$req"
  fi
done
[ -f /run/secrets/ca-bundle ] && export PIP_CERT=/run/secrets/ca-bundle
flags=(--no-deps)
[ "$hashes" = 1 ] && flags+=(--require-hashes)
# Step 1: exactly the pinned wheels, hash-checked, from the ROCm wheel index.
python -m pip install "${flags[@]}" --index-url "$TORCH_INDEX_URL" -r "$req"
# Step 2: their pure-Python dependencies (numpy, sympy, ...) from PyPI; the pinned wheels
# are already installed, so pip cannot replace them (not hash-pinned: see README).
sed 's/ --hash=.*//' "$req" >"$req.deps"
python -m pip install -r "$req.deps"
python -m pip check || { echo "install_torch: ERROR: dependency conflict after installing the pinned wheels" >&2; exit 1; }
rm -f "$req" "$req.deps"
python -c 'import torch; print("torch", torch.__version__, "hip", torch.version.hip)'
