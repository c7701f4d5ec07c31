"""The PyTorch lock of the rocm-image tracks (`python3 -m tools.pins resolve wheels`:
tools.pins.locks.pytorch_lock), made by the real uv against a local stand-in of the PyTorch ROCm index:
torch, torchvision and torchaudio of the pinned versions, the Triton torch requires and what they
require, each by the sha256 of that index's file, never from a PyPI stand-in offered through the
environment (same names, other bytes, newer versions); resolve writes the lock and pins its sha256,
verify holds the pin to the file; and docker/install_torch.sh installs exactly the pinned lock,
offline, from a file:// copy of the index, and refuses any other."""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from venvs import make_venv

import therock_standin as standin
from build_script_env import install_script_requirements, wheelhouse
from tools.pins import locks, model, verify

ROOT = Path(__file__).resolve().parents[1]
TRITON = ("pytorch-triton-rocm", "3.8.0+git669b31ac")
TORCH_INIT = "__version__ = {v!r}\n\n\nclass version:\n    hip = '7.2.0'\n"


def pytorch_wheels(torch: dict[str, str]) -> list[dict]:
    """The PyTorch index's wheels: torch requiring its Triton (by exact version) and filelock,
    torchvision requiring torch and numpy, torchaudio requiring torch."""
    return [
        dict(name="torch", version=torch["torch"], requires=[f"{TRITON[0]}=={TRITON[1]} ; platform_system == \"Linux\"",
                                                             "filelock"],
             files={"torch/__init__.py": TORCH_INIT.format(v=torch["torch"])}),
        dict(name="torchvision", version=torch["torchvision"], requires=[f"torch=={torch['torch']}", "numpy"]),
        dict(name="torchaudio", version=torch["torchaudio"], requires=[f"torch=={torch['torch']}"]),
        dict(name=TRITON[0], version=TRITON[1]),
        dict(name="filelock", version="3.20.0"),
        dict(name="numpy", version="2.3.5"),
    ]


def pypi_wheels(torch: dict[str, str]) -> list[dict]:
    """PyPI's same-named projects: Triton and filelock at the index's versions with other bytes,
    newer numpy and filelock, torchaudio at a version the PyTorch index lacks."""
    return [dict(name=TRITON[0], version=TRITON[1]), dict(name="filelock", version="3.20.0"),
            dict(name="filelock", version="99.0"), dict(name="numpy", version="99.0"),
            dict(name="torchaudio", version="9.9.9", requires=[f"torch=={torch['torch']}"])]


@pytest.fixture(scope="module")
def data():
    return model.load(ROOT / "versions.json")


@pytest.fixture(scope="module")
def track(data):
    return next(t for t in model.built_track_names(data) if model.pytorch_pins(data, t))


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, data, track):
    root = tmp_path_factory.mktemp("pytorch-lock")
    torch = model.section(data, "pytorch", track)["torch"]
    return {"pytorch": standin.index(root / "pytorch", "pytorch-index", pytorch_wheels(torch)),
            "pypi": standin.index(root / "pypi", "pypi", pypi_wheels(torch)), "root": root}


@pytest.fixture()
def careless(monkeypatch, indexes):
    """What a careless environment offers uv: the PyPI stand-in as an extra index and find-links."""
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", indexes["pypi"].as_uri())
    monkeypatch.setenv("UV_FIND_LINKS", str(indexes["pypi"] / "filelock"))
    monkeypatch.setenv("UV_INDEX_STRATEGY", "unsafe-best-match")


def make_lock(data, track, indexes) -> str:
    return locks.pytorch_lock(data, track, index_url=indexes["pytorch"].as_uri())


def test_the_lock_holds_the_wheels_and_their_triton_by_the_index_hash(data, track, indexes, careless):
    text = make_lock(data, track, indexes)
    reqs = standin.lock_requirements(text)
    torch = model.section(data, "pytorch", track)["torch"]
    assert set(reqs) == {"torch", "torchvision", "torchaudio", TRITON[0], "filelock", "numpy"}, text
    for name, (version, hashes) in reqs.items():
        assert hashes == [standin.sha256_of(indexes["pytorch"], name, version)], name
    assert {name: reqs[name][0] for name in model.TORCH_WHEELS} == torch
    assert reqs[TRITON[0]][0] == TRITON[1]  # whatever torch requires: no hand pin
    assert reqs["filelock"][0] == "3.20.0" and reqs["numpy"][0] == "2.3.5"  # never PyPI's newer ones
    assert "pytorch.lock_sha256" in text and "`python3 -m tools.pins resolve wheels`" in text
    assert locks.body_problem("pytorch", text) == ""
    # the tracks sharing the section share the lock: the same bytes, made from any of them
    sharing = [t for t in model.built_track_names(data)
               if model.pytorch_pins(data, t) and model.pytorch_lock_name(data, t) == "pytorch.txt"]
    assert {make_lock(data, t, indexes) for t in sharing} == {text}


