"""`python3 -m tools.pins resolve therock`'s lock (tools.pins.locks.therock_lock), made by the real uv
against a local stand-in of TheRock's release index: every wheel of the track (the SDK with its
libraries and devel parts, the device wheels of gpu_archs and no other arch, the PyTorch wheels
and what they require) by the sha256 of the release index's file, never from a second index
offered through the environment, never TheRock's own Triton; and the lock installs with
docker/install_lock.sh, offline."""
from __future__ import annotations

import copy
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from venvs import make_venv

import therock_standin as standin
from tools.pins import locks, model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    root = tmp_path_factory.mktemp("therock-lock")
    return {"release": standin.index(root / "release", "release", standin.release_wheels()),
            "pypi": standin.index(root / "pypi", "pypi", standin.pypi_wheels()), "root": root}


@pytest.fixture(scope="module")
def data():
    return model.load(ROOT / "versions.json")


def test_the_lock_holds_every_wheel_of_the_track_by_the_release_index_hash(indexes, data, monkeypatch):
    # a careless environment: PyPI stand-ins offered as uv's extra index and find-links
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", indexes["pypi"].as_uri())
    monkeypatch.setenv("UV_FIND_LINKS", str(indexes["pypi"] / "rocm-sdk-core"))
    track = model.therock_track_names(data)[0]
    text = locks.therock_lock(data, track, index_url=indexes["release"].as_uri())
    reqs = standin.lock_requirements(text)
    archs = data["gpu_archs"]
    wanted = {"rocm", "rocm-sdk-core", "rocm-sdk-libraries", "rocm-sdk-devel", "torch", "torchvision", "torchaudio",
              "filelock", *(f"rocm-sdk-device-{a}" for a in archs), *(f"torch-device-{a}" for a in archs)}
    assert set(reqs) == wanted, text
    for name, (version, hashes) in reqs.items():
        assert hashes == [standin.sha256_of(indexes["release"], name, version)], name
    assert reqs["torch"][0] == data["tracks"][track]["therock"]["torch"]["torch"]
    assert "gfx90a" not in text.split("# body")[1]  # an arch outside gpu_archs
    assert "triton" not in reqs and "Left out (the image builds Triton from source)" in text
    assert f"tracks.{track}.therock.lock_sha256" in text and "extra-only-on-pypi" not in text
    assert locks.body_problem("therock", text) == ""


def test_a_wheel_the_release_index_lacks_is_not_taken_from_another(indexes, data, monkeypatch):
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", indexes["pypi"].as_uri())
    d = copy.deepcopy(data)
    d["tracks"][model.therock_track_names(d)[0]]["therock"]["torch"]["torchaudio"] = "9.9.9"
    with pytest.raises(model.PinError, match="therock lock of track .*uv pip compile failed"):
        locks.therock_lock(d, model.therock_track_names(d)[0], index_url=indexes["release"].as_uri())


def test_the_lock_installs_offline_by_hash(indexes, data, tmp_path):
    track = model.therock_track_names(data)[0]
    text = locks.therock_lock(data, track, index_url=indexes["release"].as_uri())
    lock = tmp_path / model.therock_lock_name(track)
    lock.write_text(text)
    venv = tmp_path / "venv"
    make_venv(venv)
    proc = subprocess.run(["bash", ROOT / "docker/install_lock.sh", lock, indexes["release"].as_uri(),
                           hashlib.sha256(text.encode()).hexdigest()],
                          env={**os.environ, "PYTHON": str(venv / "bin/python"),
                               "PIP_EXTRA_INDEX_URL": indexes["pypi"].as_uri()},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    site = next((venv / "lib").glob("python*/site-packages"))
    origins = {p.name.removesuffix("_origin.txt"): p.read_text() for p in site.glob("*_origin.txt")}
    assert set(origins.values()) == {"release"} and len(origins) == len(standin.lock_requirements(text))
    assert (venv / "bin/rocm-sdk").exists()


def test_resolve_therock_writes_the_lock_and_pins_its_sha256(indexes, data, monkeypatch, tmp_path):
    """resolve's therock item: the lock goes to docker/locks/therock-<track>.txt and its sha256 to
    tracks.<track>.therock.lock_sha256 (out of unresolved); a pinned lock is kept unless --force."""
    import argparse

    from tools.pins import __main__ as cli

    real = locks.therock_lock
    monkeypatch.setattr(locks, "therock_lock", lambda d, t: real(d, t, index_url=indexes["release"].as_uri()))
    d = copy.deepcopy(data)
    track = model.therock_track_names(d)[0]
    tables: dict = {}
    changes = cli.resolve_therock(argparse.Namespace(force=False), d, tmp_path, track, tables)
    path = tmp_path / model.LOCKS_DIR / model.therock_lock_name(track)
    digest = hashlib.sha256(tables[path].encode()).hexdigest()
    therock = d["tracks"][track]["therock"]
    assert therock["lock_sha256"] == digest and "lock_sha256" not in therock["unresolved"]
    assert changes == [f"tracks.{track}.therock.lock_sha256: {digest} (docker/locks/therock-{track}.txt, 12 wheels)"]
    assert cli.resolve_therock(argparse.Namespace(force=False), d, tmp_path, track, {}) == []
    assert cli.resolve_therock(argparse.Namespace(force=True), d, tmp_path, track, {}) == []  # the same lock


def test_verify_holds_a_pinned_lock_to_its_file(data, tmp_path):
    from tools.pins import verify

    d = copy.deepcopy(data)
    track = model.therock_track_names(d)[0]
    therock = d["tracks"][track]["therock"]
    lock = tmp_path / model.LOCKS_DIR / model.therock_lock_name(track)
    therock.update(lock_sha256="a" * 64, unresolved=[])
    missing = f"{model.LOCKS_DIR}/therock-{track}.txt is missing"
    assert any(missing in e for e in verify.check_locks(d, tmp_path))
    lock.parent.mkdir(parents=True)
    body = f"x==1 --hash=sha256:{'0' * 64}\n"
    lock.write_text(body)
    assert any("the lock was edited" in e for e in verify.check_locks(d, tmp_path))
    therock["lock_sha256"] = hashlib.sha256(body.encode()).hexdigest()
    assert verify.check_locks(d, tmp_path) == []
    lock.write_text("x==1\n")  # its pin, but no hash: not a lock
    therock["lock_sha256"] = hashlib.sha256(b"x==1\n").hexdigest()
    assert any("therock-" in e and ":1: no --hash=sha256" in e for e in verify.check_locks(d, tmp_path))
