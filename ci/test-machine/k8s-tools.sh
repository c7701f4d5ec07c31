#!/usr/bin/env bash
# kubectl for the Kubernetes manifest tests (tests/test_kubernetes.py renders deploy/kubernetes
# with `kubectl kustomize`).
#
#   bash ci/test-machine/k8s-tools.sh install   install kubectl (Debian package kubernetes-client) when absent or too old
#   bash ci/test-machine/k8s-tools.sh check     exit 0 when `kubectl kustomize` is usable; print its versions
#
# Debian 12's kubernetes-client (1.20) predates kustomize v5; Debian 13 ("trixie") ships 1.32,
# which installs cleanly on Debian 12. Like ci/test-machine/docker-engine.sh, a trixie apt source is added
# with a low pin priority (100): only packages named with `-t trixie` come from it.
#
# Settings (environment):
#   K8S_TOOLS_NO_INSTALL=1  never install packages; fail if kubectl is absent or too old
#   DEBIAN_MIRROR           Debian archive for the trixie source (default: the one apt already uses)
set -euo pipefail

MIN_MINOR=27  # kubectl 1.27 embeds kustomize v5

log() { echo "k8s-tools: $*" >&2; }
die() { log "error: $*"; exit 1; }

client_minor() {  # minor version of kubectl's client, or nothing
  command -v kubectl >/dev/null 2>&1 || return 0
  # "Client Version: v1.32.4" (kubectl 1.28 and later), 'Minor:"20"' in the Go struct older ones print
  kubectl version --client 2>/dev/null \
    | sed -n -e 's/^Client Version: v[0-9]*\.\([0-9][0-9]*\).*/\1/p' -e 's/^Client Version: .*Minor:"\([0-9][0-9]*\).*/\1/p' \
    | head -n 1 || true
}

usable() {
  local minor; minor=$(client_minor)
  [ -n "$minor" ] && [ "$minor" -ge "$MIN_MINOR" ]
}

check() {
  usable || die "kubectl ${MIN_MINOR}+ not found (found: $(client_minor || true)); run: bash ci/test-machine/k8s-tools.sh install"
  kubectl version --client | sed -n -e 's/^Client Version: /kubectl /p' -e 's/^Kustomize Version: /kustomize /p' | paste -sd ' ' -
}

install() {
  if usable; then log "kubectl 1.$(client_minor) present"; check; return 0; fi
  [ "${K8S_TOOLS_NO_INSTALL:-0}" = 1 ] && die "kubectl 1.${MIN_MINOR}+ is missing and K8S_TOOLS_NO_INSTALL=1"
  command -v apt-get >/dev/null 2>&1 || die "apt-get is absent: install kubectl 1.${MIN_MINOR}+ yourself"
  log "installing kubernetes-client from Debian trixie (pinned low)"
  bash "$(dirname "$0")/debian-trixie.sh" kubernetes-client
  hash -r
  usable || die "kubernetes-client installed but kubectl 1.${MIN_MINOR}+ is still not on PATH"
  check
}

case "${1:-}" in
  install) install ;;
  check) check ;;
  *) echo "usage: $0 install|check" >&2; exit 2 ;;
esac
