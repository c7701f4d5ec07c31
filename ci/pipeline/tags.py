"""Image tags, build-cache refs and attestations the pipeline pushes, from versions.json.

Tag of every pushed image: vllm<vLLM version of the track>-aiter<12 hex of the AITER commit>-<12 hex
of the repository commit>, plus the git tag name for tag builds and the branch name for branch
builds. Build cache: one registry ref per target, keyed by what the target's layers depend
on, so a vLLM bump keeps the `base` key (the AITER layers) and only the vLLM targets miss.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ci.pins import model
from ci.pins.model import PinError

HEX40 = re.compile(r"[0-9a-f]{40}")
TAG_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
TARGETS = ("base", "vllm", "serve", "ci")
ATTEST = ("type=sbom", "type=provenance,mode=max")


def aiter_commit(data: Mapping, pin_name: str | None = None, track: str | None = None) -> str:
    name = model.track_aiter_pin_name(data, track, pin_name)
    commit = model.aiter_pin(data, name).get("commit")
    if not commit or not HEX40.fullmatch(commit):
        raise PinError(f"aiter.pins.{name}.commit is unresolved: run python3 -m ci.pins resolve aiter --write "
                       f"(or set AITER_PIN to a resolved pin)")
    return commit


def check_sha(sha: str) -> str:
    if not HEX40.fullmatch(sha):
        raise PinError(f"GIT_SHA {sha!r} is not a full 40-hex commit id: set GIT_SHA to the commit being built")
    return sha


def vllm_version(data: Mapping, track: str | None = None) -> str:
    return model.track(data, track)["vllm"]["version"]


def image_tag(data: Mapping, sha: str, pin_name: str | None = None, track: str | None = None) -> str:
    return f"vllm{vllm_version(data, track)}-aiter{aiter_commit(data, pin_name, track)[:12]}-{check_sha(sha)[:12]}"


def ref_tag(ref: str) -> str | None:
    """Floating tag for a git ref: the tag name (refs/tags/v1.2) or the branch (refs/heads/main)."""
    for prefix in ("refs/tags/", "refs/heads/"):
        if ref.startswith(prefix):
            name = TAG_CHARS.sub("-", ref[len(prefix):]).lstrip(".-")[:128]
            return name or None
    return None


def tags(data: Mapping, sha: str, ref: str = "", pin_name: str | None = None, track: str | None = None) -> list[str]:
    out = [image_tag(data, sha, pin_name, track)]
    extra = ref_tag(ref) if ref else None
    if extra and track and track != data["default_track"]:
        extra = f"{extra}-vllm{track}"  # the floating tag of a branch or git tag names the default track
    if extra and extra not in out:
        out.append(extra)
    return out


def archs_key(gpu_archs: str) -> str:
    archs = [a for a in gpu_archs.replace(",", ";").split(";") if a]
    if not archs:
        raise PinError("GPU_ARCHS is empty: set GPU_ARCHS (e.g. gfx942;gfx950) or versions.json gpu_archs")
    return "-".join(archs)


def cache_key(data: Mapping, target: str, gpu_archs: str, pin_name: str | None = None,
              track: str | None = None) -> str:
    """base: AITER commit + archs (what the AITER compile depends on; the vLLM version is not in
    it). vLLM targets: vLLM version + AITER commit + archs."""
    aiter = aiter_commit(data, pin_name, track)[:12]
    if target == "base":
        return f"base-aiter{aiter}-{archs_key(gpu_archs)}"
    return f"{target}-vllm{vllm_version(data, track)}-aiter{aiter}-{archs_key(gpu_archs)}"


def bake_override(data: Mapping, registry: str, sha: str, targets: Sequence[str], ref: str = "",
                  cache_repo: str = "", gpu_archs: str = "", pin_name: str | None = None,
                  attest: bool = True, track: str | None = None) -> dict[str, object]:
    """A bake file (JSON) that sets tags, registry cache and attestations for each target."""
    if not registry or registry.startswith("localhost/"):
        raise PinError(f"REGISTRY {registry!r} is not a registry to push to: set REGISTRY (e.g. ghcr.io/org/rocm-vllm)")
    if registry != registry.lower():
        raise PinError(f"REGISTRY {registry!r} has upper-case letters, which image names cannot have: "
                       "set REGISTRY in lower case")
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise PinError(f"unknown target(s) {unknown or '(none)'}: choose from {', '.join(TARGETS)}")
    registry = registry.rstrip("/")
    cache_repo = (cache_repo or f"{registry}/buildcache").rstrip("/")
    archs = gpu_archs or ";".join(data["gpu_archs"])
    names = tags(data, sha, ref, pin_name, track)
    out: dict[str, dict[str, object]] = {}
    for target in targets:
        ref_ = f"{cache_repo}:{cache_key(data, target, archs, pin_name, track)}"
        entry: dict[str, object] = {
            "tags": [f"{registry}/{target}:{t}" for t in names],
            "cache-from": [f"type=registry,ref={ref_}"],
            "cache-to": [f"type=registry,ref={ref_},mode=max"],
        }
        if attest:
            entry["attest"] = list(ATTEST)
        out[target] = entry
    return {"target": out}
