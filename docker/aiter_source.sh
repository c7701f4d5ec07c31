#!/usr/bin/env bash
# AITER source at the pinned commit, with its Composable Kernel (CK) submodule.
#
#   aiter_source.sh clone  DEST   clone the AITER repository at the pinned tag with submodules into DEST
#   aiter_source.sh verify SRC    check SRC is the pinned commit with CK at the pinned ck_commit, write SRC/../aiter-pins.json
#   aiter_source.sh normalise DIR make DIR the same bytes for the same commits (see normalise)
#   aiter_source.sh hipkittens clone|verify DIR AITER_SRC
#                                 clone / check hipkittens_commit, the HipKittens commit AITER_SRC's
#                                 aiter/jit/core.py names (its prebuild would clone it); none: DIR empty
#
# Settings (build args): AITER_REPOSITORY, AITER_TAG, AITER_COMMIT, CK_COMMIT, CK_SUBMODULE_PATH,
# HIPKITTENS_REPOSITORY, HIPKITTENS_COMMIT, SOURCE_DATE_EPOCH, ALLOW_UNRESOLVED (development only).
set -euo pipefail

fail() { echo "aiter-src: ERROR: $*" >&2; exit 1; }
warn() { echo "aiter-src: WARNING: $*" >&2; }

need_aiter_args() {
  : "${AITER_REPOSITORY:?set the AITER_REPOSITORY build arg}" "${AITER_TAG:?set the AITER_TAG build arg}"
  : "${AITER_COMMIT:?set the AITER_COMMIT build arg}" "${CK_COMMIT:?set the CK_COMMIT build arg}"
  check_pin "aiter.pins.$AITER_TAG.commit" "$AITER_COMMIT" aiter
  check_pin "aiter.pins.$AITER_TAG.ck_commit" "$CK_COMMIT" aiter
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
use_ca_bundle

# A checkout as every clone of the same commits has it. Index files hold this clone's stat data
# (times, inodes), reflogs and FETCH_HEAD/ORIG_HEAD its times; git rebuilds an index on demand
# (verify does). Then every mtime under DIR is set to SOURCE_DATE_EPOCH.
normalise() {
  local dir=$1
  : "${SOURCE_DATE_EPOCH:?set the SOURCE_DATE_EPOCH build arg}"
  find "$dir" -path '*/.git/*' \( \( -type d -name logs -prune -exec rm -rf {} + \) \
    -o \( -type f \( -name index -o -name FETCH_HEAD -o -name ORIG_HEAD \) -exec rm -f {} + \) \)
  find "$dir" -exec touch -h -d "@${SOURCE_DATE_EPOCH}" {} +
}

# Index files for a checkout that has none (normalised): the superproject's, then each
# submodule's, read from HEAD; `git status` then compares the files with HEAD.
ensure_index() {
  local src=$1
  [ -f "$src/.git/index" ] && return 0
  git -C "$src" read-tree HEAD
  git -C "$src" submodule --quiet foreach --recursive 'test -f "$(git rev-parse --git-dir)/index" || git read-tree HEAD'
}

clone() {
  local dest=$1
  need_aiter_args
  git -c advice.detachedHead=false clone --quiet --recursive --branch "$AITER_TAG" -- "$AITER_REPOSITORY" "$dest" \
    || fail "cannot clone tag $AITER_TAG of $AITER_REPOSITORY (versions.json aiter.repository / the pin's tag)"
  git -C "$dest" submodule update --quiet --init --recursive \
    || fail "cannot check out the submodules of $AITER_REPOSITORY@$AITER_TAG"
  normalise "$dest"
}

verify() {
  local src=$1 head ck_recorded ck_head
  need_aiter_args
  : "${CK_SUBMODULE_PATH:?set the CK_SUBMODULE_PATH build arg}"
  git config --global --add safe.directory '*'
  head=$(git -C "$src" rev-parse HEAD 2>/dev/null) || fail "$src is not a git checkout of AITER (the aiter-src build context must include .git)"
  if [ "$AITER_COMMIT" != UNRESOLVED ] && [ "$head" != "$AITER_COMMIT" ]; then
    fail "AITER is at $head but versions.json pins commit $AITER_COMMIT (tag $AITER_TAG): the tag moved or the pin is wrong"
  fi
  ck_recorded=$(git -C "$src" ls-tree HEAD -- "$CK_SUBMODULE_PATH" | awk '$2 == "commit" {print $3}')
  [ -n "$ck_recorded" ] || fail "AITER $head has no submodule at $CK_SUBMODULE_PATH (versions.json aiter.ck_submodule_path)"
  ck_head=$(git -C "$src/$CK_SUBMODULE_PATH" rev-parse HEAD 2>/dev/null) \
    || fail "CK submodule $CK_SUBMODULE_PATH is not checked out: run git submodule update --init --recursive"
  if [ "$ck_head" != "$ck_recorded" ]; then
    fail "CK submodule is checked out at $ck_head but AITER $head records $ck_recorded: run git submodule update --init --recursive"
  fi
  if [ "$CK_COMMIT" != UNRESOLVED ] && [ "$ck_head" != "$CK_COMMIT" ]; then
    fail "CK submodule is at $ck_head but versions.json pins ck_commit $CK_COMMIT: fix the pin (python3 -m tools.pins resolve aiter) or the source"
  fi
  ensure_index "$src"
  if [ -n "$(git -C "$src" status --porcelain --ignore-submodules=none 2>/dev/null)" ]; then
    fail "the AITER checkout has local changes: supply a clean checkout"
  fi
  printf '{"repository": "%s", "tag": "%s", "commit": "%s", "ck_commit": "%s", "pinned": %s}\n' \
    "$AITER_REPOSITORY" "$AITER_TAG" "$head" "$ck_head" \
    "$([ "$AITER_COMMIT" = UNRESOLVED ] || [ "$CK_COMMIT" = UNRESOLVED ] && echo false || echo true)" \
    >"$(dirname "$src")/aiter-pins.json"
  echo "aiter-src: OK AITER $AITER_TAG = $head, CK = $ck_head"
}

# The HipKittens commit AITER_SRC names (empty: this AITER does not use HipKittens).
hipkittens_named() {
  local core=$1/aiter/jit/core.py
  [ -f "$core" ] || fail "$1 has no aiter/jit/core.py: not an AITER checkout"
  grep -A4 'HipKittens\.git' "$core" | grep -oE '\b[0-9a-f]{40}\b' | head -n 1 || true
}

# The commit to use: the pin's hipkittens_commit, checked against what AITER names ("none": AITER names none).
hipkittens_commit() {
  local named=$1
  : "${AITER_TAG:?set the AITER_TAG build arg}" "${HIPKITTENS_COMMIT:?set the HIPKITTENS_COMMIT build arg}"
  if [ "$HIPKITTENS_COMMIT" = none ]; then
    [ -z "$named" ] || fail "AITER names HipKittens $named but versions.json pins hipkittens_commit none: set aiter.pins.<pin>.hipkittens_commit to AITER's (python3 -m tools.pins resolve aiter)"
    return
  fi
  check_pin "aiter.pins.$AITER_TAG.hipkittens_commit" "$HIPKITTENS_COMMIT" aiter
  if [ "$HIPKITTENS_COMMIT" = UNRESOLVED ]; then
    echo "$named"
  elif [ "$HIPKITTENS_COMMIT" != "$named" ]; then
    fail "AITER names HipKittens ${named:-nowhere} but versions.json pins hipkittens_commit $HIPKITTENS_COMMIT: set aiter.pins.<pin>.hipkittens_commit to AITER's (python3 -m tools.pins resolve aiter)"
  else
    echo "$HIPKITTENS_COMMIT"
  fi
}

hipkittens() {
  local mode=$1 dir=$2 aiter_src=$3 named commit head
  named=$(hipkittens_named "$aiter_src")
  commit=$(hipkittens_commit "$named")
  mkdir -p "$dir"
  if [ -z "$commit" ]; then
    [ -z "$(ls -A "$dir")" ] || fail "this AITER does not use HipKittens but the hipkittens-src context is not empty"
    echo "aiter-src: OK this AITER does not use HipKittens"
    return
  fi
  if [ "$mode" = clone ]; then
    : "${HIPKITTENS_REPOSITORY:?set the HIPKITTENS_REPOSITORY build arg}"
    git init -q "$dir"
    git -C "$dir" remote add -- origin "$HIPKITTENS_REPOSITORY"
    git -C "$dir" fetch -q --depth 1 origin "$commit" \
      || fail "cannot fetch commit $commit of $HIPKITTENS_REPOSITORY (versions.json aiter.hipkittens_repository / the pin's hipkittens_commit)"
    git -C "$dir" -c advice.detachedHead=false checkout -q FETCH_HEAD
    git -C "$dir" submodule update -q --init --recursive --depth 1 \
      || fail "cannot check out the submodules of $HIPKITTENS_REPOSITORY@$commit"
  fi
  git config --global --add safe.directory '*'
  head=$(git -C "$dir" rev-parse HEAD 2>/dev/null) \
    || fail "$dir is not a git checkout of HipKittens (the hipkittens-src build context must include .git)"
  [ "$head" = "$commit" ] || fail "HipKittens is at $head but AITER and versions.json need $commit: supply that commit"
  echo "aiter-src: OK HipKittens = $head"
}

case "${1:-}" in
  clone) clone "${2:?destination}" ;;
  verify) verify "${2:?source directory}" ;;
  normalise) normalise "${2:?directory}" ;;
  hipkittens)
    case "${2:-}" in clone|verify) ;; *) echo "usage: $0 hipkittens clone|verify DIR AITER_SRC" >&2; exit 2 ;; esac
    hipkittens "$2" "${3:?HipKittens directory}" "${4:?AITER source directory}" ;;
  *) echo "usage: $0 clone DEST | verify SRC | normalise DIR | hipkittens clone|verify DIR AITER_SRC" >&2; exit 2 ;;
esac
