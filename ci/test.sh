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
# Exactly the locked set, every file hash-checked, nothing resolved here (python3 -m ci.pins lock
# tests remakes the lock). torch's CPU build comes from PIP_FIND_LINKS, else PyTorch's CPU index.
index=()
[ -n "${PIP_FIND_LINKS:-}" ] || index=(--extra-index-url https://download.pytorch.org/whl/cpu)
"$VENV/bin/python" -m pip install --quiet --require-hashes --no-deps "${index[@]}" -r tests/requirements.lock
# this repository's own packages, from their source folders
"$VENV/bin/python" -m pip install --quiet --no-deps --no-index --no-build-isolation -e backend -e runtime

echo "== running tests"
exec "$VENV/bin/python" -m pytest "$@"
