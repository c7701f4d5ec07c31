#!/usr/bin/env bash
# Install Ray under a staging root, hash-checked, moving nothing the image has.
#
#   install_ray.sh LOCK ROOT
#
# LOCK: docker/requirements-ray.txt (python3 -m tools.pins lock ray): ray and msgpack, every wheel's hash.
# Every installed distribution is held at its version (constraints), so Ray's requirements that vLLM
# brings (click, protobuf, requests, ...) are used as they are; pip fails when Ray needs another
# version. msgpack is installed only when absent. ROOT must then hold exactly the distributions
# installed on purpose, and Ray must import from it. Errors: one line, exit status 1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

fail() { echo "install-ray: ERROR: $*" >&2; exit 1; }
[ $# -eq 2 ] || fail "usage: install_ray.sh LOCK ROOT"
lock=$1 root=$2
[ -f "$lock" ] || fail "$lock: no lock of Ray: run python3 -m tools.pins lock ray"
use_ca_bundle

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The constraints (every installed distribution held at its version) and the lock's entries to install
# (ray, and msgpack when the image lacks it), read through lock_lines.py: ray_layer.py.
plan=$(python3 -B "$here/ray_layer.py" plan "$lock" "$work") || exit 1
read -r RAY_VERSION names <<<"$plan"
read -r -a wanted <<<"$names"
echo "install-ray: installing ${wanted[*]} ($(wc -l <"$work/constraints.txt") distributions held)"
python3 -m pip install --require-hashes --no-compile --no-warn-script-location --disable-pip-version-check \
  --root "$root" --constraint "$work/constraints.txt" --requirement "$work/requirements.txt" \
  || fail "pip could not install ray==${RAY_VERSION} under the image's distributions (output above): change docker/requirements-ray.in (then lock) or the vLLM image"

# ROOT holds exactly what was installed on purpose, and Ray imports from it.
python3 -B "$here/ray_layer.py" check "$root" "$RAY_VERSION" "${wanted[@]}"
