"""The hash lock of AITER's own requirements (requirements.txt of the pinned commit): made by the
real uv (tools.pins.locks.aiter_lock, through `resolve aiter`) against a stand-in of PyPI on 127.0.0.1
for the images' platform and Python, with the base image's distributions (torch, Triton: a
same-named torch and Triton on the index) bounding the resolution and left out of the lock, only
releases uploaded before locks.json exclude_newer; resolve writes docker/locks/aiter-<tag>.txt and pins
its sha256 (a commit without requirements.txt pins "none"); verify holds the pin to the file; and
docker/aiter_requirements.sh (build_aiter.sh's requirement step) refuses an unpinned lock, a lock
made from another requirements.txt or a pin that disagrees with the source, and installs the pinned
lock offline, every wheel by its sha256."""
from __future__ import annotations

import argparse
import copy
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from venvs import make_venv

import pypi_standin
import therock_standin
from git_repo import commit_all, git, new_repo
from tools.pins import locks, model, verify

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docker/aiter_requirements.sh"
REQUIREMENTS = "flydsl>=0.1\neinops\n"


@pytest.fixture(scope="module")
def data():
    return model.load(ROOT / "versions.json")


@pytest.fixture(scope="module")
def pin(data):
    """The default track's AITER pin (the one that needs FlyDSL)."""
    return data["tracks"][data["default_track"]]["aiter"]


@pytest.fixture(scope="module")
def pypi(tmp_path_factory, data):
    """PyPI's stand-in: flydsl requiring numpy, torch and triton; einops; numpy, and a newer numpy
    uploaded after exclude_newer; torch and triton of the base image's versions (the lock must leave
    them out)."""
    folder = tmp_path_factory.mktemp("pypi-wheels")
    torch = locks.base_image_versions(data, data["default_track"])["torch"]
    for name, version, requires in (("flydsl", "0.1.2", ["numpy>=2", f"torch>={torch}", "triton"]),
                                    ("einops", "0.8.1", []), ("numpy", "2.3.5", []), ("numpy", "99.0", []),
                                    ("torch", torch, ["triton", "filelock"]), ("filelock", "3.20.0", []),
                                    ("triton", "3.8.0", [])):
        therock_standin.wheel(folder, name, version, "pypi-standin", requires=requires)
    server = pypi_standin.serve(folder, late=("numpy-99.0-py3-none-any.whl",))
    yield {"url": f"http://127.0.0.1:{server.server_port}/simple", "folder": folder,
           "mirror": pypi_standin.file_index(folder, tmp_path_factory.mktemp("pypi-mirror"))}
    server.shutdown()


def source(tmp_path: Path, text: str = REQUIREMENTS) -> Path:
    src = tmp_path / "aiter-src"
    src.mkdir(exist_ok=True)
    (src / "requirements.txt").write_text(text)
    return src


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def lock_text(data, pin, pypi, tmp_path_factory):
    return locks.aiter_lock(data, pin, source(tmp_path_factory.mktemp("src")), ROOT, index_url=pypi["url"])


def test_the_lock_holds_the_requirements_by_hash_and_leaves_the_base_images_out(data, pin, pypi, lock_text,
                                                                                tmp_path):
    reqs = therock_standin.lock_requirements(lock_text)
    # torch and triton are the base image's (and filelock only torch needs): never in the lock
    assert set(reqs) == {"flydsl", "einops", "numpy"}, lock_text
    assert reqs["numpy"][0] == "2.3.5"  # uploaded after exclude_newer: not taken
    for name, (version, hashes) in reqs.items():
        assert hashes == [sha256(pypi["folder"] / f"{name}-{version}-py3-none-any.whl")], name
    assert f"# input requirements.txt sha256:{sha256(source(tmp_path) / 'requirements.txt')}\n" in lock_text
    assert f"`python3 -m tools.pins resolve aiter --aiter-pin {pin} --write`" in lock_text
    assert "--only-binary :all:" in lock_text and "Left out (the base image provides them): torch" in lock_text
    assert locks.body_problem("aiter", lock_text) == ""


def test_a_requirement_the_base_image_holds_at_another_version_does_not_resolve(data, pin, pypi, tmp_path):
    with pytest.raises(model.PinError, match="lock aiter-.*uv pip compile failed"):
        locks.aiter_lock(data, pin, source(tmp_path, "flydsl\ntorch==0.1\n"), ROOT, index_url=pypi["url"])


def test_a_requirements_file_that_includes_another_is_refused(data, pin, tmp_path):
    with pytest.raises(model.PinError, match="includes other files"):
        locks.aiter_lock(data, pin, source(tmp_path, "-r other.txt\n"), ROOT, index_url="https://pypi.org/simple")


