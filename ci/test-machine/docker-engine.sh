#!/usr/bin/env bash
# A private Docker engine for CI machines and the repository's Docker tests.
#
#   bash ci/test-machine/docker-engine.sh start   install the engine if absent, start it, wait until it answers
#   bash ci/test-machine/docker-engine.sh env     print `export ...` lines for clients:  eval "$(bash ci/test-machine/docker-engine.sh env)"
#   bash ci/test-machine/docker-engine.sh host    print the engine's address (unix://.../docker.sock)
#   bash ci/test-machine/docker-engine.sh status  exit 0 when the engine answers
#   bash ci/test-machine/docker-engine.sh prune   drop what no later run reuses: stopped containers,
#                                                 untagged images, build cache beyond DOCKER_ENGINE_KEEP_CACHE
#   bash ci/test-machine/docker-engine.sh stop    stop the engine started by `start`
#
# The engine runs with its own data root, exec root and socket, so it never touches a system Docker
# installation. Containers and builds use host networking only (--bridge=none --iptables=false).
#
# Installation (Debian 12 CI machines): Debian 13 ("trixie") packages install cleanly on Debian 12. The
# trixie apt source has a low pin priority (100): only the packages named with `-t trixie` come from it.
#
# Client plugins: a docker client installed elsewhere (e.g. a static binary in /usr/local/bin) may shadow
# the packaged /usr/bin/docker, so `env` prints DOCKER_CONFIG naming a folder whose cli-plugins/ links the
# packaged buildx and compose plugins: they work whichever docker binary comes first in PATH.
#
# Settings (environment):
#   DOCKER_ENGINE_ROOT     state directory (data root, exec root, socket, log)
#                          default /var/lib/rocm-vllm-engine
#   DOCKER_STORAGE_DRIVER  storage driver for dockerd (default: dockerd's choice)
#   DOCKER_ENGINE_CONTAINERD_STORE=1  the containerd image store (daemon feature containerd-snapshotter):
#                          the engine's own builder then pushes provenance attestations and exports
#                          registry build cache, which the classic store refuses. A second engine with
#                          its own DOCKER_ENGINE_ROOT publishes images for the registry tests (.ci/run);
#                          images of one store are not seen by the other.
#   DOCKER_ENGINE_TIMEOUT  seconds to wait for the engine to answer, and to stop (1-3600, default 60)
#   DOCKER_ENGINE_KEEP_CACHE  build cache `prune` keeps, most recently used first (default 4GB;
#                          tagged images are always kept: the tests reuse them by name)
#   DOCKER_ENGINE_NO_INSTALL=1  never install packages; fail if dockerd is absent
#   DEBIAN_MIRROR          Debian archive for the trixie source (default: the one apt already uses)
set -euo pipefail

ROOT=${DOCKER_ENGINE_ROOT:-/var/lib/rocm-vllm-engine}
SOCK="$ROOT/run/docker.sock"
PIDFILE="$ROOT/run/dockerd.pid"
LOG="$ROOT/dockerd.log"
CONFIG_DIR="$ROOT/client-config"
TIMEOUT=${DOCKER_ENGINE_TIMEOUT:-60}
PLUGIN_DIRS="/usr/libexec/docker/cli-plugins /usr/lib/docker/cli-plugins /usr/local/lib/docker/cli-plugins"

log() { echo "docker-engine: $*" >&2; }
die() { log "error: $*"; exit 1; }

# DOCKER_ENGINE_TIMEOUT: seconds, 1 to 3600, no sign or leading zero (bash would read 08 as octal)
bad_timeout() { log "error: DOCKER_ENGINE_TIMEOUT='$TIMEOUT' is not a whole number of seconds from 1 to 3600 (default 60)"; exit 2; }
case "$TIMEOUT" in [1-9]|[1-9][0-9]|[1-9][0-9][0-9]|[1-3][0-9][0-9][0-9]) ;; *) bad_timeout ;; esac
[ "$TIMEOUT" -le 3600 ] || bad_timeout

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

find_plugin() {  # find_plugin NAME -> path of docker-NAME plugin, or nothing
  local d
  for d in $PLUGIN_DIRS; do
    if [ -x "$d/docker-$1" ]; then echo "$d/docker-$1"; return 0; fi
  done
  return 1
}

installed() {
  command -v dockerd >/dev/null 2>&1 && find_plugin buildx >/dev/null && find_plugin compose >/dev/null
}

