"""Which test covers a module: its name. Every product module (a Python file of the folders of
docs/structure.md's folder table that hold product code, `__init__.py` and `__main__.py` left out) has a
test file named after it, `test_<module>.py` or `test_<module>_<aspect>.py`, in one of pytest.ini's
testpaths; or it is in MAPPED below, with the test files that cover it and why none is named after it
(its assertions are spread over files that test other things too).

A mapped file must exist and mention its module: import it (`import`, `from ... import`,
`build_scripts.load`), or name it (`<module>.py`, its dotted name), itself or in a helper it imports
from the test folders (engine tests reach the plugin through `engine_driver.py`). A mapped module that
gains a test named after it leaves the map (a stale entry fails), and so does one that is gone.
"""
from __future__ import annotations

import ast
import configparser
import functools
import re
from pathlib import Path

import pytest
from owner_scan import ROOT, python_files
from test_structure_map import folder_of, is_product, listed_folders

# The folders of docs/structure.md's folder table whose modules need a test named after them.
SCANNED = ("backend/src", "runtime/src", "tools", "ci", "ci/pipeline", "docker", "deploy")
# The table's other folders, each with why its files are not held to this (the test folders are
# pytest.ini's testpaths and their parents).
LEFT_OUT = {
    "backend/bench": "timing scripts, run by hand on a GPU host (the command heads each file)",
    "runtime/models": "generators of the tiny model's committed files, held to them by the tests of those files",
    "runtime/suites": "the image's self-test suites: tests themselves",
    "ci/test-machine": "shell scripts, no Python",
}
NOT_A_MODULE = ("__init__", "__main__")

# module (its path) -> (the test files that cover it, why none is named after it)
MAPPED: dict[str, tuple[tuple[str, ...], str]] = {
    "backend/src/vllm_aiter_mla/cpu_dev.py": (
        ("backend/tests/engine/test_engine_cpu.py", "backend/tests/engine/test_server_cpu.py"),
        "the CPU development mode runs only inside vLLM's CPU engine: the engine tests count its decode calls"),
    "runtime/src/rocm_vllm_runtime/distributions.py": (
        ("runtime/tests/test_versionless_install.py", "tests/test_installed_metadata.py"),
        "its readers' answers on broken metadata are tested with every reader; the one-reader rule scans all code"),
    "backend/src/vllm_aiter_mla/measure_child.py": (
        ("backend/tests/test_crash_safe.py", "backend/tests/test_start_cost.py"),
        "the measurement's child process is tested with crash_safe, which starts it, and for its exit cost"),
    "backend/src/vllm_aiter_mla/measurement_record.py": (
        ("backend/tests/test_crash_safe.py", "backend/tests/test_start_cost.py"),
        "the measurement's record is written and read by crash_safe's measurement, tested there"),
    "backend/src/vllm_aiter_mla/measure_state.py": (
        ("backend/tests/test_measured_route.py", "backend/tests/test_real_cache.py", "backend/tests/test_routing.py"),
        "a layer's measurement state, tested through the adapters that keep it (route, real cache, routing)"),
    "backend/src/vllm_aiter_mla/persistent.py": (
        ("backend/tests/test_reserve_workspace.py", "backend/tests/test_decode.py"),
        "its work buffers are tested where the impl claims them and where decode fills them"),
    "backend/src/vllm_aiter_mla/plugin.py": (
        ("backend/tests/test_kernels_and_package.py", "runtime/tests/test_versionless_install.py"),
        "registration and the vLLM range check are tested with the package's install contract and broken metadata"),
    "backend/src/vllm_aiter_mla/upstream_kernels.py": (
        ("backend/tests/test_crash_safe.py", "tests/test_tracks.py"),
        "a thin loader: where its factory is measured (measure_child.PRODUCTION), and that vLLM is reached through it"),
    "tools/cpu_serve.py": (
        ("tests/test_readme_cpu.py", "tests/test_engine_integration.py"),
        "serve-cpu.sh's helper, run by the Docker tests of the CPU path"),
    "docker/check_amdsmi.py": (
        ("tests/test_build_scripts.py",),
        "one of the build scripts run for real there, with the others"),
    "runtime/src/rocm_vllm_runtime/selection.py": (
        ("ci/pipeline/tests/test_pipeline.py", "runtime/tests/test_bench_compare.py"),
        "read from server logs by the bench (its `selected`) and the pipeline summary, tested there"),
    "runtime/src/rocm_vllm_runtime/versions.py": (
        ("runtime/tests/test_versionless_install.py", "runtime/tests/test_manifest.py"),
        "installed versions, tested with the manifest and the report that show them"),
    "tools/pins/model.py": (
        ("tests/test_pins.py", "tests/test_pins_input.py"),
        "versions.json's model is the pin tool's core, tested with its commands in test_pins*.py"),
    "tools/pins/verify.py": (
        ("tests/test_pins.py", "tests/test_pins_bad_input.py"),
        "the `verify` command and the schema check every command runs, tested with the pin tool's commands"),
}


