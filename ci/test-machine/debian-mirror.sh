#!/usr/bin/env bash
# Print the Debian archive URI this machine's apt already uses (so builds go through the
# same mirror or proxy), or DEBIAN_MIRROR when set. Security archives are skipped.
set -euo pipefail
if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; exit 0; fi
uri=$(
  { grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{for (i = 2; i <= NF; i++) print $i}' || true
    grep -hE '^deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | sed -E 's/\[[^]]*\]//' | awk '{print $2}' || true
  } | grep -E '/debian/?$' | head -n 1 || true
)
if [ -z "$uri" ]; then
  echo "debian-mirror: no Debian archive in this machine's apt sources; set DEBIAN_MIRROR" >&2
  exit 1
fi
echo "${uri%/}"
