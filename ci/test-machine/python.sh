#!/usr/bin/env bash
# The Python the test environments are made from (.ci/run: the test venv, and through it the release
# tracks' environments), printed on stdout:
#
#   bash ci/test-machine/python.sh
#
# The distribution's Python 3.11 (Debian 12: /usr/bin/python3.11, PYTHON_DISTRIBUTION to name another)
# where it can make a venv, installing Debian's python3.11-venv once when only that is missing (as root,
# with apt). The suite's host work is mostly Python: on the 2-core test machine that interpreter took about
# a tenth less CPU than a self-built 3.11 without profile-guided optimisation (0.905 of it over importing
# vLLM's API server, collecting the tests and an engine test file: ci/test-machine/compare-pythons.sh
# prints the figures). 3.11: the version of the tests' torch and vLLM CPU wheels (tests/requirements.lock).
#
# Where it cannot: one warning line on stderr, and `python3` of PATH is printed instead (the tests
# run the same, on more CPU).
set -euo pipefail

debian=/usr/bin/python3.11
want=${PYTHON_DISTRIBUTION:-$debian}
log() { echo "python: $*" >&2; }
runs() { [ -f "$want" ] && [ -x "$want" ]; }  # an executable file (a folder is "executable" too)
makes_venvs() { runs && "$want" -m ensurepip --version >/dev/null 2>&1; }

# Debian's package gives ensurepip to Debian's interpreter only: nothing is installed for another one
if [ "$want" = "$debian" ] && runs && ! makes_venvs && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  log "installing Debian's python3.11-venv (ensurepip for $want)"
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3.11-venv \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3.11-venv; }; } >&2 \
    || log "could not install python3.11-venv"
fi
if makes_venvs; then
  echo "$want"
else
  fallback=$(command -v python3) || { log "error: neither $want with venv nor python3 on PATH"; exit 1; }
  log "warning: $want cannot make a venv here: the test environments are made from $fallback"
  echo "$fallback"
fi
