"""No product code edits Python's import path: a module imports what its package declares, the import
graph sees it, and the environment (ci/test.sh's, uv's for tools/, the image's) provides it. The
product's Python (runtime/src, runtime/models, runtime/suites, backend/src, backend/bench, ci/, docker/ and tools/,
without tests) is read as syntax trees; these fail:
sys.path.insert/append/extend/remove, an assignment to sys.path or sys.path[...], site.addsitedir.

An exception would be counted in ALLOWED, per file with its reason, so that a further one fails, and an
entry whose uses are gone fails until it is removed; none is left. The scanner is checked against planted
forms."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from owner_scan import python_files

ROOT = Path(__file__).resolve().parents[1]
EDITS = {"insert", "append", "extend", "remove"}
# The folders of the product's Python: the packages, the scripts beside them (the tiny model's writers,
# the backend's benchmarks, the Ray launcher), the self-test suites' helpers and the build and pipeline tooling.
AREAS = ("runtime/src", "runtime/models", "runtime/suites", "backend/src", "backend/bench", "ci", "docker", "tools")

# file -> (how many, why)
ALLOWED: dict[str, tuple[int, str]] = {}


def uses(source: str) -> list[int]:
    """The lines that edit the import path."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if owner == "sys.path" and node.func.attr in EDITS or owner == "site" and node.func.attr == "addsitedir":
                found.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t).startswith("sys.path") for t in targets):
                found.append(node.lineno)
    return sorted(found)


def scanned(base: str) -> list[Path]:
    """The product's Python files under one of AREAS, tests left out."""
    return [path for path in sorted(python_files(ROOT / base))
            if "/tests/" not in path.relative_to(ROOT).as_posix()
            and not path.name.startswith("test_") and path.name != "conftest.py"]


def counted() -> Counter:
    count: Counter = Counter()
    for base in AREAS:
        for path in scanned(base):
            count[path.relative_to(ROOT).as_posix()] += len(uses(path.read_text()))
    return +count


def test_each_area_holds_python_the_scan_reads() -> None:
    """A folder renamed or emptied would leave the scan reading nothing there."""
    empty = [base for base in AREAS if not scanned(base)]
    assert not empty, f"no Python to scan in {empty}: update AREAS in tests/test_no_path_edits.py"


def test_no_product_module_edits_the_import_path() -> None:
    count = counted()
    wrong = [f"{path}: {n} edit(s) of the import path, {ALLOWED.get(path, (0, ''))[0]} allowed"
             for path, n in sorted(count.items()) if n > ALLOWED.get(path, (0, ""))[0]]
    assert not wrong, "import what the package declares instead:\n" + "\n".join(wrong)
    stale = [f"{path}: {n} allowed, {count[path]} found" for path, (n, _) in ALLOWED.items() if count[path] != n]
    assert not stale, "\n".join(stale)


def test_the_scanner_catches_each_form() -> None:
    planted = """
import site, sys
sys.path.insert(0, "x")
sys.path.append("x")
sys.path += ["x"]
sys.path[:0] = ["x"]
site.addsitedir("x")
print(sys.path)
path = list(sys.path)
"""
    assert uses(planted) == [3, 4, 5, 6, 7]
