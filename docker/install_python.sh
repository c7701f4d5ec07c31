#!/usr/bin/env bash
# Python ${PYTHON_VERSION} (deadsnakes on Ubuntu when the release lacks it) in a virtual
# environment at /opt/venv, plus the build tools AITER needs (ninja, ccache, git).
set -euo pipefail
: "${PYTHON_VERSION:?set the PYTHON_VERSION build arg}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends ca-certificates git ccache ninja-build software-properties-common
if ! apt-cache show "python${PYTHON_VERSION}-venv" >/dev/null 2>&1; then
  add-apt-repository -y ppa:deadsnakes/ppa
  apt-get update -q
fi
apt-get install -y -q --no-install-recommends "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv" "python${PYTHON_VERSION}-dev"
"python${PYTHON_VERSION}" -m venv /opt/venv
rm -rf /var/lib/apt/lists/*
/opt/venv/bin/python --version