def test_resolve_aiter_writes_the_lock_and_pins_its_sha256(data, pin, pypi, monkeypatch, tmp_path):
    """resolve aiter's lock step: requirements.txt read at the pin's commit (git), the lock into
    docker/locks/aiter-<tag>.txt and its sha256 into requirements_lock_sha256 (out of unresolved); a
    pinned lock is kept unless --force; a commit without requirements.txt pins "none"; a pin without
    a commit stays unresolved."""
    from tools.pins import __main__ as cli

    repo = new_repo(tmp_path / "aiter")
    (repo / "setup.py").write_text("\n")
    bare = commit_all(repo, "no requirements")
    (repo / "requirements.txt").write_text(REQUIREMENTS)
    commit_all(repo, "requirements")
    real = locks.aiter_lock
    monkeypatch.setattr(locks, "aiter_lock", lambda d, n, s, r: real(d, n, s, ROOT, index_url=pypi["url"]))
    d = copy.deepcopy(data)
    d["aiter"]["repository"] = repo.as_uri()
    node = d["aiter"]["pins"][pin]
    assert cli.resolve_aiter_lock(argparse.Namespace(force=False), d, tmp_path, pin, {}) == []  # no commit yet
    node["commit"] = git("rev-parse", "HEAD", cwd=repo)
    node["unresolved"].remove("commit")
    lock_texts: dict = {}
    changes = cli.resolve_aiter_lock(argparse.Namespace(force=False), d, tmp_path, pin, lock_texts)
    (path, text), = lock_texts.items()
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert path == tmp_path / model.LOCKS_DIR / f"aiter-{node['tag']}.txt"
    assert node["requirements_lock_sha256"] == digest and "requirements_lock_sha256" not in node["unresolved"]
    assert changes == [f"aiter.pins.{pin}.requirements_lock_sha256: {digest} (docker/locks/{path.name}, 3 wheels)"]
    assert f"# input requirements.txt sha256:{hashlib.sha256(REQUIREMENTS.encode()).hexdigest()}" in text
    assert cli.resolve_aiter_lock(argparse.Namespace(force=False), d, tmp_path, pin, {}) == []
    assert cli.resolve_aiter_lock(argparse.Namespace(force=True), d, tmp_path, pin, {}) == []  # the same lock
    # a commit without requirements.txt: "none", no lock
    node.update(commit=bare, requirements_lock_sha256=None,
                unresolved=["ck_commit", "hipkittens_commit", "requirements_lock_sha256"])
    lock_texts = {}
    changes = cli.resolve_aiter_lock(argparse.Namespace(force=False), d, tmp_path, pin, lock_texts)
    assert lock_texts == {} and node["requirements_lock_sha256"] == "none"
    assert node["unresolved"] == ["ck_commit", "hipkittens_commit"]
    assert changes == [f"aiter.pins.{pin}.requirements_lock_sha256: none ({bare[:12]} has no requirements.txt)"]
    assert verify.check_schema(d) == [] and verify.check_locks(d, tmp_path) == []


def test_verify_holds_a_pinned_lock_to_its_file_and_the_field_to_its_schema(data, pin, tmp_path):
    d = copy.deepcopy(data)
    node = d["aiter"]["pins"][pin]
    node.update(commit="c" * 40, requirements_lock_sha256="a" * 64, unresolved=["ck_commit", "hipkittens_commit"])
    name = f"docker/locks/aiter-{node['tag']}.txt"
    assert any(f"aiter.pins.{pin}.requirements_lock_sha256 is set but {name} is missing: run python3 -m tools.pins "
               f"resolve aiter --aiter-pin {pin} --force --write" in e for e in verify.check_locks(d, tmp_path))
    lock = tmp_path / name
    lock.parent.mkdir(parents=True)
    body = f"x==1 --hash=sha256:{'0' * 64}\n"
    lock.write_text(body)
    assert any(f"{name} has sha256" in e and "the lock was edited" in e for e in verify.check_locks(d, tmp_path))
    node["requirements_lock_sha256"] = hashlib.sha256(body.encode()).hexdigest()
    assert verify.check_locks(d, tmp_path) == []
    assert verify.check_schema(d) == []
    for bad in ("bogus", "A" * 64, "None"):
        node["requirements_lock_sha256"] = bad
        wanted = f"aiter.pins.{pin}.requirements_lock_sha256: must be the sha256"
        assert [e for e in verify.check_schema(d) if wanted in e], bad
    node.update(commit=None, requirements_lock_sha256="none", unresolved=["commit", "ck_commit", "hipkittens_commit"])
    assert any("requirements_lock_sha256 is set but commit is not" in e for e in verify.check_schema(d))
    del node["requirements_lock_sha256"]
    assert any(f"aiter.pins.{pin}.requirements_lock_sha256" in e for e in verify.check_schema(d))