def configured_testpaths(root: Path = ROOT) -> list[str]:
    """pytest.ini's testpaths."""
    ini = configparser.ConfigParser()
    ini.read(root / "pytest.ini")
    return ini["pytest"]["testpaths"].split()


def modules(root: Path, folders: list[str], scanned: tuple[str, ...] = SCANNED) -> list[str]:
    """The product modules (paths) of the scanned folders under root."""
    out = []
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        if is_product(rel) and folder_of(rel, folders) in scanned and path.stem not in NOT_A_MODULE:
            out.append(rel)
    return out


def found_tests(root: Path, paths: list[str]) -> list[str]:
    """Every test file (test_*.py) under the test paths."""
    return sorted({p.relative_to(root).as_posix() for folder in paths if (root / folder).is_dir()
                   for p in (root / folder).rglob("test_*.py")})


def named_after(module: str, tests: list[str]) -> list[str]:
    stem = Path(module).stem
    return [t for t in tests if Path(t).name == f"test_{stem}.py" or Path(t).name.startswith(f"test_{stem}_")]


def dotted(module: str) -> str:
    """The name a module is imported by: from its src folder, else from the checkout."""
    parts = Path(module).with_suffix("").parts
    return ".".join(parts[parts.index("src") + 1:] if "src" in parts else parts)


