"""The tools of tools/ as one locked project that uv runs (tools/pyproject.toml, tools/uv.lock): what they
import is what the project declares; a Python without those libraries stops in one line naming the
uv command (and how to install uv where it is missing) and makes nothing; the documented command
runs the tool in an environment uv makes from the lock, also when several first runs meet, a link
stands in the environment's place or its Python is gone. tests/test_locks.py holds the lock to
what the project locks to."""
from __future__ import annotations

import ast
import json
import os
import pwd
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from owner_scan import python_files

from tools.pins import __main__ as cli
from tools.pins import locks
from tools.pins.model import PinError

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "tools/pyproject.toml"


def declared() -> set[str]:
    """The project's dependencies by import name (without their version specifiers and markers)."""
    from packaging.requirements import Requirement

    return {Requirement(line).name.replace("-", "_") for line in
            tomllib.loads(PROJECT.read_text())["project"]["dependencies"]}


def imported_outside_the_standard_library(paths: list[Path]) -> set[str]:
    """The top-level names these files import by absolute name, less the standard library's."""
    imported = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    return {name for name in imported if name not in sys.stdlib_module_names and name != "__future__"}


def test_the_tool_imports_only_what_its_project_declares():
    # the checkout's build scripts (docker/lock_lines.py, docker/pinned_dists.py) come through tools/build_scripts.py
    # (a relative import), never by the folder's name
    outside = imported_outside_the_standard_library(sorted((ROOT / "tools/pins").glob("*.py")))
    # jsonschema: through rocm_vllm_runtime.schema, which the tool validates with
    assert outside | {"jsonschema"} == set(cli.NEEDED) == declared() - {"uv"}, (outside, declared())
    assert "uv" in declared()  # the resolver of `resolve --write` and `lock`, beside the environment's Python


def test_every_program_of_tools_imports_only_what_the_project_declares():
    """cpu_serve.py, uv_pip.py and build_scripts.py run in the project's environment too: what any Python
    file of tools/ imports (its environment, tools/.venv, left out) is the standard library or declared."""
    files = python_files(ROOT / "tools")
    names = {path.relative_to(ROOT).as_posix() for path in files}
    assert {"tools/cpu_serve.py", "tools/uv_pip.py", "tools/build_scripts.py", "tools/pins/__main__.py"} <= names
    outside = imported_outside_the_standard_library(files)
    assert outside <= declared() and "rocm_vllm_runtime" in outside, (outside, declared())


def test_the_runtime_is_this_checkouts_editable_one():
    """The tool's owners (numeric, secret_values, files, ...) come from the runtime beside it: a path source."""
    sources = tomllib.loads(PROJECT.read_text())["tool"]["uv"]["sources"]
    assert sources == {"rocm-vllm-runtime": {"path": "../runtime", "editable": True}}
    assert (PROJECT.parent / sources["rocm-vllm-runtime"]["path"] / "pyproject.toml").is_file()


