"""The AITER JIT cache directory: prebuilt modules linked in, ownership kept for the server."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocm_vllm_runtime import jitcache


@pytest.fixture
def prebuilt(tmp_path: Path) -> Path:
    d = tmp_path / "aiter" / "jit"
    d.mkdir(parents=True)
    (d / "module_mla_asm.so").write_text("")
    return d


def test_links_prebuilt_modules_and_keeps_compiled_ones(tmp_path: Path, prebuilt: Path) -> None:
    cache = tmp_path / "cache" / "aiter-0123"
    cache.mkdir(parents=True)
    (cache / "module_jit.so").write_text("compiled here")
    assert jitcache.prepare(str(cache), prebuilt) == 1
    assert (cache / "module_mla_asm.so").resolve() == prebuilt / "module_mla_asm.so"
    assert (cache / "module_jit.so").read_text() == "compiled here"


def test_as_root_what_is_created_takes_the_cache_owner(tmp_path: Path, prebuilt: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The self-tests run as root on the volume the server's user owns: a directory root
    created there would keep the server from linking and compiling into it."""
    root = tmp_path / "cache"
    root.mkdir()
    if os.geteuid() == 0:
        os.chown(root, 1000, 1000)  # the volume, owned by the server's user
    owner = (os.stat(root).st_uid, os.stat(root).st_gid)
    calls = []
    monkeypatch.setattr(jitcache.os, "geteuid", lambda: 0)
    monkeypatch.setattr(jitcache.os, "chown", lambda p, uid, gid, **kw: calls.append((Path(p), (uid, gid))))
    jitcache.prepare(str(root / "aiter-0123" / "sub"), prebuilt)
    assert calls == [(root / "aiter-0123", owner), (root / "aiter-0123" / "sub", owner),
                     (root / "aiter-0123" / "sub" / "module_mla_asm.so", owner)]


def test_not_root_nothing_is_chowned(tmp_path: Path, prebuilt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jitcache.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(jitcache.os, "chown", lambda *a, **kw: pytest.fail("chown as non-root"))
    assert jitcache.prepare(str(tmp_path / "c" / "d"), prebuilt) == 1
