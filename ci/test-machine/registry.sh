#!/usr/bin/env bash
# A private image registry for the publishing tests: the reference registry server (Debian's
# docker-registry, the CNCF distribution server) on 127.0.0.1, plain HTTP, basic authentication,
# its storage in a temporary folder removed by `stop`; and cosign, which signs what is pushed there.
#
#   bash ci/test-machine/registry.sh start    install docker-registry, cosign and htpasswd if absent,
#                                              start the registry on a free port, wait until it answers
#   bash ci/test-machine/registry.sh env      print `export ...` lines: eval "$(bash ci/test-machine/registry.sh env)"
#                                              TEST_REGISTRY=127.0.0.1:<port>
#                                              TEST_REGISTRY_AUTH=<file: user name, then password, one a line>
#   bash ci/test-machine/registry.sh status   exit 0 when the registry answers
#   bash ci/test-machine/registry.sh stop     stop it and remove its storage
#
# The password is random, made at `start`, kept only in the 0600 file TEST_REGISTRY_AUTH names (and
# bcrypt-hashed in the registry's htpasswd file); nothing here prints it. Docker and BuildKit reach a
# registry on 127.0.0.0/8 over plain HTTP without settings; cosign needs --allow-http-registry.
#
# Settings (environment):
#   REGISTRY_STATE       state folder (the registry's pid and start time, port, configuration, credentials;
#                        default /var/lib/rocm-vllm-registry)
#   REGISTRY_TIMEOUT     seconds to wait for the registry to answer (default 30)
#   REGISTRY_NO_INSTALL=1  never install packages; fail if a program is absent
#   DEBIAN_MIRROR        Debian archive for the trixie source (default: the one apt already uses)
set -euo pipefail

STATE=${REGISTRY_STATE:-/var/lib/rocm-vllm-registry}
PIDFILE="$STATE/registry.pid"
TIMEOUT=${REGISTRY_TIMEOUT:-30}
RUNTIME_SRC=$(cd "$(dirname "$0")/../../runtime/src" && pwd)  # rocm_vllm_runtime.web: its HTTP requests