def _imports(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(the dotted names a file imports, module and module.name for a from-import; build scripts it loads)."""
    names, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load" and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            loaded.add(node.args[0].value)
    return names, loaded


def _helpers(root: Path, test: Path, tree: ast.Module) -> list[Path]:
    """The helper modules a test imports by name from its own folder or a test folder (not test files)."""
    ini = configparser.ConfigParser()
    ini.read(root / "pytest.ini")
    folders = [test.parent] + [root / f for f in ini["pytest"].get("pythonpath", "").split()]
    names, _ = _imports(tree)
    out = []
    for name in sorted({n.split(".")[0] for n in names}):
        for folder in folders:
            if (folder / f"{name}.py").is_file() and not name.startswith("test_"):
                out.append(folder / f"{name}.py")
                break
    return out


@functools.cache
def mentions(root: Path, test: str, module: str) -> bool:
    """Whether the test file, or a helper it imports, imports or names the module."""
    path = root / test
    tree = ast.parse(path.read_text(), test)
    name, stem = dotted(module), Path(module).stem
    said = re.compile(rf"(?<![\w.]){re.escape(name)}\b|\b{re.escape(stem)}\.py\b")
    for source in [path, *_helpers(root, path, tree)]:
        text = source.read_text()
        names, loaded = _imports(ast.parse(text, str(source)))
        if any(n == name or n.startswith(name + ".") for n in names) or \
                (module.startswith("docker/") and stem in loaded) or said.search(text):
            return True
    return False


def scan(root: Path, folders: list[str], scanned: tuple[str, ...] = SCANNED) -> tuple[list[str], list[str]]:
    """(the product modules of the scanned folders, the test files of the test paths) under root."""
    return modules(root, folders, scanned), found_tests(root, configured_testpaths(root))


def problems(root: Path, mapped: dict[str, tuple[tuple[str, ...], str]], found: tuple[list[str], list[str]]) \
        -> list[str]:
    """One line per module without a test named after it or an entry in the map, per stale entry and
    per mapped file that is missing or does not mention its module (found: scan's answer)."""
    mods, tests = found
    out = [f"{m}: no test file named test_{Path(m).stem}.py or test_{Path(m).stem}_<aspect>.py; "
           f"name one so, or add it to MAPPED with the files that test it" for m in mods
           if not named_after(m, tests) and m not in mapped]
    for module, (files, why) in sorted(mapped.items()):
        if module not in mods:
            out.append(f"{module}: in MAPPED but no product module any more; remove its entry")
            continue
        if named := named_after(module, tests):
            out.append(f"{module}: in MAPPED but {', '.join(named)} is named after it; remove its entry")
        if not files or not why.strip():
            out.append(f"{module}: its entry needs test files and a reason")
        for test in files:
            if not (root / test).is_file():
                out.append(f"{module}: mapped to {test}, which does not exist")
            elif not mentions(root, test, module):
                out.append(f"{module}: mapped to {test}, which no longer imports or names it")
    return out


@pytest.fixture(scope="module")
def real() -> tuple[list[str], list[str]]:
    return scan(ROOT, listed_folders((ROOT / "docs/structure.md").read_text()))


def test_every_module_has_a_test_named_after_it_or_a_mapped_one(real):
    wrong = problems(ROOT, MAPPED, real)
    assert not wrong, "\n".join(wrong)


def test_every_folder_of_the_structure_map_is_scanned_or_left_out_with_a_reason():
    folders = listed_folders((ROOT / "docs/structure.md").read_text())
    tests = {f for f in folders if any(p == f or p.startswith(f + "/") for p in configured_testpaths())} - set(SCANNED)
    unsorted = sorted(set(folders) - set(SCANNED) - set(LEFT_OUT) - tests)
    assert not unsorted, f"add each to SCANNED or LEFT_OUT (with why) in {Path(__file__).name}: {unsorted}"
    gone = sorted((set(SCANNED) | set(LEFT_OUT)) - set(folders))
    assert not gone, f"no longer in docs/structure.md's folder table: {gone}"


# ---- the check itself, on a tree of its own

FOLDERS = ["pkg/src", "docker", "tools", "tests"]
SCANNED_HERE = ("pkg/src", "docker", "tools")
INI = "[pytest]\ntestpaths = tests\npythonpath = tests\n"


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {"pytest.ini": INI, **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def check(root: Path, mapped: dict[str, tuple[tuple[str, ...], str]]) -> list[str]:
    return problems(root, mapped, scan(root, FOLDERS, SCANNED_HERE))


def test_a_module_without_a_named_test_fails_and_a_named_one_passes(tmp_path):
    root = tree(tmp_path, {"pkg/src/pk/__init__.py": "", "pkg/src/pk/alpha.py": "", "docker/lines.py": "",
                           "tests/test_alpha_edges.py": "", "tests/test_lines.py": ""})
    assert check(root, {}) == []
    (root / "pkg/src/pk/beta.py").write_text("")  # a new module, no test
    assert [p.split(":")[0] for p in check(root, {})] == ["pkg/src/pk/beta.py"]
    (root / "tests/test_alpha_edges.py").rename(root / "tests/test_edges.py")  # renamed away from its module
    assert [p.split(":")[0] for p in check(root, {})] == ["pkg/src/pk/alpha.py", "pkg/src/pk/beta.py"]


@pytest.mark.parametrize("text", [
    "from pk import beta\n", "import pk.beta\n", "from pk.beta import f\n", "x = 'pk.beta:f'\n",
    "# pkg/src/pk/beta.py\n", "import helper\n",
])
def test_a_mapped_file_that_mentions_its_module_passes(tmp_path, text):
    root = tree(tmp_path, {"pkg/src/pk/beta.py": "", "tests/test_other.py": text,
                           "tests/helper.py": "from pk import beta\n"})
    assert check(root, {"pkg/src/pk/beta.py": (("tests/test_other.py",), "why")}) == []


def test_a_build_script_loaded_by_name_is_mentioned(tmp_path):
    root = tree(tmp_path, {"docker/lines.py": "", "tests/test_other.py": "build_scripts.load('lines')\n"})
    assert check(root, {"docker/lines.py": (("tests/test_other.py",), "why")}) == []


@pytest.mark.parametrize("files, mapped, wrong", [
    ({"tests/test_other.py": "import pk.alphabet\nbeta = 1\n"}, ("tests/test_other.py",),
     "which no longer imports or names it"),
    ({}, ("tests/test_gone.py",), "which does not exist"),
    ({"tests/test_beta.py": "", "tests/test_other.py": "from pk import beta\n"}, ("tests/test_other.py",),
     "tests/test_beta.py is named after it; remove its entry"),
], ids=["not-mentioned", "missing-file", "stale-entry"])
def test_a_wrong_map_entry_fails(tmp_path, files, mapped, wrong):
    root = tree(tmp_path, {"pkg/src/pk/beta.py": "", **files})
    found = check(root, {"pkg/src/pk/beta.py": (mapped, "why")})
    assert len(found) == 1 and wrong in found[0], found


def test_an_entry_for_a_module_that_is_gone_fails(tmp_path):
    root = tree(tmp_path, {"tests/test_other.py": "from pk import beta\n"})
    found = check(root, {"pkg/src/pk/beta.py": (("tests/test_other.py",), "why")})
    assert found == ["pkg/src/pk/beta.py: in MAPPED but no product module any more; remove its entry"]


def test_removing_any_entry_of_the_real_map_fails(real):
    for module in MAPPED:
        found = problems(ROOT, {k: v for k, v in MAPPED.items() if k != module}, real)
        assert [p.split(":")[0] for p in found] == [module], found
