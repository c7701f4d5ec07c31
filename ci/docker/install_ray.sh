#!/usr/bin/env bash
# Install Ray under a staging root, hash-checked, moving nothing the image has.
#
#   install_ray.sh LOCK ROOT
#
# LOCK: ci/docker/requirements-ray.txt (python3 -m ci.pins lock ray): ray and msgpack, every wheel's hash.
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
[ -f "$lock" ] || fail "$lock: no lock of Ray: run python3 -m ci.pins lock ray"
use_ca_bundle

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# NAME==VERSION of every installed distribution (the first of a name on sys.path: the one imported).
python3 -B - "$work/constraints.txt" <<'PY'
import importlib.metadata as md
import re
import sys

held = {}
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name and dist.version:
        held.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
with open(sys.argv[1], "w") as out:
    out.write("# Every distribution of the image: installing Ray moves none of them.\n")
    out.writelines(f"{name}=={version}\n" for name, version in sorted(held.items()))
PY

# The lock's entries to install: ray, and msgpack when the image lacks it.
wanted=(ray)
python3 -B -c 'import importlib.metadata as m; m.version("msgpack")' 2>/dev/null || wanted+=(msgpack)
python3 -B - "$lock" "$work/requirements.txt" "${wanted[@]}" <<'PY' || exit 1
import re
import sys

lock, out, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
entries = {}
for block in re.split(r"\n(?=[A-Za-z0-9])", open(lock).read()):
    m = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
    if m:
        entries[m.group(1).lower()] = (m.group(2), re.findall(r"--hash=sha256:[0-9a-f]{64}", block))
missing = [name for name in wanted if name not in entries or not entries[name][1]]
if missing:
    sys.exit(f"install-ray: ERROR: {lock} has no hash-pinned {', '.join(missing)}: run python3 -m ci.pins lock ray")
with open(out, "w") as f:
    f.writelines(f"{name}=={entries[name][0]} {' '.join(entries[name][1])}\n" for name in wanted)
PY
RAY_VERSION=$(head -n1 "$work/requirements.txt" | sed 's/^ray==\([^ ]*\) .*/\1/')
echo "install-ray: installing ${wanted[*]} ($(wc -l <"$work/constraints.txt") distributions held)"
python3 -m pip install --require-hashes --no-compile --no-warn-script-location --disable-pip-version-check \
  --root "$root" --constraint "$work/constraints.txt" --requirement "$work/requirements.txt" \
  || fail "pip could not install ray==${RAY_VERSION} under the image's distributions (output above): change ci/docker/requirements-ray.in (then lock) or the vLLM image"

python3 -B - "$root" "$RAY_VERSION" "${wanted[@]}" <<'PY'
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

root, version, wanted = Path(sys.argv[1]), sys.argv[2], set(sys.argv[3:])
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()  # noqa: E731
paths = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
# Installed distributions: dist-info folders in site-packages (Ray's wheel carries more inside ray/).
found = {norm(p.name[: -len(".dist-info")].rsplit("-", 1)[0]) for site in paths
         for p in Path(f"{root}{site}").glob("*.dist-info")}
if found != wanted:
    sys.exit(f"install-ray: ERROR: the Ray layer holds {', '.join(sorted(found))} but only "
             f"{', '.join(sorted(wanted))} may be installed: a requirement of Ray replaced one of the image's "
             "distributions; change ci/docker/requirements-ray.in (then python3 -m ci.pins lock ray)")
env = {**os.environ, "PYTHONPATH": ":".join(f"{root}{site}" for site in paths)}
got = subprocess.run([sys.executable, "-B", "-c", "import ray; print(ray.__version__)"], env=env,
                     capture_output=True, text=True)
if got.returncode != 0 or got.stdout.strip() != version:
    sys.exit(f"install-ray: ERROR: ray from the Ray layer gives {got.stdout.strip() or 'no version'} "
             f"(want {version}): {got.stderr.strip().splitlines()[-1:] or ''}")
print(f"install-ray: OK ray {version} imports ({', '.join(sorted(wanted))} installed under {root})")
PY
