#!/usr/bin/env bash
# The repository's test command (README.md "Run the tests").
# Creates a virtual environment from the repository's own requirement files,
# installs the backend and runtime packages (editable), then runs every suite this machine can run.
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
# tests remakes the lock). First uv, by pip from its own entry in the lock; then uv installs the
# lock (parallel downloads: a fraction of pip's time on a machine with nothing kept), from the
# sources pip's settings name, read by the venv's pip (tools/uv_pip.py, with the runtime's modules from its
# source folder: the packages are installed after the lock); torch's CPU build from pip's
# find-links, else PyTorch's CPU index. Every index is consulted for every name, as pip does: the
# hashes decide. Every module is compiled to bytecode at install (--compile-bytecode; a second run
# finds it current in seconds): where PYTHONDONTWRITEBYTECODE is set, Python never writes it at
# import, and every test process that imports vLLM and torch would compile them from source again
# (about 15 s of CPU each).
# uv's entry is read by the lock reader (docker/lock_lines.py: standard library only), with this machine's Python;
# where the lock lacks it: "tests/requirements.lock has no entry for uv".
uv_entry=$("$PYTHON" -B docker/lock_lines.py entry tests/requirements.lock uv 2>&1) \
  || { echo "error: $uv_entry" >&2; exit 1; }
"$VENV/bin/python" -m pip install --quiet --require-hashes --no-deps -r <(printf '%s\n' "$uv_entry")
PYTHONPATH=runtime/src "$VENV/bin/python" -m tools.uv_pip --torch "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" \
  --require-hashes --no-deps --compile-bytecode -r tests/requirements.lock
# this repository's own packages, from their source folders
"$VENV/bin/python" -m pip install --quiet --no-deps --no-index --no-build-isolation -e backend -e runtime

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
