#!/usr/bin/env bash
# Print the tag of a small Debian image (bash, git, python3, ca-certificates) for test builds, made
# without a registry: debootstrap --variant=minbase + docker import, once per engine (cached
# by tag). When TEST_BASE_IMAGE names an image (e.g. one from a registry), that is used instead.
# One maker at a time (the tests run in several lanes, and two may ask first): a second caller waits
# for the first and takes its image.
set -euo pipefail
if [ -n "${TEST_BASE_IMAGE:-}" ]; then echo "$TEST_BASE_IMAGE"; exit 0; fi
SUITE=${TEST_DEBIAN_SUITE:-bookworm}
MIRROR=${TEST_DEBIAN_MIRROR:-$(bash "$(dirname "$0")/debian-mirror.sh")}
TAG="localhost/rocm-vllm-test/debian-git-python:${SUITE}"
if docker image inspect "$TAG" >/dev/null 2>&1; then echo "$TAG"; exit 0; fi
exec 9>>"${TMPDIR:-/tmp}/rocm-vllm-debian-test-image.lock"
flock 9
if docker image inspect "$TAG" >/dev/null 2>&1; then echo "$TAG"; exit 0; fi
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "debian-test-image: installing debootstrap" >&2
  apt-get install -y -qq debootstrap >&2 || { apt-get update -qq >&2 && apt-get install -y -qq debootstrap >&2; }
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
echo "debian-test-image: debootstrap $SUITE (minbase + git, python3) into $root" >&2
debootstrap --variant=minbase --include=git,python3,ca-certificates "$SUITE" "$root" "$MIRROR" >&2
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import - "$TAG" >&2
echo "$TAG"