log() { echo "registry: $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
die() { log "error: $*"; exit 1; }

installed() {
  command -v docker-registry >/dev/null 2>&1 && command -v cosign >/dev/null 2>&1 && command -v htpasswd >/dev/null 2>&1
}

install_tools() {
  if installed; then return 0; fi
  [ "${REGISTRY_NO_INSTALL:-0}" = 1 ] && die "docker-registry, cosign or htpasswd is missing and REGISTRY_NO_INSTALL=1"
  command -v apt-get >/dev/null 2>&1 || die "apt-get is absent: install docker-registry, cosign and htpasswd (apache2-utils) yourself"
  # cosign is packaged from Debian 13 on (docker-registry comes along from there); htpasswd from the
  # machine's own release: Debian 13's apache2-utils would upgrade openssl and openssh here.
  if ! command -v htpasswd >/dev/null 2>&1; then
    log "installing apache2-utils (htpasswd)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends apache2-utils
  fi
  log "installing docker-registry and cosign from Debian trixie (pinned low)"
  # The package starts its own service (all interfaces, port 5000) where an init system runs: a
  # policy-rc.d that denies every start keeps it down during the install (one the machine already
  # has is left as it is), and systemd's unit is disabled afterwards.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e "$policy" ] && [ ! -L "$policy" ]; then  # a dangling link is not written through
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null && as_root chmod 755 "$policy" && made_policy=1
  fi
  local status=0
  bash "$(dirname "$0")/debian-trixie.sh" docker-registry cosign || status=$?
  if [ "$made_policy" = 1 ]; then as_root rm -f "$policy"; fi
  [ "$status" = 0 ] || die "docker-registry and cosign could not be installed from Debian trixie (see above)"
  hash -r
  installed || die "installation finished but docker-registry, cosign or htpasswd is still not on PATH"
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    as_root systemctl disable --now docker-registry.service >/dev/null 2>&1 \
      || log "warning: the packaged docker-registry service could not be stopped (systemctl disable --now docker-registry)"
  fi
}

port() { cat "$STATE/port" 2>/dev/null; }

answers() {  # the registry's API root answers (401 without credentials), reached directly, never via a proxy
  local p; p=$(port) || return 1
  [ -n "$p" ] || return 1
  [ "$(PYTHONPATH="$RUNTIME_SRC${PYTHONPATH:+:$PYTHONPATH}" python3 -m rocm_vllm_runtime.web --timeout 3 \
    "http://127.0.0.1:$p/v2/" 2>/dev/null)" = 401 ]
}

# A process's state and start time (clock ticks since boot): with its pid, the start time names one
# process; a number reused since belongs to a process that started later.
state_and_start() {
  local stat; stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  set -f; set -- ${stat##*) }; set +f
  [ $# -ge 20 ] && echo "$1 ${20}"
}

# The pid file holds the pid of the docker-registry this script started and its start time, recorded
# at start. Running: that pid, that start time, and not a zombie (a process that exited and waits for
# its parent to reap it: a test process that adopted it as a subreaper); anything else holding the
# number is never signalled. A pid file without a start time names nothing.
registry_pid() {
  local pid start now
  read -r pid start _ <"$PIDFILE" 2>/dev/null || [ -n "${pid:-}" ] || return 1
  [[ "$pid" =~ ^[0-9]+$ && "${start:-}" =~ ^[0-9]+$ ]] || return 1
  now=$(state_and_start "$pid") || return 1
  [ "${now#* }" = "$start" ] && [ "${now%% *}" != Z ] && echo "$pid"
}
running() { [ -f "$PIDFILE" ] && registry_pid >/dev/null; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  install_tools
  if running && answers; then log "registry already running at 127.0.0.1:$(port)"; return 0; fi
  if running; then stop; fi
  mkdir -p "$STATE"
  chmod 700 "$STATE"
  local storage; storage=$(mktemp -d "${TMPDIR:-/tmp}/rocm-vllm-registry.XXXXXX")
  echo "$storage" >"$STATE/storage"
  local p; p=$(free_port)
  echo "$p" >"$STATE/port"
  local user=ci password
  password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  (umask 077; printf '%s\n%s\n' "$user" "$password" >"$STATE/auth")
  printf '%s' "$password" | htpasswd -niB "$user" >"$STATE/htpasswd" 2>/dev/null \
    || die "htpasswd could not hash the registry password"
  password=
  cat >"$STATE/config.yml" <<CONFIG
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $storage
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$p
auth:
  htpasswd:
    realm: rocm-vllm-test
    path: $STATE/htpasswd
CONFIG
  log "starting docker-registry on 127.0.0.1:$p (storage $storage, log $STATE/registry.log)"
  setsid docker-registry serve "$STATE/config.yml" >>"$STATE/registry.log" 2>&1 </dev/null &
  local pid=$! since
  since=$(state_and_start "$pid") || die "docker-registry exited at once (read $STATE/registry.log)"
  echo "$pid ${since#* }" >"$PIDFILE"
  local waited=0
  until answers; do
    if ! running || [ "$waited" -ge "$TIMEOUT" ]; then
      tail -n 20 "$STATE/registry.log" >&2 || true
      die "docker-registry did not answer on 127.0.0.1:$p within ${TIMEOUT}s (read $STATE/registry.log)"
    fi
    sleep 1; waited=$((waited + 1))
  done
  log "registry answers on 127.0.0.1:$p after ${waited}s ($(docker-registry --version 2>/dev/null | head -n 1); $(cosign version 2>/dev/null | sed -n 's/^GitVersion: *//p'))"
}

stop() {
  if [ -f "$PIDFILE" ]; then
    local pid
    if pid=$(registry_pid); then
      log "stopping docker-registry (pid $pid)"
      kill -TERM "$pid"
      local waited=0
      while running && [ "$waited" -lt 15 ]; do sleep 1; waited=$((waited + 1)); done
      # still there after its grace (seen once on a loaded 2-core machine)
      if running; then
        log "docker-registry (pid $pid) still running after 15s: killing it"
        kill -KILL "$pid" 2>/dev/null || true
        waited=0
        while running && [ "$waited" -lt 5 ]; do sleep 1; waited=$((waited + 1)); done
      fi
      running && die "docker-registry (pid $pid) still running after SIGTERM and SIGKILL"
    else
      log "the registry of $PIDFILE is not running (its pid is another process's now, or none): nothing to stop"
    fi
    rm -f "$PIDFILE"
  else
    log "no registry started here ($PIDFILE absent)"
  fi
  local storage; storage=$(cat "$STATE/storage" 2>/dev/null || true)
  case "$storage" in
    */rocm-vllm-registry.*) rm -rf "$storage" ;;
  esac
  rm -f "$STATE/storage" "$STATE/port" "$STATE/auth" "$STATE/htpasswd"
}

env_lines() {
  local p; p=$(port) || die "no registry started (run: bash ci/test-machine/registry.sh start)"
  echo "export TEST_REGISTRY=127.0.0.1:$p"
  echo "export TEST_REGISTRY_AUTH=$STATE/auth"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) env_lines ;;
  status) answers ;;
  *) echo "usage: $0 start|stop|env|status" >&2; exit 2 ;;
esac
