#!/usr/bin/env bash
# The repository's test command (README.md "Run the tests").
# Creates a virtual environment from the repository's own requirement files,
# installs the runtime and backend packages (editable), then runs every suite this machine can run.
# Suites that need something absent (a Docker engine, an AMD GPU) skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${TEST_VENV:-.venv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
echo "== installing test requirements (tests/requirements.lock, locked from tests/requirements.txt)"
# Exactly the locked set, every file hash-checked, nothing resolved here (python3 -m tools.pins lock
# tests remakes the lock).
# First pip installs uv and the runtime's build backend, setuptools and wheel (a fresh venv's setuptools
# may be too old; it has no wheel). Each comes from its entry in the lock, read by docker/lock_lines.py
# (standard library only) with this machine's Python. Where the lock lacks one, this stops in one line
# ("tests/requirements.lock has no entry for NAME").
entries=()
for name in uv setuptools wheel; do
  entry=$("$PYTHON" -B docker/lock_lines.py entry tests/requirements.lock "$name" 2>&1) \
    || { echo "error: $entry" >&2; exit 1; }
  entries+=("$entry")
done
"$VENV/bin/python" -m pip install --quiet --require-hashes --no-deps -r <(printf '%s\n' "${entries[@]}")
# The runtime package, editable, from its source folder: tools/uv_pip.py imports it.
"$VENV/bin/python" -m pip install --quiet --no-deps --no-index --no-build-isolation -e runtime
# Then uv installs the lock, from the sources pip's settings name (tools/uv_pip.py): a fraction of pip's
# time with nothing kept. Torch's CPU build comes from pip's find-links, else PyTorch's CPU index. Every
# index is consulted for every name, as pip does: the hashes decide. Every module is compiled at install
# (--compile-bytecode): where PYTHONDONTWRITEBYTECODE is set, each test process importing vLLM and torch
# would compile them again (about 15 s of CPU each).
"$VENV/bin/python" -m tools.uv_pip --torch "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" \
  --require-hashes --no-deps --compile-bytecode -r tests/requirements.lock
# The backend package, editable, from its source folder.
"$VENV/bin/python" -m pip install --quiet --no-deps --no-index --no-build-isolation -e backend

# Several lanes at once (pytest-xdist; conftest.py hands out the Docker tests as one unit, first,
# and every other test file to whichever lane is free): on the 2-core machine a lane often waits on
# a build, a server in a container or a time limit, and a third lane uses the cores meanwhile.
lane_count=${TEST_LANES:-3}
case "$lane_count" in
  1) lanes=() ;;
  2|3|4|5|6|7|8) lanes=(-n "$lane_count" --dist loadgroup) ;;
  *) echo "error: TEST_LANES=${TEST_LANES} is not a number from 1 to 8 (how many test lanes run at once; default 3)" >&2; exit 2 ;;
esac
# Where lanes share the cores, an OpenMP thread that waits for work sleeps instead of spinning (PyTorch's
# CPU kernels, vLLM's CPU engines and everything else the tests start on this machine): a spinning thread
# takes the core a lane needs. Measured with both cores busy: the reference-kernel and measurement tests
# took 78 s of CPU with OpenMP's default and 45 s with waiting threads asleep. Kept where already set.
if [ "$lane_count" != 1 ]; then
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
fi

echo "== running tests"
exec "$VENV/bin/python" -m pytest "${lanes[@]}" "$@"