def test_the_tool_makes_no_environment_of_its_own():
    """No venv, pip or exec in the tool: uv makes, locks and keeps its environment."""
    found = []
    for path in sorted((ROOT / "tools/pins").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("exec") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: os.{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in ("venv", "ensurepip", "CI_PINS_ENV"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
            elif isinstance(node, ast.Import) and {a.name.split(".")[0] for a in node.names} & {"venv", "ensurepip"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: import")
    assert not found, found


def bare(tmp_path: Path, *args: str, uv_on_path: bool) -> subprocess.CompletedProcess:
    """python -S (no site-packages, no PYTHONPATH: none of the tool's libraries) -m tools.pins ARGS, with uv on PATH or
    not."""
    home, cache, empty = tmp_path / "home", tmp_path / "cache", tmp_path / "empty"
    for folder in (home, cache, empty):
        folder.mkdir(exist_ok=True)
    path = str(Path(locks.uv_command()[0]).parent) if uv_on_path else str(empty)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PATH": path, "HOME": str(home),
           "XDG_CACHE_HOME": str(cache)}
    return subprocess.run([sys.executable, "-S", "-m", "tools.pins", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_python_without_the_libraries_stops_in_one_line_naming_the_uv_command(tmp_path):
    proc = bare(tmp_path, "tracks", "--json", uv_on_path=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: this Python lacks jsonschema, packaging, rocm_vllm_runtime, urllib3 (tools/pyproject.toml): "
        "run the pin tool with uv from the repository root: uv run --locked --project tools python -m tools.pins "
        "with the same arguments"], proc.stderr
    # nothing made: no environment in the cache or home folder
    assert not any((tmp_path / "home").iterdir()) and not any((tmp_path / "cache").iterdir())


def test_without_uv_the_line_says_how_to_install_it(tmp_path):
    # a versions file that is not there: nothing could be written were the libraries found after all
    proc = bare(tmp_path, "--file", str(tmp_path / "none.json"), "resolve", "--registry",
                "https://user:hunter2@mirror.example\nx", uv_on_path=False)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.strip() == (
        "error: this Python lacks jsonschema, packaging, rocm_vllm_runtime, urllib3 (tools/pyproject.toml): "
        f"install uv ({cli.UV_INSTALL}), then run the pin tool with uv from the repository root: "
        "uv run --locked --project tools python -m tools.pins with the same arguments"), proc.stderr
    assert not any((tmp_path / "home").iterdir()) and not any((tmp_path / "cache").iterdir())


def test_with_the_runtime_the_line_shows_the_arguments_masked(monkeypatch):
    """Where only a library other than the runtime is missing, the command is shown whole, each URL's
    credentials masked by the runtime and every line break escaped: one line."""
    monkeypatch.setattr(cli, "NEEDED", (*cli.NEEDED, "no_such_library_here"))
    monkeypatch.setattr(cli.shutil, "which", lambda name: "/usr/bin/uv")
    with pytest.raises(SystemExit) as stopped:
        cli.libraries_or_exit(["resolve", "--registry", "https://user:hunter2@mirror.example\nx"])
    line = str(stopped.value)
    assert line.startswith("error: this Python lacks no_such_library_here (tools/pyproject.toml): run the pin "
                           "tool with uv from the repository root: uv run --locked --project tools "
                           "python -m tools.pins resolve --registry "), line
    assert "hunter2" not in line and "\n" not in line and line.endswith("\\nx'"), line


def test_resolve_and_lock_without_uv_say_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-uv-here"))
    monkeypatch.setattr(locks.sys, "executable", str(tmp_path / "bin" / "python3"))
    with pytest.raises(PinError) as stopped:
        locks.uv_command()
    assert str(stopped.value) == (
        "uv not found beside this Python or on PATH: install uv (https://docs.astral.sh/uv/getting-started/"
        "installation/) and run the pin tool with it from the repository root: uv run --locked --project tools "
        "python -m tools.pins ...")


def test_an_unset_home_stops_only_what_needs_the_sdist_cache_in_one_line(monkeypatch, capsys):
    """No HOME and no account entry: Path.home() raises; the tool reads versions.json as ever and
    says in one line what to set where it keeps sdists."""
    monkeypatch.delenv("HOME", raising=False)

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(RuntimeError):
        Path.home()  # the case is real
    monkeypatch.chdir(ROOT)
    assert cli.main(["tracks", "--json"]) == 0
    assert capsys.readouterr().out.startswith("[")
    assert cli.main(["lock", "--check", "scripts"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: no home folder to keep sdists in (HOME is unset and the user has none): set HOME or pass "
        "--sdist-cache DIR"]


# ------------------------------------------------------------------ under uv (PyPI, or uv's cache)

def uv_run(env_dir: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """The documented command, its environment at env_dir (UV_PROJECT_ENVIRONMENT: tools/.venv otherwise)."""
    uv = locks.uv_command()[0]
    return subprocess.run([uv, "run", "--locked", "--project", "tools", "python", "-m", "tools.pins", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(env_dir), **extra})


def direct(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "tools.pins", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_concurrent_first_runs_under_uv_all_run_the_tool(tmp_path):
    env_dir = tmp_path / "env"
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda _: uv_run(env_dir, "tracks", "--json"), range(3)))
    want = direct("tracks", "--json")
    for proc in runs:
        assert proc.returncode == 0 and proc.stdout == want, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
    # the lock's uv stands beside the environment's Python, where resolve and lock take it from
    assert (env_dir / "bin" / "uv").is_file()


def test_a_link_in_the_environments_place_empties_nothing(tmp_path):
    target = tmp_path / "someone-elses"
    target.mkdir()
    (target / "keep.txt").write_text("kept\n")
    (tmp_path / "env").symlink_to(target)
    proc = uv_run(tmp_path / "env", "tracks", "--json")
    assert proc.returncode != 0 and "not a valid Python environment" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"] and (target / "keep.txt").read_text() == "kept\n"


def test_an_environment_whose_python_is_gone_is_made_again(tmp_path):
    env_dir = tmp_path / "env"
    assert uv_run(env_dir, "tracks", "--json").returncode == 0
    python = env_dir / "bin" / "python"
    python.unlink()
    python.symlink_to(tmp_path / "no-such-python")
    proc = uv_run(env_dir, "tracks", "--json")
    assert proc.returncode == 0 and proc.stdout == direct("tracks", "--json"), proc.stderr[-2000:]
    assert python.resolve().is_file()


def test_track_names_one_a_line_are_the_json_lists(monkeypatch, capsys):
    """`tracks --names [--built]` (what propose-pins.sh reads) holds the names of `tracks --json`, in order."""
    monkeypatch.chdir(ROOT)
    for extra in ([], ["--built"]):
        assert cli.main(["tracks", "--json", *extra]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert cli.main(["tracks", "--names", *extra]) == 0
        assert capsys.readouterr().out.splitlines() == listed and listed
