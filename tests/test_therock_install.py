"""docker/install_lock.sh against local indexes of stand-in wheels with TheRock's names: the
release index's wheels are installed by their hashes; a same-named wheel on another index (a PyPI
stand-in, offered through PIP_EXTRA_INDEX_URL and PIP_FIND_LINKS as a careless environment would) is
never taken, even at the same version; a wrong hash, a wheel only the other index has, an http://
index, a missing lock and a lock other than the one versions.json pins (its sha256) are refused."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
from venvs import make_venv

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docker/install_lock.sh"
# TheRock's wheels as vLLM 0.34's base installs them (names and versions of the stand-ins)
WHEELS = {"rocm": "10.0.0", "rocm-sdk-core": "10.0.0", "rocm-sdk-device-gfx942": "10.0.0", "torch": "2.13.0+rocm10.0.0"}


def wheel(folder: Path, name: str, version: str, origin: str) -> Path:
    """A wheel holding NAME VERSION's metadata and a file saying where it came from."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{dist}_origin.txt": origin}
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{m},,\n" for m in [*files, f"{info}/RECORD"]))
    return path


def index(root: Path, origin: str, wheels: dict[str, str]) -> Path:
    """A PEP 503 simple index (one page per project, links with their sha256) of stand-in wheels."""
    simple = root / "simple"
    for name, version in wheels.items():
        project = simple / name
        project.mkdir(parents=True)
        path = wheel(project, name, version, origin)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        (project / "index.html").write_text(f'<a href="{path.name}#sha256={digest}">{path.name}</a>\n')
    return simple


def sha(simple: Path, name: str) -> str:
    return hashlib.sha256(next((simple / name).glob("*.whl")).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    root = tmp_path_factory.mktemp("therock")
    release = index(root / "release", "release", WHEELS)
    # PyPI's same-named projects: the same versions with other bytes, newer ones, one the release lacks
    other = index(root / "pypi", "pypi", {**WHEELS, "rocm-sdk-devel": "10.0.0"})
    index(root / "pypi-newer", "pypi", {name: "99.0" for name in WHEELS})
    venv = root / "venv"
    make_venv(venv)
    return {"release": release, "pypi": other, "pypi-newer": root / "pypi-newer/simple", "root": root,
            "python": venv / "bin/python"}


def install(indexes, lock_lines: list[str], index_url: str | None = None,
            pinned: str | None = None) -> subprocess.CompletedProcess:
    """The script on a lock of these lines, pinned by its own sha256 unless `pinned` says otherwise."""
    lock = indexes["root"] / "lock.txt"
    lock.write_text("".join(f"{line}\n" for line in lock_lines))
    env = {**os.environ, "PYTHON": str(indexes["python"]),
           # what a careless environment offers: PyPI stand-ins as an extra index and a wheel folder
           "PIP_EXTRA_INDEX_URL": indexes["pypi"].as_uri(), "PIP_FIND_LINKS": str(indexes["pypi-newer"] / "torch")}
    pin = hashlib.sha256(lock.read_bytes()).hexdigest() if pinned is None else pinned
    return subprocess.run(["bash", SCRIPT, lock, index_url or indexes["release"].as_uri(), pin], env=env,
                          capture_output=True, text=True, timeout=300)


def lock_of(indexes, names=WHEELS) -> list[str]:
    return [f"{name}=={WHEELS.get(name, '10.0.0')} --hash=sha256:{sha(indexes['release'], name)}" for name in names]


def origins(indexes) -> dict[str, str]:
    site = next((indexes["root"] / "venv/lib").glob("python*/site-packages"))
    return {p.name.removesuffix("_origin.txt"): p.read_text() for p in site.glob("*_origin.txt")}


def test_refusals_come_before_any_install(indexes):
    # a wrong hash: pip refuses the wheel
    wrong = [*lock_of(indexes, ["rocm"]), f"torch=={WHEELS['torch']} --hash=sha256:{'0' * 64}"]
    proc = install(indexes, wrong)
    assert proc.returncode != 0 and "DO NOT MATCH THE HASHES" in proc.stderr, proc.stderr[-2000:]
    # a wheel only the PyPI stand-in has, at the hash PyPI's would have: not found, never taken from there
    devel = f"rocm-sdk-devel==10.0.0 --hash=sha256:{sha(indexes['pypi'], 'rocm-sdk-devel')}"
    proc = install(indexes, devel.splitlines())
    assert proc.returncode != 0 and "No matching distribution found for rocm-sdk-devel" in proc.stderr, proc.stderr
    # the PyPI stand-in's own bytes for a release wheel's name and version: refused as well
    confused = f"rocm-sdk-core==10.0.0 --hash=sha256:{sha(indexes['pypi'], 'rocm-sdk-core')}"
    proc = install(indexes, confused.splitlines())
    assert proc.returncode != 0 and "DO NOT MATCH THE HASHES" in proc.stderr, proc.stderr[-2000:]
    # an index that is not https:// (or a local file://), a missing lock
    proc = install(indexes, lock_of(indexes), index_url="http://127.0.0.1:9/simple")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "install_lock: ERROR: INDEX_URL (http:...) is not an https:// (or local file://) index"]
    proc = subprocess.run(["bash", SCRIPT, indexes["root"] / "none.txt", indexes["release"].as_uri(), "0" * 64],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "no lock at" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    # a lock that is not the one versions.json pins (edited, or another track's), an unresolved pin
    proc = install(indexes, lock_of(indexes), pinned="1" * 64)
    assert proc.returncode == 1 and f"not the pinned {'1' * 64}" in proc.stderr, proc.stderr
    proc = install(indexes, lock_of(indexes), pinned="UNRESOLVED")
    assert proc.returncode == 1 and "is not a sha256 (unresolved?" in proc.stderr, proc.stderr
    proc = subprocess.run(["bash", SCRIPT, indexes["root"] / "lock.txt", indexes["release"].as_uri()],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "usage: install_lock.sh LOCK INDEX_URL LOCK_SHA256" in proc.stderr
    assert origins(indexes) == {}


def test_the_release_index_alone_is_installed_by_hash(indexes):
    proc = install(indexes, lock_of(indexes))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    dists = {re.sub(r"[-_.]+", "_", name) for name in WHEELS}
    assert origins(indexes) == dict.fromkeys(dists, "release")
