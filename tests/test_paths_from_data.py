"""Paths built from data (a versions.json tag, a file name PyPI lists) go through the one join that
stays inside its root (rocm_vllm_runtime.files.inside): a value that would leave it is one line
naming what to fix, and nothing is read or written outside."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.pins import discover, model


@pytest.mark.parametrize("tag", ["../../../outside", "v1/../../x", "/etc/x", ""])
def test_a_versions_json_tag_cannot_name_a_lock_file_outside_its_folder(tag):
    with pytest.raises(model.PinError) as err:
        model.aiter_lock_name(tag)
    assert "tag" in str(err.value) and "versions.json" in str(err.value) and "\n" not in str(err.value)


def test_a_plain_tag_names_its_lock_file():
    assert model.aiter_lock_name("v0.1.10.post2") == "aiter-v0.1.10.post2.txt"


@pytest.mark.parametrize("filename", ["../escaped.tar.gz", "a/b.tar.gz", "..", ""])
def test_a_file_name_from_pypi_cannot_leave_the_sdist_cache(tmp_path, filename, monkeypatch):
    fetched = []
    monkeypatch.setattr(discover.resolve, "_http", lambda *a, **k: fetched.append(a))
    cache = tmp_path / "cache"
    sdist = discover.Sdist("0.99.0", "https://files.example/x.tar.gz", "0" * 64, filename)
    with pytest.raises(model.PinError) as err:
        discover.fetch(sdist, cache)
    assert "file name" in str(err.value) and "\n" not in str(err.value)
    assert fetched == []
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) in ([], ["cache"])
    assert not Path(tmp_path / "escaped.tar.gz.part").exists()


def _sdist(path: Path, members: dict[str, bytes]) -> Path:
    import io  # noqa: PLC0415
    import tarfile  # noqa: PLC0415

    with tarfile.open(path, "w:gz") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


@pytest.mark.parametrize("member", ["vllm-9.9/requirements/../../../../escape.txt",
                                    "vllm-9.9/requirements/a/../../../../../escape.txt",
                                    "vllm-9.9/requirements/../escape.txt", "vllm-9.9/requirements//escape.txt",
                                    "vllm-9.9/requirements/./escape.txt"])
def test_an_sdist_member_cannot_leave_the_lock_s_scratch_folder(tmp_path, member):
    """tools.pins lock unpacks the sdist's requirements/ into a scratch folder: every member's path is
    joined name by name through files.inside, and one that is no path inside it stops the lock in one line."""
    from tools.pins import locks  # noqa: PLC0415

    archive = _sdist(tmp_path / "vllm-9.9.tar.gz", {"vllm-9.9/requirements/common.txt": b"numpy\n",
                                                    member: b"escaped\n"})
    dest = tmp_path / "w" / "x" / "y" / "z" / "src"
    with pytest.raises(model.PinError) as err:
        locks._sdist_tree(archive, dest)
    assert "vllm-9.9.tar.gz" in str(err.value) and "\n" not in str(err.value)
    assert not [p for p in tmp_path.rglob("escape.txt")]


def test_an_sdist_s_requirements_are_unpacked_inside_the_scratch_folder(tmp_path):
    from tools.pins import locks  # noqa: PLC0415

    archive = _sdist(tmp_path / "vllm-9.9.tar.gz", {"vllm-9.9/requirements/common.txt": b"numpy\n",
                                                    "vllm-9.9/requirements/sub/rocm.txt": b"-r ../common.txt\n",
                                                    "vllm-9.9/setup.py": b""})
    dest = locks._sdist_tree(archive, tmp_path / "src")
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.txt")) == [
        "requirements/common.txt", "requirements/sub/rocm.txt"]
