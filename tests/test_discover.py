"""python3 -m tools.pins discover: new vLLM releases found on PyPI's real JSON API and proposed as
release tracks from their real sdists (the archives tests/vllm_sdist.py keeps; their sha256 is
PyPI's), and newer AITER tags read from a local git repository."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from tools.pins import discover, model, verify
from vllm_sdist import cache_dir, sdist_archive, track_names

ROOT = Path(__file__).resolve().parents[1]


def run_tool(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "tools.pins", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def sdists() -> Path:
    """The tracks' sdists, downloaded once (the pins job's cache is the tests' cache)."""
    for track in track_names():
        sdist_archive(track)
    return cache_dir()


def older_tree(tmp_path: Path) -> tuple[Path, dict, str]:
    """A copy of versions.json, the Dockerfiles and the backend's range with the newest track
    removed (as before its release), and that track's name."""
    data = model.load(ROOT / "versions.json")
    newest = model.track_names(data)[0]
    own = data["tracks"].pop(newest)
    data["default_track"] = model.track_names(data)[0]
    if all(t["aiter"] != own["aiter"] for t in data["tracks"].values()):
        data["aiter"]["pins"].pop(own["aiter"])
    model.dump(data, tmp_path / "versions.json")
    for name in model.DOCKERFILES:
        (tmp_path / name).write_text((ROOT / name).read_text())
    init = tmp_path / model.BACKEND_INIT
    init.parent.mkdir(parents=True)
    init.write_text((ROOT / model.BACKEND_INIT).read_text().replace(
        model.supported_vllm(model.load(ROOT / "versions.json")), model.supported_vllm(data)))
    model.write_files(model.global_arg_updates(data, tmp_path)[1])
    return tmp_path / "versions.json", data, newest


def test_discover_proposes_the_newest_track_as_released(sdists, tmp_path):
    """With the newest track taken out, the pins job finds its release on PyPI and proposes a track
    whose vLLM pins are the ones versions.json holds, with the AITER its upstream base names."""
    path, _, newest = older_tree(tmp_path)
    want = model.load(ROOT / "versions.json")["tracks"][newest]
    version = want["vllm"]["version"]
    proc = run_tool("--file", path, "discover", "--up-to", version, "--sdist-cache", sdists, "--write",
                    "--summary", tmp_path / "summary.md")
    assert proc.returncode == 0, proc.stderr
    assert f"tracks.{newest}: vLLM {version}, AITER {want['aiter']}" in proc.stdout
    got = model.load(path)
    real = model.load(ROOT / "versions.json")
    # the new track is the default where its stack is built here, as versions.json has it
    assert (got["default_track"] == newest) == (newest == real["default_track"])
    track = got["tracks"][newest]
    for key in ("stack", "base_image", "rocm", "therock"):  # a therock track's own stack, as discover derives it
        assert track.get(key) == want.get(key), key
    assert (track["aiter"], track["upstream_base_dockerfile"]) == (want["aiter"], want["upstream_base_dockerfile"])
    assert track["vllm"]["sdist"]["sha256"] == want["vllm"]["sdist"]["sha256"]
    # the file's address on PyPI's file host (the JSON API may give it relative to itself)
    assert track["vllm"]["sdist"]["url"].rsplit("/packages/", 1)[1] == want["vllm"]["sdist"]["url"].rsplit(
        "/packages/", 1)[1]
    for key in ("version", "tag", "commit", "commit_prefix", "unresolved", "triton_kernels_commit"):
        assert track["vllm"][key] == want["vllm"][key], key
    assert got["aiter"]["pins"][want["aiter"]]["unresolved"] or got["aiter"]["pins"][want["aiter"]]["commit"]
    # written with the Dockerfiles' defaults; the backend's range left as it was (the plugin steps
    # aside on the new track until it is compared with that release), and it verifies
    default_version = got["tracks"][got["default_track"]]["vllm"]["version"]
    assert f"ARG VLLM_VERSION={default_version}\n" in (tmp_path / "Dockerfile.rocm").read_text()
    assert model.backend_supported_vllm(tmp_path)[1] == model.supported_vllm(got, model.track_names(got)[1])
    assert f"it steps aside on track {newest} " in proc.stdout
    assert run_tool("--file", path, "verify").returncode == 0
    summary = (tmp_path / "summary.md").read_text()
    assert f"### vLLM {version}: track {newest}" in summary and "requirements/common.txt" in summary
    # nothing more to find up to that release
    proc = run_tool("--file", path, "discover", "--up-to", version, "--sdist-cache", sdists)
    assert proc.returncode == 0 and f"no vLLM release newer than track {newest}" in proc.stdout


