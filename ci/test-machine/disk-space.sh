#!/usr/bin/env bash
# Free disk space where a test run writes: the checkout (virtual environments), the temporary
# directory (pytest's folders) and the private Docker engine's data root. A run that fills the
# disk fails in many unrelated places, so .ci/run prints these first and last.
#
#   bash ci/test-machine/disk-space.sh report LABEL   one line per folder: "disk (LABEL): 55G free on /dev/vda (DIR)"
#   bash ci/test-machine/disk-space.sh free DIR       "55G free on /dev/vda": the file system holding DIR
#   bash ci/test-machine/disk-space.sh check          warn when the checkout's file system has less than
#                                                     CI_DISK_NEED_GB (default 20) free; always exits 0
#                                                     unless the setting itself is wrong (exit 2)
#
# A run from a fresh clone on a machine with no engine data writes about 16 GB: the two test
# virtual environments (7 GB), the CPU test images (8 GB), pytest's folders and download caches.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)

free_on() {  # free_on DIR -> "55G free on /dev/vda"
  df -h --output=avail,source "$1" 2>/dev/null | awk 'NR == 2 {print $1 " free on " $2}'
}

report() {
  local dir
  for dir in "$REPO" "${TMPDIR:-/tmp}" "${DOCKER_ENGINE_ROOT:-/var/lib/rocm-vllm-engine}"; do
    [ -d "$dir" ] || continue
    echo "disk ($1): $(free_on "$dir") ($dir)"
  done
}

check() {
  local need=${CI_DISK_NEED_GB:-20} free
  case "$need" in
    '' | *[!0-9]*) echo "error: CI_DISK_NEED_GB must be a whole number of GB, got '$need'" >&2; exit 2 ;;
  esac
  free=$(df -BG --output=avail "$REPO" 2>/dev/null | awk 'NR == 2 {sub("G", ""); print $1}')
  if [ -n "$free" ] && [ "$free" -lt "$need" ]; then
    echo "warning: ${free}G free where the tests write, below the ${need}G a run from scratch may need:" \
         "if tests then fail with 'No space left on device', free disk space (CI_DISK_NEED_GB sets this bound)" >&2
  fi
}

case "${1:-}" in
  report) report "${2:-now}" ;;
  free)
    if [ -z "${2:-}" ]; then echo "usage: $0 free DIR" >&2; exit 2; fi
    free_on "$2" ;;
  check) check ;;
  *) echo "usage: $0 report LABEL|free DIR|check" >&2; exit 2 ;;
esac
