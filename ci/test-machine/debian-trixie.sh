#!/usr/bin/env bash
# Install packages from Debian 13 ("trixie") on a Debian 12 machine, nothing else upgraded:
#
#   bash ci/test-machine/debian-trixie.sh PACKAGE...
#
# Adds a trixie apt source (the archive this machine's apt already uses, or DEBIAN_MIRROR) with a
# low pin priority (100) once, so only the packages named here come from trixie, then installs
# them with `-t trixie`. Used by ci/test-machine/docker-engine.sh (Docker engine, buildx, compose) and
# ci/test-machine/k8s-tools.sh (kubectl).
#
# What they need from Debian 13 may upgrade packages this machine already has (Docker's engine
# pulls Debian 13's libc6, and with it locales, dpkg, base-files: /etc/debian_version then says
# 13.x). Before installing, one line names every installed package that would change, from which
# version to which. DEBIAN_TRIXIE_UPGRADES=refuse declines: nothing is installed when any would
# (exit 1); allow (the default) goes on. DEBIAN_TRIXIE_APT_ETC: apt's configuration folder
# (default /etc/apt).
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: $0 PACKAGE..." >&2; exit 2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

etc=${DEBIAN_TRIXIE_APT_ETC:-/etc/apt}
if [ ! -f "$etc/sources.list.d/trixie.sources" ]; then
  mirror=$(bash "$(dirname "$0")/debian-mirror.sh") \
    || { echo "debian-trixie: error: no Debian mirror for the trixie source: set DEBIAN_MIRROR" >&2; exit 1; }
  as_root tee "$etc/sources.list.d/trixie.sources" >/dev/null <<SRC
Types: deb
URIs: $mirror
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
if [ ! -f "$etc/preferences.d/trixie-low" ]; then
  as_root tee "$etc/preferences.d/trixie-low" >/dev/null <<'PIN'
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
fi
upgrades_setting=${DEBIAN_TRIXIE_UPGRADES:-allow}
case "$upgrades_setting" in
  allow|refuse) ;;
  *) echo "debian-trixie: error: DEBIAN_TRIXIE_UPGRADES=$upgrades_setting: set allow or refuse" >&2; exit 1 ;;
esac
as_root apt-get update -qq
# "Inst NAME [INSTALLED] (CANDIDATE ...)": a package already installed that would change.
upgrades=$(apt-get install -s --no-install-recommends -t trixie "$@" \
  | sed -n 's/^Inst \([^ ]*\) \[\([^]]*\)\] (\([^ ]*\) .*/\1 \2 -> \3/p' | paste -sd, - | sed 's/,/, /g')
if [ -n "$upgrades" ]; then
  count=$(tr ',' '\n' <<<"$upgrades" | wc -l)
  echo "debian-trixie: installing $* from Debian 13 also upgrades $count installed package(s) of this machine: $upgrades (DEBIAN_TRIXIE_UPGRADES=refuse declines)" >&2
  if [ "$upgrades_setting" = refuse ]; then
    echo "debian-trixie: error: DEBIAN_TRIXIE_UPGRADES=refuse: nothing installed; install $* another way, or allow the upgrades" >&2
    exit 1
  fi
fi
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t trixie "$@"