def test_list_and_release_name_what_would_be_added(sdists, tmp_path):
    path, _, newest = older_tree(tmp_path)
    version = model.load(ROOT / "versions.json")["tracks"][newest]["vllm"]["version"]
    proc = run_tool("--file", path, "discover", "--list", "--up-to", version)
    assert proc.returncode == 0 and proc.stdout.split() == [version]
    before = path.read_bytes()
    proc = run_tool("--file", path, "discover", "--release", "0.0.1", "--write")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1 and "--release 0.0.1" in proc.stderr
    assert path.read_bytes() == before


def test_new_releases_take_the_newest_patch_of_each_newer_line():
    data = model.load(ROOT / "versions.json")
    newest = tuple(map(int, data["tracks"][model.track_names(data)[0]]["vllm"]["version"].split(".")))
    line = f"{newest[0]}.{newest[1] + 1}"
    sdists = {v: discover.Sdist(v, f"https://x/{v}", "0" * 64, f"vllm-{v}.tar.gz")
              for v in (f"{line}.0", f"{line}.1", f"{newest[0]}.{newest[1]}.9", f"{newest[0]}.{newest[1] + 2}.0")}
    found = discover.new_releases(data, sdists)
    assert [s.version for s in found] == [f"{line}.1", f"{newest[0]}.{newest[1] + 2}.0"]
    assert [s.version for s in discover.new_releases(data, sdists, up_to=f"{line}.0")] == [f"{line}.0"]


def test_another_rocm_stack_is_reported_not_hidden():
    data = model.load(ROOT / "versions.json")
    release = discover.Release("9.1.0", "abcdef123", "1" * 40, base_dockerfiles={
        "docker/Dockerfile.rocm_base": {"BASE_IMAGE": "debian:13", "AITER_BRANCH": "v0.2.0"}})
    proposal = discover.add_track(copy.deepcopy(data), discover.Sdist("9.1.0", "https://x/y", "0" * 64, "y"), release)
    assert not proposal.same_stack and proposal.base_dockerfile == "docker/Dockerfile.rocm_base"
    assert any("debian:13" in note for note in proposal.notes)
    release.base_dockerfiles["docker/Dockerfile.rocm_base"]["AITER_BRANCH"] = "main"
    with pytest.raises(model.PinError, match="names no AITER release tag"):
        discover.add_track(copy.deepcopy(data), discover.Sdist("9.1.0", "https://x/y", "0" * 64, "y"), release)


def test_newer_aiter_tags_are_reported_for_each_track(tmp_path):
    repo = tmp_path / "aiter"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, check=True)
    for tag in ("v0.1.26", "v0.1.27", "v0.1.27.post1", "v0.2.0rc1", "nightly"):
        subprocess.run([*git, "tag", "-a", tag, "-m", tag], cwd=repo, check=True)
    data = model.load(ROOT / "versions.json")
    tags = discover.aiter_tags(repo.as_uri())
    assert {"v0.1.26", "v0.1.27.post1", "nightly"} <= set(tags)
    lines = discover.newer_aiter_tags(data, tags)
    older = [t for t, own in data["tracks"].items()
             if discover._aiter_key(data["aiter"]["pins"][own["aiter"]]["tag"]) < discover._aiter_key("v0.1.27.post1")]
    assert len(lines) == len(older) >= 2 and all("v0.1.27.post1" in line for line in lines)
    assert discover.newer_aiter_tags(data, ["v0.1.0"]) == []


def test_a_tampered_sdist_is_refused(tmp_path, monkeypatch):
    import functools
    import http.server
    import threading

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "vllm-9.9.9.tar.gz").write_bytes(b"not the release")
    (tmp_path / "served.tar.gz").write_bytes(b"also not the release")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}/served.tar.gz"
    try:
        with pytest.raises(model.PinError, match="sha256 differs"):
            discover.fetch(discover.Sdist("9.9.9", url, "0" * 64, "vllm-9.9.9.tar.gz"), cache)
    finally:
        server.shutdown()
    assert not (cache / "vllm-9.9.9.tar.gz.part").exists()


