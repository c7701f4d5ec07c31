#!/usr/bin/env bash
# The CPU main job in one command (README.md), on any machine with Docker, buildx and compose, no
# AMD GPU: the track's CPU vLLM image built from PyPI's hash-locked wheels, the serve-cpu image on
# it, the tiny MLA model served through this backend's CPU development mode on 127.0.0.1:8000;
# it ends by printing the curl check and the stop command. Settings: docs/serving.md (CPU).
#
#   bash serve-cpu.sh
set -euo pipefail
cd "$(dirname "$0")"
engine=ci/test-machine/docker-engine.sh
if ! command -v docker >/dev/null 2>&1 || ! docker version >/dev/null 2>&1; then
  # this repository's private engine (Debian test machines), when it runs: used, and named in the stop command
  if bash "$engine" status >/dev/null 2>&1; then
    eval "$(bash "$engine" env)"
    export SERVE_CPU_PROJECT_ENGINE=1
  else
    echo "serve-cpu: no Docker engine answers: start one (Docker Desktop, dockerd; on Debian, as root: bash $engine start), then run this again" >&2
    exit 1
  fi
fi
for plugin in buildx compose; do
  if ! docker "$plugin" version >/dev/null 2>&1; then
    echo "serve-cpu: the docker $plugin plugin is missing: install it (Debian: apt-get install docker-$plugin; or bash $engine start)" >&2
    exit 1
  fi
done
# The machine's own python3, with nothing installed: tools/cpu_serve.py imports the runtime from runtime/src
PYTHONPATH=runtime/src${PYTHONPATH:+:$PYTHONPATH} exec python3 -m tools.cpu_serve "$@"
