#!/usr/bin/env bash
# vLLM source at the pinned commit.
#
#   vllm_source.sh clone  DEST   clone VLLM_REPO at VLLM_TAG into DEST
#   vllm_source.sh verify SRC    check SRC is VLLM_COMMIT with no local changes
#
# Settings (build args): VLLM_REPO, VLLM_TAG, VLLM_COMMIT, ALLOW_UNRESOLVED (1: accept an
# UNRESOLVED commit and record the one found; development only).
# A CA bundle mounted at /run/secrets/ca-bundle is used for https remotes when present.
set -euo pipefail

fail() { echo "vllm-src: ERROR: $*" >&2; exit 1; }
warn() { echo "vllm-src: WARNING: $*" >&2; }

: "${VLLM_REPO:?set the VLLM_REPO build arg}" "${VLLM_TAG:?set the VLLM_TAG build arg}"
: "${VLLM_COMMIT:?set the VLLM_COMMIT build arg}"
ALLOW_UNRESOLVED=${ALLOW_UNRESOLVED:-0}
if [ -f /run/secrets/ca-bundle ]; then export GIT_SSL_CAINFO=/run/secrets/ca-bundle; fi

# shellcheck source=pin_check.sh
source "$(dirname "$0")/pin_check.sh"

clone() {
  local dest=$1
  check_pin VLLM_COMMIT "$VLLM_COMMIT" vllm
  # Full history of the tag: setuptools-scm derives the version from it.
  git -c advice.detachedHead=false clone --quiet --branch "$VLLM_TAG" "$VLLM_REPO" "$dest" \
    || fail "cannot clone tag $VLLM_TAG of $VLLM_REPO (VLLM_REPO / VLLM_TAG)"
}

verify() {
  local src=$1 head
  check_pin VLLM_COMMIT "$VLLM_COMMIT" vllm
  git config --global --add safe.directory '*'
  head=$(git -C "$src" rev-parse HEAD 2>/dev/null) || fail "$src is not a git checkout of vLLM (the vllm-src build context must include .git)"
  if [ "$VLLM_COMMIT" != UNRESOLVED ] && [ "$head" != "$VLLM_COMMIT" ]; then
    fail "vLLM is at $head but versions.json pins VLLM_COMMIT=$VLLM_COMMIT (tag $VLLM_TAG): the tag moved or the pin is wrong"
  fi
  if [ -n "$(git -C "$src" status --porcelain 2>/dev/null)" ]; then
    fail "the vLLM checkout has local changes: supply a clean checkout"
  fi
  echo "vllm-src: OK vLLM $VLLM_TAG = $head"
}

case "${1:-}" in
  clone) clone "${2:?destination}" ;;
  verify) verify "${2:?source directory}" ;;
  *) echo "usage: $0 clone DEST | verify SRC" >&2; exit 2 ;;
esac
