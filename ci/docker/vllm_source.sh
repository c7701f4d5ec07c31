#!/usr/bin/env bash
# vLLM source at the pinned commit.
#
#   vllm_source.sh clone  DEST   clone VLLM_REPO at VLLM_TAG into DEST
#   vllm_source.sh verify SRC    check SRC is VLLM_COMMIT with no local changes
#   vllm_source.sh triton-kernels DEST
#                                the ROCm triton_kernels package vLLM's CMake would clone at build
#                                time: TRITON_KERNELS_PATH of TRITON_KERNELS_REPO at
#                                TRITON_KERNELS_COMMIT, copied to DEST (the build points
#                                TRITON_KERNELS_SRC_DIR at it)
#
# Settings (build args): VLLM_REPO, VLLM_TAG, VLLM_COMMIT, ALLOW_UNRESOLVED (1: accept an
# UNRESOLVED commit and record the one found; development only), TRITON_KERNELS_REPO,
# TRITON_KERNELS_COMMIT, TRITON_KERNELS_PATH.
# A CA bundle mounted at /run/secrets/ca-bundle is used for https remotes when present.
set -euo pipefail

fail() { echo "vllm-src: ERROR: $*" >&2; exit 1; }
warn() { echo "vllm-src: WARNING: $*" >&2; }

ALLOW_UNRESOLVED=${ALLOW_UNRESOLVED:-0}

# shellcheck source=pin_check.sh
source "$(dirname "$0")/pin_check.sh"
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
use_ca_bundle

need_vllm_args() {
  : "${VLLM_REPO:?set the VLLM_REPO build arg}" "${VLLM_TAG:?set the VLLM_TAG build arg}"
  : "${VLLM_COMMIT:?set the VLLM_COMMIT build arg}"
}

clone() {
  local dest=$1
  need_vllm_args
  check_pin VLLM_COMMIT "$VLLM_COMMIT" vllm
  # Full history of the tag: setuptools-scm derives the version from it.
  git -c advice.detachedHead=false clone --quiet --branch "$VLLM_TAG" "$VLLM_REPO" "$dest" \
    || fail "cannot clone tag $VLLM_TAG of $VLLM_REPO (VLLM_REPO / VLLM_TAG)"
}

verify() {
  local src=$1 head
  need_vllm_args
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

triton_kernels() {
  local dest=$1 tmp head
  : "${TRITON_KERNELS_REPO:?set the TRITON_KERNELS_REPO build arg}" "${TRITON_KERNELS_PATH:?set the TRITON_KERNELS_PATH build arg}"
  : "${TRITON_KERNELS_COMMIT:?set the TRITON_KERNELS_COMMIT build arg}"
  check_pin TRITON_KERNELS_COMMIT "$TRITON_KERNELS_COMMIT" vllm
  [ "$TRITON_KERNELS_COMMIT" != UNRESOLVED ] \
    || fail "TRITON_KERNELS_COMMIT is UNRESOLVED: set vllm.triton_kernels.commit in versions.json to the commit vLLM's cmake/external_projects/triton_kernels.cmake names"
  tmp=$(mktemp -d)
  git init -q "$tmp"
  git -C "$tmp" remote add origin "$TRITON_KERNELS_REPO"
  git -C "$tmp" sparse-checkout set --no-cone "/$TRITON_KERNELS_PATH/" 2>/dev/null \
    || fail "git $(git --version | awk '{print $3}') has no sparse-checkout: the source stage image needs git >= 2.25"
  # One commit, only the files of the sparse path (servers without partial clone: the whole tree).
  git -C "$tmp" fetch -q --depth 1 --filter=blob:none origin "$TRITON_KERNELS_COMMIT" 2>/dev/null \
    || git -C "$tmp" fetch -q --depth 1 origin "$TRITON_KERNELS_COMMIT" \
    || fail "cannot fetch commit $TRITON_KERNELS_COMMIT of $TRITON_KERNELS_REPO (TRITON_KERNELS_REPO / TRITON_KERNELS_COMMIT)"
  git -C "$tmp" -c advice.detachedHead=false checkout -q FETCH_HEAD
  head=$(git -C "$tmp" rev-parse HEAD)
  [ "$head" = "$TRITON_KERNELS_COMMIT" ] || fail "fetched $head, not TRITON_KERNELS_COMMIT=$TRITON_KERNELS_COMMIT"
  [ -f "$tmp/$TRITON_KERNELS_PATH/__init__.py" ] \
    || fail "$TRITON_KERNELS_REPO@$head has no Python package at $TRITON_KERNELS_PATH (TRITON_KERNELS_PATH)"
  mkdir -p "$dest"
  cp -a "$tmp/$TRITON_KERNELS_PATH/." "$dest/"
  rm -rf "$tmp"
  echo "vllm-src: OK triton_kernels $TRITON_KERNELS_REPO@$head:$TRITON_KERNELS_PATH"
}

case "${1:-}" in
  clone) clone "${2:?destination}" ;;
  verify) verify "${2:?source directory}" ;;
  triton-kernels) triton_kernels "${2:?destination}" ;;
  *) echo "usage: $0 clone DEST | verify SRC | triton-kernels DEST" >&2; exit 2 ;;
esac