@pytest.mark.parametrize("ref,parts", [
    ("rocm/dev-ubuntu-22.04:7.2.3-complete", ("rocm/dev-ubuntu-22.04", "7.2.3-complete", None)),
    ("ubuntu:22.04@sha256:" + "5" * 64, ("ubuntu", "22.04", "sha256:" + "5" * 64)),
    ("localhost:5000/rocm/dev", ("localhost:5000/rocm/dev", "latest", None)),
    ("localhost:5000/rocm/dev:7.2@sha256:" + "a" * 64, ("localhost:5000/rocm/dev", "7.2", "sha256:" + "a" * 64)),
])
def test_upstream_base_images_are_compared_with_their_digest(ref, parts):
    """vLLM 0.34's docker/Dockerfile.rocm_base names its base with a digest (ubuntu:22.04@sha256:...):
    the same image is the same name and tag, and the same digest where both name one."""
    assert discover.image_parts(ref) == parts
    name, tag, digest = parts
    assert discover.same_image(ref, {"name": name, "tag": tag, "digest": None})
    assert discover.same_image(ref, {"name": name, "tag": tag, "digest": digest})
    assert not discover.same_image(ref, {"name": name, "tag": tag + "x", "digest": None})
    if digest:
        assert not discover.same_image(ref, {"name": name, "tag": tag, "digest": "sha256:" + "0" * 64})


def test_a_therock_base_makes_a_therock_track_the_new_default(tmp_path):
    """vLLM 0.34's base installs TheRock ROCm as wheels (ROCM_SDK_VERSION) on ubuntu by digest: the
    track records that stack, base image, SDK version and Triton source; this repository builds that
    stack, so the new track becomes the default."""
    data = model.load(ROOT / "versions.json")
    digest = "sha256:" + "5" * 64
    release = discover.Release("9.1.0", "abcdef123", "1" * 40, base_dockerfiles={
        "docker/Dockerfile.rocm_base": {"BASE_IMAGE": f"ubuntu:24.04@{digest}", "AITER_BRANCH": "v0.2.0",
                                        "ROCM_SDK_VERSION": "11.0.0",
                                        "ROCM_RELEASE_WHEELS_MULTIARCH_URL": "https://rel.example/whl/",
                                        "TORCH_VERSION": "2.15.0+rocm11.0.0",
                                        "TORCHVISION_VERSION": "0.30.0+rocm11.0.0",
                                        "TORCHAUDIO_VERSION": "2.13.0+rocm11.0.0",
                                        "TRITON_REPO": "https://github.com/ROCm/triton.git",
                                        "TRITON_BRANCH": "11111111", "TRITON_VERSION": "3.9.0+git11111111"}})
    changed = copy.deepcopy(data)
    proposal = discover.add_track(changed, discover.Sdist("9.1.0", "https://x/y", "0" * 64, "y"), release)
    own = changed["tracks"]["9.1"]
    assert own["stack"] == model.THEROCK_STACK and own["rocm"] == {"version": "11.0.0"}
    assert own["base_image"] == {"name": "ubuntu", "tag": "24.04", "digest": digest, "unresolved": []}
    assert own["therock"]["index_url"] == "https://rel.example/whl/" and own["therock"]["torch"]["torch"] == \
        "2.15.0+rocm11.0.0" and own["therock"]["unresolved"] == ["lock_sha256"]
    # the release's triton_kernels commit (1...1) starts with upstream's short Triton commit
    assert own["therock"]["triton"] == {"repository": "https://github.com/ROCm/triton.git", "commit": "1" * 40,
                                        "version": "3.9.0+git11111111", "unresolved": []}
    assert verify.check_schema(changed) == []
    assert changed["default_track"] == "9.1" and model.built_track_names(changed)[0] == "9.1"
    assert any("TheRock ROCm 11.0.0" in note and "docker/locks/therock-9.1.txt" in note for note in proposal.notes)
    assert not any("default track stays" in note for note in proposal.notes)
