"""The CPU path (no AMD GPU) as documented: docker-bake.hcl's serve-cpu and ci-cpu targets (group
cpu) on a CPU build of the track's vLLM, and the commands README.md and docs/serving.md give,
which are the ones the Docker tests run (tests/test_engine_integration.py). Static: `docker
buildx bake --print` and the documents; the build and serve themselves are the engine tests'."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_bake import CLEAR, printed
from vllm_sdist import cpu_track

from tools.pins import model

ROOT = Path(__file__).resolve().parents[1]
CPU_TARGETS = ("serve-cpu", "ci-cpu")
# vLLM's own CPU release images on Docker Hub: vllm/vllm-openai-cpu:v<version> (x86_64 and arm64;
# vLLM's docs/getting_started/installation/cpu.x86.inc.md, .buildkite/scripts/publish-release-images.sh).
PUBLIC_CPU_IMAGE = "docker.io/vllm/vllm-openai-cpu:v{version}"
NO_OVERRIDES = {**CLEAR, "VLLM_CPU_IMAGE": "", "VLLM_IMAGE": "", "ALLOW_UNRESOLVED": "0"}


def printed_cpu_targets(**env) -> dict:
    """serve-cpu and ci-cpu as bake resolves them, nothing overridden but `env`."""
    clean = {k: v for k, v in NO_OVERRIDES.items() if k != "VLLM_CPU_IMAGE"}
    return printed("cpu", env={**clean, **env})


@pytest.fixture(autouse=True)
def _no_cpu_image_from_the_caller(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_IMAGE", raising=False)
    monkeypatch.delenv("TRACK", raising=False)


def test_group_cpu_is_the_two_cpu_targets():
    assert set(printed_cpu_targets()) == set(CPU_TARGETS)


@pytest.mark.parametrize("track", sorted(model.load()["tracks"]))
def test_default_base_is_vllms_public_cpu_image_of_the_tracks_release(track):
    version = model.load()["tracks"][track]["vllm"]["version"]
    image = PUBLIC_CPU_IMAGE.format(version=version)
    for name, target in printed_cpu_targets(TRACK=track).items():
        assert target["args"]["VLLM_IMAGE"] == image, name
        assert target["args"]["VLLM_VERSION"] == version and target["args"]["VLLM_TRACK"] == track, name
        # the ROCm base target is never built for a CPU image: `base` is the CPU image too
        assert target["contexts"] == {"base": f"docker-image://{image}"}, name


def test_cpu_image_is_overridable():
    image = "localhost/somewhere/vllm-cpu:0.32.0@sha256:" + "a" * 64
    for name, target in printed_cpu_targets(VLLM_CPU_IMAGE=image).items():
        assert target["args"]["VLLM_IMAGE"] == image, name
        assert target["contexts"] == {"base": f"docker-image://{image}"}, name


def test_cpu_targets_are_serve_and_ci_on_an_existing_vllm_image():
    """serve-cpu and ci-cpu are the serve and ci targets with VLLM_IMAGE set to the CPU image: the
    same Dockerfile stage, build args (no pin of the base or AITER), named contexts, secrets and
    labels; only tags, cache and output differ (printed with ALLOW_UNRESOLVED=0: on an existing image
    no unresolved pin of versions.json stops either)."""
    track = cpu_track()
    image = "localhost/somewhere/vllm-cpu:0.32.0@sha256:" + "a" * 64
    cpu = printed_cpu_targets(TRACK=track, VLLM_CPU_IMAGE=image)
    rocm = printed("serve", "ci", env={**NO_OVERRIDES, "TRACK": track, "VLLM_IMAGE": image})
    for name, base in (("serve-cpu", "serve"), ("ci-cpu", "ci")):
        target, of = cpu[name], rocm[base]
        assert target["dockerfile"] == of["dockerfile"] == "Dockerfile.rocm"
        assert target["target"] == of["target"] == base
        assert target["args"] == of["args"] and target["contexts"] == of["contexts"]
        assert target.get("secret") == of.get("secret") and target.get("labels") == of.get("labels")


@pytest.mark.parametrize("track", sorted(model.load()["tracks"]))
def test_cpu_images_are_local_without_push(track):
    """<name>:<TAG>-vllm<track> and <name>:<TAG> (compose.cpu.yaml's default) on every track; not
    pushed, no registry cache or attestations."""
    for name, target in printed_cpu_targets(TRACK=track, TAG="t1").items():
        assert target["tags"] == [f"localhost/rocm-vllm/{name}:t1-vllm{track}", f"localhost/rocm-vllm/{name}:t1"], name
        assert target["output"] == ["type=image,rewrite-timestamp=true"], name
        assert all("disabled=true" in a.split(",") for a in target.get("attest", [])), name
        assert not target.get("cache-to") and not target.get("cache-from"), name


@pytest.mark.parametrize("track", sorted(model.load()["tracks"]))
def test_cpu_images_for_a_registry_with_push(track):
    """PUSH=1: pushed under <name>:vllm<version>-cpu-<12 hex of the commit> and the floating TAG, with
    registry build cache (one ref per target, no AITER in its key) and SBOM and provenance
    attestations (ATTEST=0: none); a revision that is not a full commit id stops bake."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    version = model.load()["tracks"][track]["vllm"]["version"]
    floating = "t1" if track == model.load()["default_track"] else f"t1-vllm{track}"
    push = {"TAG": "t1", "PUSH": "1", "REGISTRY": "registry.example/team", "VCS_REF": sha}
    for name, target in printed_cpu_targets(TRACK=track, **push).items():
        image = f"registry.example/team/{name}"
        assert target["tags"] == [f"{image}:vllm{version}-cpu-{sha[:12]}", f"{image}:{floating}"], name
        assert target["output"] == ["type=image,push=true"], name
        assert target["attest"] == ["type=sbom", "type=provenance,mode=max"], name
        cache = f"type=registry,ref=registry.example/team/buildcache:{name}-vllm{version}"
        assert target["cache-from"] == [cache] and target["cache-to"] == [f"{cache},mode=max"], name
    for name, target in printed_cpu_targets(TRACK=track, **{**push, "ATTEST": "0", "TAG": ""}).items():
        assert target["tags"] == [f"registry.example/team/{name}:vllm{version}-cpu-{sha[:12]}"], name
        assert all("disabled=true" in a.split(",") for a in target["attest"]), name
    from test_bake import bake_print  # noqa: PLC0415

    proc = bake_print("cpu", env={**NO_OVERRIDES, **push, "TRACK": track, "VCS_REF": "main"})
    assert proc.returncode != 0 and "VCS_REF_must_be_the_full_40_hex_commit_id" in proc.stderr, proc.stderr[-500:]


def test_cpu_targets_take_the_cache_import_setting():
    targets = printed_cpu_targets(CACHE_FROM="type=local,src=/var/cache/x")
    assert all(t["cache-from"] == ["type=local,src=/var/cache/x"] for t in targets.values())


def documented_cpu_commands(text: str) -> list[str]:
    """The indented command lines of a document that build or serve the CPU path."""
    cpu = re.compile(r"compose\.cpu\.yaml|\bbake\b.*\b(serve-cpu|ci-cpu|cpu)\b")
    return [line.strip() for line in text.splitlines() if line.startswith("    ") and cpu.search(line)]


@pytest.mark.parametrize("doc", ["docs/serving.md"])
def test_documented_cpu_path_is_the_tested_one(doc):
    """The document's two commands by hand: the serve-cpu target of the track the CPU tests build
    (TRACK), on the default CPU image, then compose.yaml with the shipped override, as the engine
    tests do (their own override on top). README.md's one command (serve-cpu.sh) is run as written
    by tests/test_readme_cpu.py."""
    from test_engine_integration import COMPOSE_FILES, CPU_TARGETS as TESTED_TARGETS  # noqa: PLC0415

    lines = documented_cpu_commands((ROOT / doc).read_text())
    build = [line for line in lines if "docker buildx bake" in line]
    serve = [line for line in lines if "docker compose" in line and " up " in f"{line} "]
    assert build and serve, f"{doc}: no CPU build or serve command"
    for line in build:
        assert f"TRACK={cpu_track()} " in line, f"{doc}: {line!r} builds another track than the tests"
        assert "-f docker-bake.hcl -f docker-bake.pins.json" in line and "VLLM_CPU_IMAGE" not in line, line
        assert set(re.findall(r"\b(?:serve|ci)-cpu\b", line)) <= set(TESTED_TARGETS.values()), line
    shipped = [name for name in COMPOSE_FILES if not name.startswith("tests/")]
    for line in serve:
        assert re.findall(r"-f (\S+)", line) == shipped, f"{doc}: {line!r}"
        assert "up -d --wait" in line, line
