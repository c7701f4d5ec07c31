#!/usr/bin/env bash
# AITER source at the pinned commit, with its Composable Kernel (CK) submodule.
#
#   aiter_source.sh clone  DEST   clone AITER_REPO at AITER_TAG with submodules into DEST
#   aiter_source.sh verify SRC    check SRC is AITER_COMMIT with CK at AITER_CK_COMMIT, write SRC/../aiter-pins.json
#
# Settings (build args): AITER_REPO, AITER_TAG, AITER_COMMIT, AITER_CK_COMMIT, AITER_CK_PATH,
# ALLOW_UNRESOLVED (1: accept UNRESOLVED commits and record what was found; development only).
# A CA bundle mounted at /run/secrets/ca-bundle is used for https remotes when present.
set -euo pipefail

fail() { echo "aiter-src: ERROR: $*" >&2; exit 1; }
warn() { echo "aiter-src: WARNING: $*" >&2; }

: "${AITER_REPO:?set the AITER_REPO build arg}" "${AITER_TAG:?set the AITER_TAG build arg}"
: "${AITER_COMMIT:?set the AITER_COMMIT build arg}" "${AITER_CK_COMMIT:?set the AITER_CK_COMMIT build arg}"
AITER_CK_PATH=${AITER_CK_PATH:-3rdparty/composable_kernel}
ALLOW_UNRESOLVED=${ALLOW_UNRESOLVED:-0}
[ -f /run/secrets/ca-bundle ] && export GIT_SSL_CAINFO=/run/secrets/ca-bundle

# shellcheck source=pin_check.sh
source "$(dirname "$0")/pin_check.sh"

clone() {
  local dest=$1
  check_pin AITER_COMMIT "$AITER_COMMIT" aiter
  check_pin AITER_CK_COMMIT "$AITER_CK_COMMIT" aiter
  git -c advice.detachedHead=false clone --quiet --recursive --branch "$AITER_TAG" "$AITER_REPO" "$dest" \
    || fail "cannot clone tag $AITER_TAG of $AITER_REPO (AITER_REPO / AITER_TAG)"
  git -C "$dest" submodule update --quiet --init --recursive \
    || fail "cannot check out the submodules of $AITER_REPO@$AITER_TAG"
}

verify() {
  local src=$1 head ck_recorded ck_head
  check_pin AITER_COMMIT "$AITER_COMMIT" aiter
  check_pin AITER_CK_COMMIT "$AITER_CK_COMMIT" aiter
  git config --global --add safe.directory '*'
  head=$(git -C "$src" rev-parse HEAD 2>/dev/null) || fail "$src is not a git checkout of AITER (the aiter-src build context must include .git)"
  if [ "$AITER_COMMIT" != UNRESOLVED ] && [ "$head" != "$AITER_COMMIT" ]; then
    fail "AITER is at $head but versions.json pins AITER_COMMIT=$AITER_COMMIT (tag $AITER_TAG): the tag moved or the pin is wrong"
  fi
  ck_recorded=$(git -C "$src" ls-tree HEAD -- "$AITER_CK_PATH" | awk '$2 == "commit" {print $3}')
  [ -n "$ck_recorded" ] || fail "AITER $head has no submodule at $AITER_CK_PATH (AITER_CK_PATH)"
  ck_head=$(git -C "$src/$AITER_CK_PATH" rev-parse HEAD 2>/dev/null) \
    || fail "CK submodule $AITER_CK_PATH is not checked out: run git submodule update --init --recursive"
  if [ "$ck_head" != "$ck_recorded" ]; then
    fail "CK submodule is checked out at $ck_head but AITER $head records $ck_recorded: run git submodule update --init --recursive"
  fi
  if [ "$AITER_CK_COMMIT" != UNRESOLVED ] && [ "$ck_head" != "$AITER_CK_COMMIT" ]; then
    fail "CK submodule is at $ck_head but versions.json pins AITER_CK_COMMIT=$AITER_CK_COMMIT: fix the pin (python3 -m ci.pins resolve aiter) or the source"
  fi
  if [ -n "$(git -C "$src" status --porcelain --ignore-submodules=none 2>/dev/null)" ]; then
    fail "the AITER checkout has local changes: supply a clean checkout"
  fi
  printf '{"repository": "%s", "tag": "%s", "commit": "%s", "ck_commit": "%s", "pinned": %s}\n' \
    "$AITER_REPO" "$AITER_TAG" "$head" "$ck_head" \
    "$([ "$AITER_COMMIT" = UNRESOLVED ] || [ "$AITER_CK_COMMIT" = UNRESOLVED ] && echo false || echo true)" \
    >"$(dirname "$src")/aiter-pins.json"
  echo "aiter-src: OK AITER $AITER_TAG = $head, CK = $ck_head"
}

case "${1:-}" in
  clone) clone "${2:?destination}" ;;
  verify) verify "${2:?source directory}" ;;
  *) echo "usage: $0 clone DEST | verify SRC" >&2; exit 2 ;;
esac
