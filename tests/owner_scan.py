"""Shared by the architecture tests that hold one kind of read to its owner module: which product
files they scan, and the comparison of what a scan found with the counted exceptions."""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AREAS = ("runtime/src", "runtime/suites", "backend/src", "ci", "docker", "tools", "deploy")
# Folders that hold no file of the repository (.gitignore's): caches and build outputs; hidden folders
# (.git, .venv, .venv-tracks, ...) are left out too.
NOT_THE_REPOSITORYS = {"__pycache__", "build", "dist", "node_modules", "selftest-results", "build-results",
                       "pins-results"}


def shebang_shell(path: Path) -> bool:
    """Whether a file's first line runs it with bash or sh (a shell script without the .sh suffix)."""
    try:
        with open(path, "rb") as f:
            first = f.readline()
    except OSError:
        return False
    return first.startswith(b"#!") and (b"bash" in first or b"/sh" in first)


# Folders whose shell scripts (at any depth) the shell scans read, besides the files each names.
SHELL_AREAS = ("ci", "docker", "deploy", "runtime/bin")


def shell_scripts(named: Iterable[str], areas: Iterable[str] = SHELL_AREAS, tests: bool = True) -> list[Path]:
    """The shell scripts under areas (a .sh suffix or a bash/sh shebang; under a tests/ folder only with
    tests), and the files named (relative to the repository), each once, sorted."""
    found = [p for area in areas for p in ROOT.glob(f"{area}/**/*")
             if p.is_file() and (tests or "/tests/" not in p.as_posix())
             and (p.suffix == ".sh" or shebang_shell(p))]
    found += [ROOT / rel for rel in named]
    return sorted(set(found))


def unread_shell(found: Iterable[Path], named: Iterable[str], areas: Iterable[str] = SHELL_AREAS) -> list[str]:
    """What a shell scan would silently skip: a named file that does not exist, an area with no script found."""
    rels = {p.relative_to(ROOT).as_posix() for p in found}
    missing = [f"{rel} does not exist" for rel in named if not (ROOT / rel).is_file()]
    return missing + [f"no shell script found in {area}" for area in areas
                      if not any(rel.startswith(f"{area}/") for rel in rels)]


def python_files(root: Path = ROOT) -> list[Path]:
    """Every Python file of the repository under root, tests included; environments and caches left out."""
    out = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in NOT_THE_REPOSITORYS and
                         not d.endswith(".egg-info"))
        out += [Path(folder, name) for name in sorted(names) if name.endswith(".py")]
    return out

Use = tuple[str, int, str]  # form, line, code


def product_files(owner: str, areas: Iterable[str] = AREAS) -> list[Path]:
    """The Python files of the product in ``areas``: the owner, tests and conftest files left out,
    the image's self-test suites (runtime/suites/test_*.py) kept."""
    out = []
    for area in areas:
        for path in sorted(python_files(ROOT / area)):
            rel = path.relative_to(ROOT).as_posix()
            suite = rel.startswith("runtime/suites/")
            if rel == owner or "/tests/" in rel or path.name == "conftest.py" or \
                    (path.name.startswith("test_") and not suite):
                continue
            out.append(path)
    return out


def outside_owner(owner: str, uses: Callable[[str], list[Use]],
                  known: dict[tuple[str, str], tuple[int, str]]) -> tuple[list[str], list[tuple[str, str]]]:
    """(each use beyond what ``known`` counts, one line each; the ``known`` entries that no longer
    match the code)."""
    counts: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], list[str]] = {}
    for path in product_files(owner):
        rel = path.relative_to(ROOT).as_posix()
        for form, line, code in uses(path.read_text()):
            counts[rel, form] += 1
            where.setdefault((rel, form), []).append(f"{rel}:{line}: {code}")
    wrong = [line for key, n in counts.items() if n != known.get(key, (0, ""))[0] for line in where[key]]
    stale = [key for key in known if counts[key] != known[key][0]]
    return wrong, stale


# Shell that lives in YAML: the CI workflows' `run:` steps. (compose and Kubernetes commands are argv lists,
# run with no shell; a `python3 -c` among them would be read as one here too.)
WORKFLOWS = ".github/workflows"
YAML_COMMANDS = ("compose.yaml", "compose.cpu.yaml", "compose.hostnet.yaml", "compose.ray.yaml", "deploy/kubernetes")


def yaml_shell(path: Path) -> str:
    """The shell of a YAML file: every `run:` value and every command list (as one line each)."""
    import yaml  # noqa: PLC0415

    parts: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "run" and isinstance(value, str):
                    parts.append(value.rstrip("\n"))
                elif key in ("command", "args", "test", "entrypoint") and isinstance(value, list):
                    parts.append(" ".join(map(str, value)))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    class Loader(yaml.SafeLoader):  # compose's own tags (!reset, !override) read as plain values
        pass

    def untagged(loader, _suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node)
        return loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) else loader.construct_scalar(node)

    Loader.add_multi_constructor("!", untagged)
    for doc in yaml.load_all(path.read_text(), Loader=Loader):  # noqa: S506  (a SafeLoader)
        walk(doc)
    return "\n".join(parts)


def yaml_files() -> list[Path]:
    found = sorted((ROOT / WORKFLOWS).glob("*.yml"))
    for name in YAML_COMMANDS:
        path = ROOT / name
        found += sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
    return found
