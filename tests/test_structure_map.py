"""docs/structure.md, the structure map, against the code: every product Python file (tests left out; the
image's self-test suites runtime/suites/test_*.py kept) lies in a folder its folder table names, and its
table of imports between folders lists exactly the edges the syntax trees of those files make, each
with the files (file:line) that make it.

An edge is an import (module level or inside a function, relative or absolute, of a package or of a
script beside another), a build script loaded through tools/build_scripts.py (`build_scripts.load("x")`:
docker/x.py) or a file of the checkout loaded by its path (`spec_from_file_location`, the path written
in the same function)."""
from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from owner_scan import ROOT, python_files

from tools import build_scripts

DOC = ROOT / "docs/structure.md"
Edges = dict[tuple[str, str], dict[str, set[int]]]  # (from folder, to folder) -> file -> lines
PLACE = re.compile(r"`([^`\s:]+\.py):(\d+)`")


def is_product(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    return not (parts[0] == "tests" or "tests" in parts[:-1] or name == "conftest.py" or
                (name.startswith("test_") and not rel.startswith("runtime/suites/")))


def table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first table under `## heading`, its header and rule left out."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows[2:]]


def listed_folders(text: str) -> list[str]:
    return [row[0].strip("`").rstrip("/") for row in table(text, "Folders")]


def listed_edges(text: str) -> Edges:
    listed: Edges = {}
    for row in table(text, "Imports between folders"):
        key = (row[0].strip("`").rstrip("/"), row[1].strip("`").rstrip("/"))
        assert key not in listed, f"{key} is listed twice"
        places: dict[str, set[int]] = defaultdict(set)
        for path, line in PLACE.findall(row[2]):
            places[path].add(int(line))
        listed[key] = dict(places)
    return listed


def folder_of(rel: str, folders: list[str]) -> str | None:
    """The longest listed folder that holds rel."""
    holding = [f for f in folders if rel.startswith(f + "/")]
    return max(holding, key=len) if holding else None


class Resolver:
    """Where an imported name's file is in the checkout (None: not the checkout's: the standard library,
    a dependency)."""

    def __init__(self, root: Path, files: list[Path]) -> None:
        self.root = root
        # where absolute imports of packages start: the checkout (tools, ci) and the src layouts
        self.starts = [root, *sorted(p for p in root.glob("*/src") if p.is_dir())]
        self.scripts: dict[str, set[Path]] = defaultdict(set)  # a script's name -> the scripts of that name
        for path in files:
            if not (path.parent / "__init__.py").is_file():  # a module of a package is no script
                self.scripts[path.stem].add(path)

    @staticmethod
    def _in(base: Path, parts: list[str]) -> Path | None:
        """The longest prefix of parts that is a module or package under base."""
        for k in range(len(parts), 0, -1):
            candidate = base.joinpath(*parts[:k])
            if candidate.with_suffix(".py").is_file():
                return candidate.with_suffix(".py")
            if candidate.is_dir() and (k > 1 or any(candidate.glob("*.py"))):
                return candidate
        return None

    def absolute(self, name: str, importer: Path) -> Path | None:
        parts = name.split(".")
        beside = self._in(importer.parent, parts[:1])  # a script beside the importer (its folder is sys.path[0])
        if beside is not None:
            return beside
        if parts[0] in sys.stdlib_module_names:
            return None
        for start in self.starts:
            if (found := self._in(start, parts)) is not None:
                return found
        elsewhere = sorted(self.scripts.get(parts[0], ()))
        if len(elsewhere) > 1:
            raise AssertionError(f"{importer}: import {name}: more than one file of that name: {elsewhere}")
        return elsewhere[0] if elsewhere else None

    def relative(self, level: int, module: str | None, importer: Path) -> Path | None:
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
        return self._in(base, module.split(".")) if module else base


def _loads_by_path(tree: ast.Module) -> list[ast.Constant]:
    """The string constants of each function (or of the module's own statements) that calls
    spec_from_file_location: the path it loads is written there."""
    scopes: list[list[ast.AST]] = [[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]]
    scopes += [[n] for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = []
    for scope in scopes:
        nodes = [m for n in scope for m in ast.walk(n)]
        if any(isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) ==
               "spec_from_file_location" for n in nodes):
            found += [n for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return found


def edges(root: Path, folders: list[str]) -> Edges:
    """(from, to) -> file -> lines, over the product Python files under root."""
    files = python_files(root)
    resolver = Resolver(root, files)
    found: Edges = defaultdict(lambda: defaultdict(set))
    for path in files:
        rel = path.relative_to(root).as_posix()
        if not is_product(rel):
            continue
        source = folder_of(rel, folders)
        tree = ast.parse(path.read_text(), rel)
        targets: list[tuple[int, Path | None]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets += [(node.lineno, resolver.absolute(a.name, path)) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = resolver.relative(node.level, node.module, path)
                    targets += [(node.lineno, Resolver._in(base, [a.name]) or base if base else None)
                                for a in node.names]
                else:
                    targets += [(node.lineno, resolver.absolute(f"{node.module}.{a.name}", path)) for a in node.names]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load" and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "build_scripts" and node.args and \
                    isinstance(node.args[0], ast.Constant):
                folder = root / build_scripts.FOLDER.relative_to(ROOT)  # docker/
                targets.append((node.lineno, folder / f"{node.args[0].value}.py"))
        for constant in _loads_by_path(tree):
            if constant.value.endswith(".py") and (root / constant.value).is_file():
                targets.append((constant.lineno, root / constant.value))
        for line, target in targets:
            if target is None:
                continue
            to = folder_of(target.relative_to(root).as_posix() + ("/" if target.is_dir() else ""), folders)
            if to != source:
                found[source, to][rel].add(line)
    return {key: dict(places) for key, places in found.items()}


def _row(key: tuple[str, str], places: dict[str, set[int]]) -> str:
    where = ", ".join(f"`{path}:{min(lines)}`" for path, lines in sorted(places.items()))
    return f"| `{key[0]}` | `{key[1]}` | {where} | ... |"


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


@pytest.fixture(scope="module")
def found(doc: str) -> Edges:
    return edges(ROOT, listed_folders(doc))


def test_every_product_file_lies_in_a_listed_folder(doc):
    folders = listed_folders(doc)
    for folder in folders:
        assert (ROOT / folder).is_dir(), f"docs/structure.md names {folder}/, which is not a folder"
    outside = [p.relative_to(ROOT).as_posix() for p in python_files(ROOT)
               if is_product(p.relative_to(ROOT).as_posix()) and folder_of(p.relative_to(ROOT).as_posix(), folders)
               is None]
    assert not outside, f"add their folders to docs/structure.md's folder table: {outside}"


def unlisted_and_stale(listed: Edges, found: Edges) -> tuple[list[str], list[str]]:
    """(a table row for each edge the map lacks, `from -> to` of each it lists that no file makes)."""
    return ([_row(key, found[key]) for key in sorted(found) if key not in listed],
            [f"{a} -> {b}" for a, b in sorted(listed) if (a, b) not in found])


def test_the_map_lists_every_edge_between_folders_and_no_other(doc, found):
    missing, stale = unlisted_and_stale(listed_edges(doc), found)
    assert not missing, "docs/structure.md does not list these imports between folders:\n" + "\n".join(missing)
    assert not stale, f"docs/structure.md lists imports no file makes any more: {stale}"


def test_each_edge_names_the_files_that_make_it(doc, found):
    wrong = []
    for key, places in listed_edges(doc).items():
        made = found.get(key, {})
        if set(places) != set(made):
            wrong.append(f"{key}: listed {sorted(places)}, made by {sorted(made)}")
        wrong += [f"{key}: {path}:{line} makes no such import (it does at {sorted(made[path])})"
                  for path, lines in places.items() if path in made for line in sorted(lines - made[path])]
    assert not wrong, "\n".join(wrong)


FOLDERS = ["a/src", "b/src", "docker", "tools", "deploy"]


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("code, to", [
    ("import pkg_b.mod\n", {"b/src"}),
    ("from pkg_b import mod\n", {"b/src"}),
    ("def f():\n    from pkg_b.mod import x\n", {"b/src"}),
    ("from .. import pkg_b\n", set()),  # a relative import stays inside a's tree: pkg_b is not there
    ("import lock_lines\n", {"docker"}),  # a script of another folder, by its name
    ("from tools import build_scripts\nbuild_scripts.load('lock_lines')\n", {"tools", "docker"}),
    ("import importlib.util\ndef f(root):\n    p = root / 'b/src/pkg_b/mod.py'\n"
     "    importlib.util.spec_from_file_location('m', p)\n", {"b/src"}),
    ("import json, torch\nfrom . import own\n", set()),
])
def test_each_kind_of_edge_is_found(tmp_path, code, to):
    root = tree(tmp_path, {"a/src/pkg_a/__init__.py": "", "a/src/pkg_a/own.py": "", "a/src/pkg_a/x.py": code,
                           "b/src/pkg_b/__init__.py": "", "b/src/pkg_b/mod.py": "x = 1\n",
                           "docker/lock_lines.py": "", "tools/__init__.py": "", "tools/build_scripts.py": ""})
    found = edges(root, FOLDERS)
    assert set(found) == {("a/src", folder) for folder in to}, found
    assert all(list(places) == ["a/src/pkg_a/x.py"] for places in found.values()), found


def test_tests_make_no_edge(tmp_path):
    root = tree(tmp_path, {"a/src/pkg_a/__init__.py": "", "b/src/pkg_b/__init__.py": "",
                           "a/tests/test_x.py": "import pkg_b\n", "a/src/pkg_a/test_y.py": "import pkg_b\n",
                           "tests/conftest.py": "import pkg_a\n"})
    assert edges(root, FOLDERS) == {}


def test_a_removed_row_and_an_added_import_are_both_caught(doc, found, tmp_path):
    """The comparison itself: the map less one row lacks an edge; a fake import makes one the map lacks."""
    listed = listed_edges(doc)
    for key in listed:
        missing, stale = unlisted_and_stale({k: v for k, v in listed.items() if k != key}, found)
        assert missing == [_row(key, found[key])] and stale == [], key
    rel = "runtime/src/rocm_vllm_runtime/ray_cluster.py"
    text = (ROOT / rel).read_text() + "\nfrom tools.pins import model  # noqa\n"
    copy = tree(tmp_path, {p.relative_to(ROOT).as_posix(): p.read_text() for p in python_files(ROOT)
                           if p.relative_to(ROOT).parts[0] in ("deploy", "tools", "runtime")} | {rel: text})
    added = edges(copy, listed_folders(doc))
    assert ("runtime/src", "tools") in added and ("runtime/src", "tools") not in listed_edges(doc)
