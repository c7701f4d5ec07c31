"""docker/aiter_calls.py: the AITER functions each track's vLLM calls (read from its released
source) and the check that an AITER source tree has them, which stops the vLLM build (stage
vllm-built) when the base image's AITER lacks one."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sdist import sdist_source, track_names

from tools.build_scripts import load

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docker/aiter_calls.py"
# Functions vLLM 0.33 calls and vLLM 0.32 did not (from the two releases' sources).
NEW_IN_033 = ("aiter.ops.topk.topk_gating", "aiter.ops.triton.fused_fp8_quant.fused_rms_fp8_per_tensor_static_quant",
              "aiter.ops.triton.gemm_a8w8_blockscale.gemm_a8w8_blockscale_preshuffle",
              "aiter.ops.triton.gather_kv_b_proj.gather_kv_b_proj")


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=300)


def _script():
    return load("aiter_calls")


@pytest.fixture(scope="module")
def calls() -> dict[str, list[str]]:
    """The AITER names each track's vLLM calls (the newest track's through the command line too)."""
    out = {track: sorted({str(c) for c in _script().vllm_calls(sdist_source(track))}) for track in track_names()}
    proc = run("list", sdist_source(track_names()[0]))
    assert proc.returncode == 0 and proc.stdout.split() == out[track_names()[0]], proc.stderr
    return out


def test_each_vllm_calls_aiters_mla_decode_and_metadata(calls):
    for track, names in calls.items():
        assert all(n.startswith("aiter.") for n in names), track
        assert {"aiter.mla.mla_decode_fwd", "aiter.get_mla_metadata_v1", "aiter.flash_attn_varlen_func"} <= set(names)


def test_033_calls_what_032_did_not(calls):
    if not {"0.32", "0.33"} <= set(calls):
        pytest.skip("needs the 0.32 and 0.33 tracks")
    assert set(NEW_IN_033) <= set(calls["0.33"])
    assert not set(NEW_IN_033) & set(calls["0.32"])


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_aiter(root: Path, names: list[str], drop: str | None = None) -> Path:
    """An AITER tree defining every name: aiter.x.y.f as `def f` in aiter/x/y.py, top-level names
    through a star import (as AITER's __init__ does), and the module aiter.ops.triton.moved
    reorganised to aiter/ops/triton/new/place.py behind a map in its package's __init__."""
    modules: dict[str, set[str]] = {}
    for full in names:
        module, _, name = full.rpartition(".")
        if full != drop:
            modules.setdefault(module, set()).add(name)
    top = modules.pop("aiter", set())
    _write(root, "aiter/ops/everything.py", "".join(f"def {n}(*a):\n    return a\n" for n in sorted(top)))
    _write(root, "aiter/__init__.py", "from .ops.everything import *\n")
    for module, defined in modules.items():
        rel = module.replace(".", "/")
        if not (root / rel).is_dir() and not (root / f"{rel}.py").exists():
            _write(root, f"{rel}.py", "".join(f"def {n}(*a):\n    return a\n" for n in sorted(defined)))
        else:
            _write(root, f"{rel}/__init__.py", "".join(f"{n} = None\n" for n in sorted(defined)))
    return root


def test_check_passes_on_an_aiter_with_every_name_and_names_a_missing_one(calls, tmp_path):
    track = track_names()[0]
    names = calls[track]
    src = sdist_source(track)
    script = _script()
    found = script.vllm_calls(src)
    assert script.missing(src, fake_aiter(tmp_path / "full", names), found) == []
    dropped = "aiter.mla.mla_decode_fwd"
    assert [str(c) for c in script.missing(src, fake_aiter(tmp_path / "less0", names, drop=dropped), found)] == [
        dropped] * sum(str(c) == dropped for c in found)
    proc = run("check", src, fake_aiter(tmp_path / "less", names, drop=dropped))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(rf"lacks 1 function\(s\) .*{re.escape(dropped)} \(vllm/[^)]+\.py:\d+\)",
                                         lines[0]), lines


def test_fallbacks_star_imports_and_moved_modules(tmp_path):
    vllm = tmp_path / "v"
    _write(vllm, "vllm/a.py", """
import aiter
try:
    from aiter.ops.gone import optional_thing
except ImportError:
    optional_thing = None
try:
    from aiter.ops.gone import unguarded_thing
except KeyError:
    pass
def f():
    from aiter.ops.triton.moved import g
    from aiter import star_name
    return aiter.attr_name
""")
    proc = run("list", vllm)
    assert proc.stdout.split() == ["aiter.attr_name", "aiter.ops.gone.unguarded_thing", "aiter.ops.triton.moved.g",
                                   "aiter.star_name"]
    aiter = tmp_path / "a"
    _write(aiter, "aiter/__init__.py", "from .ops.stars import *\nattr_name = 1\n")
    _write(aiter, "aiter/ops/stars.py", "__all__ = ['star_name']\ndef star_name(): pass\ndef hidden(): pass\n")
    _write(aiter, "aiter/ops/triton/__init__.py", "_MAP = {'moved': 'new.place'}\n")
    _write(aiter, "aiter/ops/triton/new/place.py", "def g(): pass\n")
    _write(aiter, "aiter/ops/gone.py", "def unguarded_thing(): pass\n")
    assert run("check", vllm, aiter).returncode == 0
    (aiter / "aiter/ops/stars.py").write_text("__all__ = ['hidden']\ndef star_name(): pass\ndef hidden(): pass\n")
    proc = run("check", vllm, aiter)
    assert proc.returncode == 1 and "aiter.star_name (vllm/a.py:" in proc.stderr
    assert "optional_thing" not in proc.stderr


def test_bad_folders_fail_in_one_line(tmp_path):
    for args in (["list", tmp_path], ["check", tmp_path, tmp_path]):
        proc = run(*args)
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1 and "folder" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_the_vllm_build_runs_the_check():
    text = (ROOT / "Dockerfile.rocm").read_text()
    stage = text[text.index("FROM base AS vllm-built"):text.index("AS vllm\n")]
    assert "aiter_calls.py check" in stage and "install_vllm.sh" in stage
    assert stage.index("install_vllm.sh /tmp/wheels") < stage.index("aiter_calls.py check")
