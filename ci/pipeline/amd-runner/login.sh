#!/usr/bin/env bash
# Run a command logged in to the image registry, and log out afterwards.
#
#   ci/pipeline/amd-runner/login.sh COMMAND [ARGS...]
#
# Settings:
#   REGISTRY           image repository prefix; its first component is the registry host
#                      when it names one (has a '.' or ':', or is localhost), else docker.io
#   REGISTRY_HOST      registry host to log in to (default: from REGISTRY)
#   REGISTRY_USERNAME  user name (required with REGISTRY_PASSWORD)
#   REGISTRY_PASSWORD  password or token, read from the environment and handed to
#                      `docker login --password-stdin`; never printed, and removed from the
#                      environment of COMMAND. Unset: COMMAND runs with the credentials the
#                      runner already has.
#   DOCKER             docker command (default docker)
set -euo pipefail

docker_cmd=${DOCKER:-docker}
[ "$#" -gt 0 ] \
  || { echo "error: no command given: ci/pipeline/amd-runner/login.sh COMMAND [ARGS...]" >&2; exit 1; }
host=${REGISTRY_HOST:-}
if [ -z "$host" ]; then
  first=${REGISTRY:-}
  first=${first%%/*}
  case "$first" in
    *.*|*:*|localhost) host=$first ;;
    *) host=docker.io ;;
  esac
fi

password=${REGISTRY_PASSWORD:-}
unset REGISTRY_PASSWORD
if [ -z "$password" ]; then
  echo "== REGISTRY_PASSWORD not set: using this runner's existing credentials for $host" >&2
  exec "$@"
fi
[ -n "${REGISTRY_USERNAME:-}" ] \
  || { echo "error: REGISTRY_PASSWORD is set but REGISTRY_USERNAME is not: set REGISTRY_USERNAME" >&2; exit 1; }
# One line on failure (a wrong credential, a registry that does not answer): docker's last line,
# the password masked should it ever echo it.
if ! out=$(printf '%s' "$password" | "$docker_cmd" login --username "$REGISTRY_USERNAME" --password-stdin "$host" 2>&1); then
  reason=$(printf '%s\n' "$out" | sed '/^[[:space:]]*$/d' | tail -n 1)
  reason=${reason//"$password"/***}
  password=
  echo "error: docker login to $host as $REGISTRY_USERNAME failed: ${reason:-no reason given}: check REGISTRY_USERNAME and REGISTRY_PASSWORD, and that the registry answers" >&2
  exit 1
fi
password=
echo "== logged in to $host as $REGISTRY_USERNAME" >&2
trap '"$docker_cmd" logout "$host" >/dev/null 2>&1 || echo "warning: docker logout $host failed" >&2' EXIT
"$@" || exit