def test_a_version_the_index_lacks_is_not_taken_from_pypi(data, track, indexes, careless):
    d = copy.deepcopy(data)
    model.section(d, "pytorch", track)["torch"]["torchaudio"] = "9.9.9"
    with pytest.raises(model.PinError, match="PyTorch lock of pytorch .*uv pip compile failed"):
        make_lock(d, track, indexes)


def test_resolve_wheels_writes_the_lock_and_pins_its_sha256(data, track, indexes, monkeypatch, tmp_path):
    """resolve's wheels item: the lock goes to docker/locks/pytorch.txt (a track's own section:
    pytorch-<track>.txt) and its sha256 to that section's lock_sha256 (out of unresolved); a pinned
    lock is kept unless --force."""
    from tools.pins import __main__ as cli

    real = locks.pytorch_lock
    monkeypatch.setattr(locks, "pytorch_lock", lambda d, t: real(d, t, index_url=indexes["pytorch"].as_uri()))
    d = copy.deepcopy(data)
    tables: dict = {}
    changes = cli.resolve_pytorch(argparse.Namespace(force=False), d, tmp_path, track, tables)
    path = tmp_path / model.LOCKS_DIR / "pytorch.txt"
    digest = hashlib.sha256(tables[path].encode()).hexdigest()
    assert d["pytorch"]["lock_sha256"] == digest and "lock_sha256" not in d["pytorch"]["unresolved"]
    assert changes == [f"pytorch.lock_sha256: {digest} (docker/locks/pytorch.txt, 6 wheels)"]
    assert cli.resolve_pytorch(argparse.Namespace(force=False), d, tmp_path, track, {}) == []
    assert cli.resolve_pytorch(argparse.Namespace(force=True), d, tmp_path, track, {}) == []  # the same lock
    # a track's own pytorch section: its own lock, named after it
    d = copy.deepcopy(data)
    d["tracks"][track]["pytorch"] = copy.deepcopy(data["pytorch"])
    tables = {}
    changes = cli.resolve_pytorch(argparse.Namespace(force=False), d, tmp_path, track, tables)
    (path, text), = tables.items()
    assert path.name == f"pytorch-{track}.txt" and changes[0].startswith(f"tracks.{track}.pytorch.lock_sha256: ")
    assert d["tracks"][track]["pytorch"]["lock_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert d["pytorch"]["lock_sha256"] is None
    assert f"resolve wheels --track {track}`" in text and f"tracks.{track}.pytorch.lock_sha256" in text


def test_verify_holds_a_pinned_lock_to_its_file(data, tmp_path):
    d = copy.deepcopy(data)
    d["pytorch"].update(lock_sha256="a" * 64, unresolved=[])
    lock = tmp_path / model.LOCKS_DIR / "pytorch.txt"
    assert any("pytorch.lock_sha256 is set but docker/locks/pytorch.txt is missing: run python3 -m tools.pins resolve "
               "wheels --force --write" in e for e in verify.check_locks(d, tmp_path))
    lock.parent.mkdir(parents=True)
    body = f"x==1 \\\n    --hash=sha256:{'0' * 64}\n"
    lock.write_text(body)
    assert any("docker/locks/pytorch.txt has sha256" in e and "the lock was edited" in e
               for e in verify.check_locks(d, tmp_path))
    d["pytorch"]["lock_sha256"] = hashlib.sha256(body.encode()).hexdigest()
    assert verify.check_locks(d, tmp_path) == []
    # its sha256 pinned is not enough: a body that is not a hash lock is refused all the same
    lock.write_text("x==1\n")
    d["pytorch"]["lock_sha256"] = hashlib.sha256(b"x==1\n").hexdigest()
    assert any("no --hash=sha256: entry" in e for e in verify.check_locks(d, tmp_path))


# ------------------------------------------------------------------ install_torch.sh


@pytest.fixture(scope="module")
def lock_text(data, track, indexes):
    return make_lock(data, track, indexes)


@pytest.fixture()
def venv(tmp_path, tmp_path_factory):
    """A fresh environment as the torch stage starts from: Python, pip and the scripts' packaging."""
    env = tmp_path / "venv"
    make_venv(env)
    install_script_requirements(env / "bin/python", wheelhouse(tmp_path_factory))
    return env


def install_torch(venv: Path, indexes, pins: dict, lock_text: str | None, allow: str = "0"):
    """install_torch.sh LOCKS_DIR file://INDEX with the PyTorch build args pins, in a careless environment
    (pip offered the PyPI stand-in as an extra index and a wheel folder)."""
    locks_dir = venv.parent / "locks"
    locks_dir.mkdir(exist_ok=True)
    if lock_text is not None:
        (locks_dir / pins["PYTORCH_LOCK"]).write_text(lock_text)
    env = {"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "HOME": str(venv.parent), **pins,
           "ALLOW_UNRESOLVED": allow, "ROCM_VLLM_CA_BUNDLE": str(venv.parent / "no-bundle"),
           "PIP_EXTRA_INDEX_URL": indexes["pypi"].as_uri(), "PIP_FIND_LINKS": str(indexes["pypi"] / "filelock")}
    return subprocess.run(["bash", ROOT / "docker/install_torch.sh", locks_dir, indexes["pytorch"].as_uri()],
                          env=env, capture_output=True, text=True, timeout=600)


def pins_of(data, track, **change) -> dict:
    """The track's PyTorch build args, with changes (lock_sha256: PYTORCH_LOCK_SHA256)."""
    args = model.build_args(data, track_name_=track)
    pins = {k: args[k] for k in ("PYTORCH_INDEX_URL", "PYTORCH_LOCK", "PYTORCH_LOCK_SHA256", "TORCH_VERSION",
                                 "TORCHVISION_VERSION", "TORCHAUDIO_VERSION")}
    return {**pins, **{f"PYTORCH_{k.upper()}": v for k, v in change.items()}}


def installed(venv: Path) -> dict[str, str]:
    """name -> the index each installed stand-in came from."""
    site = next((venv / "lib").glob("python*/site-packages"))
    return {p.name.removesuffix("_origin.txt"): p.read_text() for p in site.glob("*_origin.txt")}


def test_only_the_pinned_lock_is_installed(data, track, indexes, lock_text, venv):
    digest = hashlib.sha256(lock_text.encode()).hexdigest()
    # a lock that is not the pinned one (edited, another section's): refused before anything is installed
    proc = install_torch(venv, indexes, pins_of(data, track, lock_sha256="1" * 64), lock_text)
    assert proc.returncode == 1 and f"not the pinned {'1' * 64}" in proc.stderr, proc.stderr[-2000:]
    # an unresolved lock: one line naming the command that makes it (ALLOW_UNRESOLVED unset)
    proc = install_torch(venv, indexes, pins_of(data, track), lock_text)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("install_torch: ERROR: "), \
        proc.stderr
    assert "python3 -m tools.pins resolve wheels --write" in proc.stderr and "ALLOW_UNRESOLVED=1" in proc.stderr
    # a lock made from other versions than the pinned ones
    other = pins_of(data, track, lock_sha256=digest)
    other["TORCHAUDIO_VERSION"] = "2.11.1+rocm7.2"
    proc = install_torch(venv, indexes, other, lock_text)
    assert proc.returncode == 1 and "holds no torchaudio==2.11.1+rocm7.2" in proc.stderr, proc.stderr[-2000:]
    assert installed(venv).get("torch") in (None, "pytorch-index")


def test_the_pinned_lock_installs_offline_by_hash(data, track, indexes, lock_text, venv):
    digest = hashlib.sha256(lock_text.encode()).hexdigest()
    proc = install_torch(venv, indexes, pins_of(data, track, lock_sha256=digest), lock_text)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert installed(venv) == dict.fromkeys(
        ["torch", "torchvision", "torchaudio", "pytorch_triton_rocm", "filelock", "numpy"], "pytorch-index")
    py = venv / "bin/python"
    versions = subprocess.run([py, "-c", "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) "
                               "for n in ('torch', 'triton', 'pytorch-triton-rocm', 'filelock')}))"],
                              capture_output=True, text=True, check=True).stdout
    torch = model.section(data, "pytorch", track)["torch"]["torch"]
    # torch's Triton is the lock's, with the `triton` alias beside it; nothing else replaced them
    assert json.loads(versions) == {"torch": torch, "triton": TRITON[1], "pytorch-triton-rocm": TRITON[1],
                                    "filelock": "3.20.0"}
    assert f"torch {torch} hip 7.2.0" in proc.stdout
    assert subprocess.run([py, "-m", "pip", "check"], capture_output=True).returncode == 0


def test_an_unresolved_lock_installs_only_for_a_development_image(data, track, indexes, venv):
    proc = install_torch(venv, indexes, pins_of(data, track), None, allow="1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "WARNING: PyTorch lock unresolved" in proc.stderr and "without hash checks" in proc.stderr
    # the index alone, even unlocked: PyPI's newer filelock and numpy are not taken
    assert set(installed(venv).values()) == {"pytorch-index"}
