#!/usr/bin/env bash
# Install packages from Debian 13 ("trixie") on a Debian 12 machine, nothing else upgraded:
#
#   bash ci/test-machine/debian-trixie.sh PACKAGE...
#
# Adds a trixie apt source (the archive this machine's apt already uses, or DEBIAN_MIRROR) with a
# low pin priority (100) once, so only the packages named here come from trixie, then installs
# them with `-t trixie`. Used by ci/test-machine/docker-engine.sh (Docker engine, buildx, compose) and
# ci/test-machine/k8s-tools.sh (kubectl).
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: $0 PACKAGE..." >&2; exit 2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if [ ! -f /etc/apt/sources.list.d/trixie.sources ]; then
  mirror=$(bash "$(dirname "$0")/../docker/debian-mirror.sh") \
    || { echo "debian-trixie: error: no Debian mirror for the trixie source: set DEBIAN_MIRROR" >&2; exit 1; }
  as_root tee /etc/apt/sources.list.d/trixie.sources >/dev/null <<SRC
Types: deb
URIs: $mirror
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
if [ ! -f /etc/apt/preferences.d/trixie-low ]; then
  as_root tee /etc/apt/preferences.d/trixie-low >/dev/null <<'PIN'
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
fi
as_root apt-get update -qq
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t trixie "$@"