# ------------------------------------------------------------------ aiter_requirements.sh


@pytest.fixture()
def venv(tmp_path):
    """A fresh environment as the aiter-wheel stage's Python, without AITER's requirements."""
    env = tmp_path / "venv"
    make_venv(env)
    return env


def run_step(venv: Path, pypi, src: Path, pins: dict, lock_text: str | None, allow: str = "0"):
    """aiter_requirements.sh SRC LOCKS_DIR CONSTRAINTS with the AITER build args pins, installing from the
    file:// copy of the stand-in (PYPI_INDEX_URL), in a careless environment (pip offered the
    stand-in as an index)."""
    locks_dir = src.parent / "locks"
    locks_dir.mkdir(exist_ok=True)
    if lock_text is not None:
        (locks_dir / pins["AITER_REQUIREMENTS_LOCK"]).write_text(lock_text)
    constraints = src.parent / "constraints.txt"
    constraints.write_text("numpy==2.3.5\n")
    env = {"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "HOME": str(src.parent), **pins,
           "ALLOW_UNRESOLVED": allow, "PYPI_INDEX_URL": pypi["mirror"], "PIP_INDEX_URL": pypi["mirror"],
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(["bash", SCRIPT, src, locks_dir, constraints], env=env, capture_output=True, text=True,
                          timeout=600)


def pins_of(data, **change) -> dict:
    """The default track's AITER build args, with changes (requirements_lock_sha256: AITER_REQUIREMENTS_LOCK_SHA256)."""
    args = {k: v for k, v in model.build_args(data).items() if k.startswith("AITER_")}
    return {**args, **{f"AITER_{k.upper()}": v for k, v in change.items()}}


def installed(venv: Path) -> set[str]:
    site = next((venv / "lib").glob("python*/site-packages"))
    return {p.name.removesuffix("_origin.txt") for p in site.glob("*_origin.txt")}


def last_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines and lines[-1].startswith("aiter_requirements: ERROR: "), proc.stderr
    return lines[-1]


def test_an_unpinned_lock_stops_unless_a_development_image(data, pypi, lock_text, venv, tmp_path):
    src = source(tmp_path)
    line = last_error(run_step(venv, pypi, src, pins_of(data), lock_text))
    assert "python3 -m tools.pins resolve aiter --write" in line and "ALLOW_UNRESOLVED=1" in line
    assert installed(venv) == set()


def test_a_lock_of_another_requirements_file_or_pin_is_refused(data, pypi, lock_text, venv, tmp_path):
    digest = hashlib.sha256(lock_text.encode()).hexdigest()
    other = source(tmp_path, "flydsl\n")
    line = last_error(run_step(venv, pypi, other, pins_of(data, requirements_lock_sha256=digest), lock_text))
    assert "the lock was made from another commit" in line and "resolve aiter" in line
    # not the pinned lock: install_lock.sh refuses it
    proc = run_step(venv, pypi, source(tmp_path), pins_of(data, requirements_lock_sha256="1" * 64), lock_text)
    assert proc.returncode == 1 and f"not the pinned {'1' * 64}" in proc.stderr, proc.stderr
    # a pin of "no requirements.txt" for a source that has one, and the reverse
    line = last_error(run_step(venv, pypi, source(tmp_path), pins_of(data, requirements_lock_sha256="none"), None))
    assert 'pins none (requirements_lock_sha256 "none")' in line
    (tmp_path / "aiter-src/requirements.txt").unlink()
    line = last_error(run_step(venv, pypi, tmp_path / "aiter-src", pins_of(data, requirements_lock_sha256=digest),
                               lock_text))
    assert "has no requirements.txt, but versions.json pins a lock" in line
    proc = run_step(venv, pypi, tmp_path / "aiter-src", pins_of(data, requirements_lock_sha256="none"), None)
    assert proc.returncode == 0 and "nothing to install" in proc.stdout, proc.stderr
    assert installed(venv) == set()


def test_the_pinned_lock_installs_offline_by_hash(data, pypi, lock_text, venv, tmp_path):
    digest = hashlib.sha256(lock_text.encode()).hexdigest()
    proc = run_step(venv, pypi, source(tmp_path), pins_of(data, requirements_lock_sha256=digest), lock_text)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert installed(venv) == {"flydsl", "einops", "numpy"}  # never torch or triton


def test_unresolved_with_allow_installs_unhashed_under_the_constraints(data, pypi, venv, tmp_path):
    proc = run_step(venv, pypi, source(tmp_path, "einops\n"), pins_of(data), None, allow="1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "WARNING: AITER" in proc.stderr and "without hash checks" in proc.stderr
    assert "einops" in installed(venv)
