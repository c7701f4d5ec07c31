"""A therock track's TheRock section of versions.json: the release index alone (never a nightly
one, never plain http), PyTorch's versions from upstream's base Dockerfile, and what the track
installs derived from them, the SDK version and gpu_archs (`python3 -m tools.pins therock`, the input
of its hash lock); the lock's sha256 stays an unresolved pin until a host that reaches the index
makes it. discover's proposal of the whole section against the real release is in test_discover."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from tools.pins import discover, model, verify
from tools.pins.model import PinError

ROOT = Path(__file__).resolve().parents[1]


def run_tool(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "tools.pins", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


@pytest.fixture
def data():
    return model.load(ROOT / "versions.json")


def test_every_therock_track_has_its_section_and_an_unresolved_lock_here(data):
    assert model.therock_track_names(data), "no therock track in versions.json"
    for name in model.therock_track_names(data):
        assert verify.check_schema(data) == []
        assert f"tracks.{name}.therock.lock_sha256" in model.unresolved_pins(data)


@pytest.mark.parametrize(("change", "words"), [
    (lambda t: t["therock"].update(index_url="https://nightly.repo.amd.com/rocm/whl-next/"), "a nightly index"),
    (lambda t: t["therock"].update(index_url="https://NIGHTLY.repo.amd.com/rocm/whl-next/"), "a nightly index"),
    (lambda t: t["therock"].update(index_url="http://stable.repo.amd.com/rocm/whl-next/"), "must be an https:// URL"),
    (lambda t: t["therock"]["torch"].update(triton="3.8.0"), "torch.triton: holds a name that does not belong"),
    (lambda t: t["therock"]["torch"].pop("torchaudio"), "torch.torchaudio: is missing"),
    (lambda t: t["therock"].update(lock_sha256="ABC"), "64 lowercase hex"),
    (lambda t: t["therock"].update(lock_sha256=None, unresolved=[]), "lock_sha256"),
    (lambda t: t["therock"].update(extra_index_url="https://pypi.org/simple"), "extra_index_url: holds a name"),
    (lambda t: t.pop("therock"), "therock: is missing"),
])
def test_verify_refuses_a_therock_section_that_could_take_other_wheels(data, change, words):
    d = copy.deepcopy(data)
    change(d["tracks"][model.therock_track_names(d)[0]])
    errors = verify.check_schema(d)
    assert any(words in e for e in errors), errors


def rocm_image_track(data) -> str:
    return next(n for n in model.track_names(data) if model.track_stack(data, n) == model.ROCM_IMAGE_STACK)


def test_only_a_therock_track_has_a_therock_section(data):
    d = copy.deepcopy(data)
    built = rocm_image_track(d)
    d["tracks"][built]["therock"] = copy.deepcopy(d["tracks"][model.therock_track_names(d)[0]]["therock"])
    assert f"tracks.{built}.stack: is missing" in verify.check_schema(d)  # a therock section: a therock track


def test_what_a_therock_track_installs_follows_gpu_archs(data):
    name = model.therock_track_names(data)[0]
    track = data["tracks"][name]
    sdk, torch = track["rocm"]["version"], track["therock"]["torch"]
    lines = model.therock_requirements(sdk, torch, ["gfx942"])
    assert lines[:4] == [f"rocm[libraries,devel]=={sdk}", f"torch=={torch['torch']}",
                         f"torchvision=={torch['torchvision']}", f"torchaudio=={torch['torchaudio']}"]
    assert lines[4:] == [f"rocm[device-gfx942]=={sdk}", f"torch[device-gfx942]=={torch['torch']}",
                         f"torchvision[device-gfx942]=={torch['torchvision']}"]
    both = model.therock_requirements(sdk, torch, ["gfx942", "gfx950"])
    assert len(both) == 10 and sum("gfx950" in line for line in both) == 3


def test_the_therock_command_prints_the_lock_input(data):
    name = model.therock_track_names(data)[0]
    proc = run_tool("therock", "--track", name)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    track = data["tracks"][name]
    assert f"--index-url {track['therock']['index_url']} " in lines[1] and "--generate-hashes" in lines[1]
    assert "--extra-index-url" not in proc.stdout
    assert [line for line in lines if not line.startswith("#")] == model.therock_requirements(
        track["rocm"]["version"], track["therock"]["torch"], data["gpu_archs"])
    built = rocm_image_track(data)
    proc = run_tool("therock", "--track", built)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and f"--track {built}: no therock track" in proc.stderr


UPSTREAM = {"ROCM_SDK_VERSION": "10.0.0", "ROCM_RELEASE_WHEELS_MULTIARCH_URL": "https://stable.repo.amd.com/rocm/whl-next/",
            "ROCM_NIGHTLY_WHEELS_MULTIARCH_URL": "https://nightly.repo.amd.com/rocm/whl-next/",
            "TORCH_VERSION": "2.13.0+rocm10.0.0", "TORCHVISION_VERSION": "0.28.0+rocm10.0.0",
            "TORCHAUDIO_VERSION": "2.11.0+rocm10.0.0", "TRITON_REPO": "https://github.com/ROCm/triton.git",
            "TRITON_BRANCH": "669b31ac", "TRITON_VERSION": "3.8.0+git669b31ac"}


def test_discover_takes_the_release_index_and_never_the_nightly_one():
    pins = discover.therock_pins("0.34.0", "docker/Dockerfile.rocm_base", UPSTREAM)
    assert pins["index_url"] == UPSTREAM["ROCM_RELEASE_WHEELS_MULTIARCH_URL"]
    assert pins["torch"] == {"torch": "2.13.0+rocm10.0.0", "torchvision": "0.28.0+rocm10.0.0",
                             "torchaudio": "2.11.0+rocm10.0.0"}
    assert pins["lock_sha256"] is None and pins["unresolved"] == ["lock_sha256"]
    for bad in ({"ROCM_RELEASE_WHEELS_MULTIARCH_URL": UPSTREAM["ROCM_NIGHTLY_WHEELS_MULTIARCH_URL"]},
                {"ROCM_RELEASE_WHEELS_MULTIARCH_URL": "https://Nightly.repo.amd.com/rocm/whl-next/"},
                {"ROCM_RELEASE_WHEELS_MULTIARCH_URL": ""}, {"TORCHAUDIO_VERSION": ""}):
        with pytest.raises(PinError, match="add its track by hand"):
            discover.therock_pins("0.34.0", "docker/Dockerfile.rocm_base", {**UPSTREAM, **bad})


KERNELS = "669b31acc1dd1b3fd93286afd5db67f65d9f7557"


def test_discover_takes_triton_from_upstream_and_its_full_commit_from_the_kernels_pin():
    """Upstream names Triton by a short commit; the track pins the full one where vLLM's ROCm
    triton_kernels commit (same repository) starts with it, and leaves it unresolved otherwise."""
    pins = discover.therock_pins("0.34.0", "docker/Dockerfile.rocm_base", UPSTREAM, KERNELS)
    assert pins["triton"] == {"repository": "https://github.com/ROCm/triton.git", "commit": KERNELS,
                              "version": "3.8.0+git669b31ac", "unresolved": []}
    other = discover.therock_pins("0.34.0", "docker/Dockerfile.rocm_base", UPSTREAM, "0" * 40)["triton"]
    assert other["commit"] is None and other["unresolved"] == ["commit"]
    for bad in ({"TRITON_BRANCH": ""}, {"TRITON_BRANCH": "release/3.8"}, {"TRITON_REPO": "http://github.com/x.git"},
                {"TRITON_VERSION": ""}):
        with pytest.raises(PinError, match="builds Triton from .*add its track by hand"):
            discover.therock_pins("0.34.0", "docker/Dockerfile.rocm_base", {**UPSTREAM, **bad}, KERNELS)


def test_verify_holds_the_triton_pin_to_a_commit_and_an_https_repository(data):
    d = copy.deepcopy(data)
    triton = d["tracks"][model.therock_track_names(d)[0]]["therock"]["triton"]
    triton["commit"] = "669b31ac"
    assert any("triton.commit: must be a full 40-hex commit" in e for e in verify.check_schema(d))
    triton["commit"], triton["repository"] = KERNELS, "git@github.com:ROCm/triton.git"
    assert any("triton.repository: must be an https:// URL" in e for e in verify.check_schema(d))


def test_the_therock_command_refuses_an_index_with_credentials(data, tmp_path):
    """An index with credentials (a private mirror's) is refused, naming the key, never showing
    them: versions.json is committed (python3 -m tools.pins verify refuses it the same way)."""
    d = copy.deepcopy(data)
    name = model.therock_track_names(d)[0]
    d["tracks"][name]["therock"]["index_url"] = "https://user:s3cret@mirror.example/rocm/whl/"
    model.dump(d, tmp_path / "versions.json")
    proc = run_tool("--file", tmp_path / "versions.json", "therock")
    assert proc.returncode == 1 and f"tracks.{name}.therock.index_url: holds credentials" in proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr
