"""Paths built from data (a versions.json tag, a file name PyPI lists) go through the one join that
stays inside its root (rocm_vllm_runtime.files.inside): a value that would leave it is one line
naming what to fix, and nothing is read or written outside."""
from __future__ import annotations

import io
import tarfile
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
    with tarfile.open(path, "w:gz") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


def _unpackers():
    """Every entry point that unpacks an sdist: the lock's requirements/ tree and the whole tree the
    tests read (tests/vllm_sdist.py), both through tools.pins.discover.unpack."""
    from tools.pins import locks  # noqa: PLC0415

    return {"lock's requirements": locks._sdist_tree, "whole sdist": discover.unpack}


@pytest.mark.parametrize("unpacker", ["lock's requirements", "whole sdist"])
@pytest.mark.parametrize("member", ["vllm-9.9/requirements/../../../../escape.txt",
                                    "vllm-9.9/requirements/a/../../../../../escape.txt",
                                    "vllm-9.9/requirements/../escape.txt", "vllm-9.9/requirements//escape.txt",
                                    "vllm-9.9/requirements/./escape.txt"])
def test_an_sdist_member_cannot_leave_the_folder_it_is_unpacked_into(tmp_path, member, unpacker):
    """Each member's path is joined name by name through files.inside, and one that is no path
    inside the folder stops the unpacking in one line, whatever tarfile's own filters allow."""
    archive = _sdist(tmp_path / "vllm-9.9.tar.gz", {"vllm-9.9/requirements/common.txt": b"numpy\n",
                                                    member: b"escaped\n"})
    dest = tmp_path / "w" / "x" / "y" / "z" / "src"
    with pytest.raises(model.PinError) as err:
        _unpackers()[unpacker](archive, dest)
    assert "vllm-9.9.tar.gz" in str(err.value) and "\n" not in str(err.value)
    assert not [p for p in tmp_path.rglob("escape.txt")]


@pytest.mark.parametrize("unpacker", ["lock's requirements", "whole sdist"])
@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE])
def test_an_sdist_member_that_is_no_file_or_folder_stops_the_unpacking(tmp_path, kind, unpacker):
    """A link (even one pointing inside), a FIFO or a device is refused in one line, nothing made."""
    archive = tmp_path / "vllm-9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("vllm-9.9/requirements/common.txt")
        info.type, info.linkname = kind, "/etc/passwd" if kind == tarfile.SYMTYPE else "vllm-9.9/setup.py"
        tar.addfile(info)
    dest = tmp_path / "src"
    with pytest.raises(model.PinError) as err:
        _unpackers()[unpacker](archive, dest)
    assert "neither a file nor a folder" in str(err.value) and "\n" not in str(err.value)
    assert not (dest / "requirements" / "common.txt").exists()


def test_the_whole_sdist_is_unpacked_below_its_top_folder_with_plain_modes(tmp_path):
    archive = tmp_path / "vllm-9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, mode, body in (("vllm-9.9/setup.py", 0o4775, b"#"), ("vllm-9.9/vllm/__init__.py", 0o666, b""),
                                 ("vllm-9.9/empty", 0o700, None)):
            info = tarfile.TarInfo(name)
            info.mode = mode
            if body is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    dest = discover.unpack(archive, tmp_path / "src")
    modes = {p.relative_to(dest).as_posix(): oct(p.stat().st_mode & 0o7777) for p in dest.rglob("*") if p.is_file()}
    assert modes == {"setup.py": "0o755", "vllm/__init__.py": "0o644"}
    assert (dest / "empty").is_dir()


def test_an_sdist_s_requirements_are_unpacked_inside_the_scratch_folder(tmp_path):
    from tools.pins import locks  # noqa: PLC0415

    archive = _sdist(tmp_path / "vllm-9.9.tar.gz", {"vllm-9.9/requirements/common.txt": b"numpy\n",
                                                    "vllm-9.9/requirements/sub/rocm.txt": b"-r ../common.txt\n",
                                                    "vllm-9.9/setup.py": b""})
    dest = locks._sdist_tree(archive, tmp_path / "src")
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.txt")) == [
        "requirements/common.txt", "requirements/sub/rocm.txt"]


@pytest.mark.parametrize("planted", ["link to a folder outside", "link to a file outside", "fifo"])
def test_an_sdist_unpacked_over_a_kept_tree_never_writes_through_what_is_planted_there(tmp_path, planted):
    """A tree unpacked before (the tests' sdist cache) may hold what somebody put there: a symbolic
    link on a member's path is refused (it could lead outside), and a FIFO where a file goes is refused
    rather than waited on; one line, nothing written outside."""
    import os  # noqa: PLC0415

    archive = _sdist(tmp_path / "vllm-9.9.tar.gz", {"vllm-9.9/requirements/common.txt": b"numpy\n"})
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "src"
    (dest / "requirements").mkdir(parents=True)
    if planted == "link to a folder outside":
        (dest / "requirements").rmdir()
        (dest / "requirements").symlink_to(outside)
    elif planted == "link to a file outside":
        (dest / "requirements" / "common.txt").symlink_to(outside / "common.txt")
    else:
        os.mkfifo(dest / "requirements" / "common.txt")
    with pytest.raises(model.PinError) as err:
        discover.unpack(archive, dest)
    assert "vllm-9.9.tar.gz" in str(err.value) and "\n" not in str(err.value)
    assert list(outside.iterdir()) == []
