#!/usr/bin/env bash
# vLLM source at the pinned commit.
#
#   vllm_source.sh clone  DEST   clone the vLLM repository at the pinned tag into DEST
#   vllm_source.sh verify SRC    check SRC is the pinned commit with no local changes
#   vllm_source.sh triton-kernels DEST
#                                copy to DEST the ROCm triton_kernels package vLLM's CMake would
#                                clone at build time (TRITON_KERNELS_SRC_DIR points at it)
#
# Settings (build args): VLLM_REPOSITORY, VLLM_TAG, VLLM_COMMIT, TRITON_KERNELS_REPOSITORY,
# TRITON_KERNELS_COMMIT, TRITON_KERNELS_PATH, ALLOW_UNRESOLVED (development only).
set -euo pipefail

fail() { echo "vllm-src: ERROR: $*" >&2; exit 1; }
warn() { echo "vllm-src: WARNING: $*" >&2; }

# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
use_ca_bundle

need_vllm_args() {
  : "${VLLM_TAG:?set the VLLM_TAG build arg}" "${VLLM_COMMIT:?set the VLLM_COMMIT build arg}"
  check_pin "the vLLM commit (tag $VLLM_TAG)" "$VLLM_COMMIT" vllm
}

clone() {
  local dest=$1
  need_vllm_args
  : "${VLLM_REPOSITORY:?set the VLLM_REPOSITORY build arg}"
  # Full history of the tag: setuptools-scm derives the version from it.
  git -c advice.detachedHead=false clone --quiet --branch "$VLLM_TAG" -- "$VLLM_REPOSITORY" "$dest" \
    || fail "cannot clone tag $VLLM_TAG of $VLLM_REPOSITORY (versions.json vllm.repository / the track's vllm.tag)"
}

verify() {
  local src=$1 head
  need_vllm_args
  git config --global --add safe.directory '*'
  head=$(git -C "$src" rev-parse HEAD 2>/dev/null) || fail "$src is not a git checkout of vLLM (the vllm-src build context must include .git)"
  if [ "$VLLM_COMMIT" != UNRESOLVED ] && [ "$head" != "$VLLM_COMMIT" ]; then
    fail "vLLM is at $head but versions.json pins commit $VLLM_COMMIT (tag $VLLM_TAG): the tag moved or the pin is wrong"
  fi
  if [ -n "$(git -C "$src" status --porcelain 2>/dev/null)" ]; then
    fail "the vLLM checkout has local changes: supply a clean checkout"
  fi
  echo "vllm-src: OK vLLM $VLLM_TAG = $head"
}

triton_kernels() {
  local dest=$1 tmp head
  : "${TRITON_KERNELS_REPOSITORY:?set the TRITON_KERNELS_REPOSITORY build arg}"
  : "${TRITON_KERNELS_PATH:?set the TRITON_KERNELS_PATH build arg}"
  : "${TRITON_KERNELS_COMMIT:?set the TRITON_KERNELS_COMMIT build arg}"
  check_pin "the triton_kernels commit (tracks.*.vllm.triton_kernels_commit)" "$TRITON_KERNELS_COMMIT" vllm
  [ "$TRITON_KERNELS_COMMIT" != UNRESOLVED ] \
    || fail "the triton_kernels commit is unresolved: set the track's vllm.triton_kernels_commit in versions.json to the commit vLLM's cmake/external_projects/triton_kernels.cmake names"
  tmp=$(mktemp -d)
  git init -q "$tmp"
  git -C "$tmp" remote add -- origin "$TRITON_KERNELS_REPOSITORY"
  git -C "$tmp" sparse-checkout set --no-cone "/$TRITON_KERNELS_PATH/" 2>/dev/null \
    || fail "git $(git --version | awk '{print $3}') has no sparse-checkout: the source stage image needs git >= 2.25"
  # One commit, only the files of the sparse path (servers without partial clone: the whole tree).
  git -C "$tmp" fetch -q --depth 1 --filter=blob:none origin "$TRITON_KERNELS_COMMIT" 2>/dev/null \
    || git -C "$tmp" fetch -q --depth 1 origin "$TRITON_KERNELS_COMMIT" \
    || fail "cannot fetch commit $TRITON_KERNELS_COMMIT of $TRITON_KERNELS_REPOSITORY (versions.json vllm.triton_kernels.repository / the track's vllm.triton_kernels_commit)"
  git -C "$tmp" -c advice.detachedHead=false checkout -q FETCH_HEAD
  head=$(git -C "$tmp" rev-parse HEAD)
  [ "$head" = "$TRITON_KERNELS_COMMIT" ] || fail "fetched $head, not the pinned triton_kernels commit $TRITON_KERNELS_COMMIT"
  [ -f "$tmp/$TRITON_KERNELS_PATH/__init__.py" ] \
    || fail "$TRITON_KERNELS_REPOSITORY@$head has no Python package at $TRITON_KERNELS_PATH (versions.json vllm.triton_kernels.path)"
  mkdir -p "$dest"
  cp -a "$tmp/$TRITON_KERNELS_PATH/." "$dest/"
  rm -rf "$tmp"
  echo "vllm-src: OK triton_kernels $TRITON_KERNELS_REPOSITORY@$head:$TRITON_KERNELS_PATH"
}

case "${1:-}" in
  clone) clone "${2:?destination}" ;;
  verify) verify "${2:?source directory}" ;;
  triton-kernels) triton_kernels "${2:?destination}" ;;
  *) echo "usage: $0 clone DEST | verify SRC | triton-kernels DEST" >&2; exit 2 ;;
esac