install_engine() {
  if installed; then return 0; fi
  [ "${DOCKER_ENGINE_NO_INSTALL:-0}" = 1 ] && die "dockerd or the buildx/compose plugins are missing and DOCKER_ENGINE_NO_INSTALL=1"
  command -v apt-get >/dev/null 2>&1 || die "dockerd is not installed and apt-get is absent: install Docker Engine, buildx and compose yourself"
  log "installing docker.io, docker-buildx, docker-compose from Debian trixie (pinned low)"
  bash "$(dirname "$0")/debian-trixie.sh" docker.io docker-buildx docker-compose
  installed || die "installation finished but dockerd or a plugin is still missing (looked in $PLUGIN_DIRS)"
}

client() {  # run the packaged client (or any docker) against our socket
  local bin=/usr/bin/docker
  [ -x "$bin" ] || bin=$(command -v docker) || die "no docker client found"
  DOCKER_HOST="unix://$SOCK" DOCKER_CONFIG="$CONFIG_DIR" "$bin" "$@"
}

answers() { client version >/dev/null 2>&1; }

prepare_client_config() {
  mkdir -p "$CONFIG_DIR/cli-plugins"
  local p src
  for p in buildx compose; do
    if src=$(find_plugin "$p"); then ln -sf "$src" "$CONFIG_DIR/cli-plugins/docker-$p"; fi
  done
  [ -f "$CONFIG_DIR/config.json" ] || echo '{}' >"$CONFIG_DIR/config.json"
}

start() {
  install_engine
  prepare_client_config
  if answers; then log "engine already running at unix://$SOCK"; return 0; fi
  mkdir -p "$ROOT/run" "$ROOT/data" "$ROOT/exec"
  if [ -f "$PIDFILE" ] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then rm -f "$PIDFILE"; fi
  local extra=()
  [ -n "${DOCKER_STORAGE_DRIVER:-}" ] && extra+=(--storage-driver "$DOCKER_STORAGE_DRIVER")
  if [ "${DOCKER_ENGINE_CONTAINERD_STORE:-0}" = 1 ]; then
    echo '{"features": {"containerd-snapshotter": true}}' >"$ROOT/daemon.json"
    extra+=(--config-file "$ROOT/daemon.json")
  fi
  log "starting dockerd (data root $ROOT/data, socket $SOCK, log $LOG)"
  # setsid: the daemon outlives this script and does not get the caller's signals.
  local sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  setsid "${sudo[@]}" dockerd \
    --host "unix://$SOCK" \
    --data-root "$ROOT/data" \
    --exec-root "$ROOT/exec" \
    --pidfile "$PIDFILE" \
    --bridge=none --iptables=false --ip6tables=false \
    "${extra[@]}" >>"$LOG" 2>&1 </dev/null &
  local waited=0
  until answers; do
    if [ "$waited" -ge "$TIMEOUT" ]; then
      tail -n 20 "$LOG" >&2 || true
      die "dockerd did not answer within ${TIMEOUT}s (raise DOCKER_ENGINE_TIMEOUT or read $LOG)"
    fi
    sleep 1; waited=$((waited + 1))
  done
  log "engine answers after ${waited}s: $(client version --format '{{.Server.Version}}')"
}

stop() {
  if [ ! -f "$PIDFILE" ]; then log "no engine started here ($PIDFILE absent)"; return 0; fi
  local pid; pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping dockerd (pid $pid)"
    as_root kill -TERM "$pid"
    local waited=0
    # as long as a start may take: on a busy machine dockerd and its containerd take more than 30 s to stop
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$TIMEOUT" ]; do sleep 1; waited=$((waited + 1)); done
    kill -0 "$pid" 2>/dev/null && die "dockerd (pid $pid) still running after ${TIMEOUT}s (raise DOCKER_ENGINE_TIMEOUT or read $LOG)"
    log "dockerd stopped after ${waited}s"
  fi
  rm -f "$PIDFILE"
}

free_space() { bash "$(dirname "$0")/disk-space.sh" free "$1"; }  # "55G free on /dev/vda"

prune() {
  if ! answers; then log "no engine answers at unix://$SOCK: nothing to prune"; return 0; fi
  local keep=${DOCKER_ENGINE_KEEP_CACHE:-4GB}
  log "pruning stopped containers, untagged images and build cache beyond $keep ($(free_space "$ROOT") before)"
  client container prune --force >/dev/null
  client image prune --force >/dev/null
  client builder prune --force --keep-storage "$keep" >/dev/null
  log "pruned: $(free_space "$ROOT")"
}

env_lines() {
  echo "export DOCKER_HOST=unix://$SOCK"
  echo "export DOCKER_CONFIG=$CONFIG_DIR"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  prune) prune ;;
  env) env_lines ;;
  host) echo "unix://$SOCK" ;;
  status) answers ;;
  *) echo "usage: $0 start|stop|prune|env|host|status" >&2; exit 2 ;;
esac
