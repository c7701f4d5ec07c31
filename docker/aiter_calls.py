#!/usr/bin/env python3
"""The AITER functions a vLLM release calls, and whether an AITER source tree has them.

    aiter_calls.py list VLLM_ROOT              the AITER names VLLM_ROOT/vllm imports with no fallback
    aiter_calls.py check VLLM_ROOT AITER_ROOT  exit 1, in one line naming them, when AITER_ROOT/aiter
                                               lacks any of those names

Both trees are read as source (ast), never imported (`import aiter` needs a GPU). A call is
`from aiter[.x] import name` or `aiter.name` outside a `try` that catches its ImportError (vLLM's
own fallback). AITER has a name its module defines, imports or star-imports, or a submodule; a
module with a `__getattr__` or writing `globals()` has every name; a moved submodule is found
through its package's dict of old name -> new dotted path (aiter.ops.triton). Standard library only.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class Call:
    module: str  # "aiter", "aiter.ops.topk", ...
    name: str
    where: str  # vllm/...py:line

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


def _guards(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return handler.type is None or any(getattr(t, "id", getattr(t, "attr", None)) in GUARDS for t in types)


def _calls_in(tree: ast.AST, where: str) -> list[Call]:
    calls: list[Call] = []
    imports_aiter = any(isinstance(n, ast.Import) and any(a.name == "aiter" and a.asname in (None, "aiter")
                                                          for a in n.names) for n in ast.walk(tree))

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Try):
            for child in node.body:
                visit(child, guarded or any(_guards(h) for h in node.handlers))
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        if isinstance(node, ast.ImportFrom) and node.level == 0 and not guarded \
                and (node.module or "").split(".")[0] == "aiter":
            calls.extend(Call(node.module, a.name, f"{where}:{node.lineno}") for a in node.names if a.name != "*")
        if (imports_aiter and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "aiter" and not guarded):
            calls.append(Call("aiter", node.attr, f"{where}:{node.lineno}"))
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return calls


def _parse(path: Path | None, needle: bytes = b"") -> ast.Module | None:
    """The file's syntax tree; None when it is absent, unreadable or does not hold `needle`."""
    try:
        data = path.read_bytes() if path else b""
        return ast.parse(data, filename=str(path)) if path and needle in data else None
    except (SyntaxError, ValueError, OSError):
        return None


def vllm_calls(root: Path) -> list[Call]:
    """Every AITER name vLLM's code under root/vllm imports or reads with no fallback."""
    package = root / "vllm"
    if not package.is_dir():
        raise SystemExit(f"aiter_calls: {package} is not a folder: give the folder that holds the vllm package")
    calls: list[Call] = []
    for path in sorted(package.rglob("*.py")):
        tree = _parse(path, b"aiter")  # most of vLLM never names AITER
        if tree is not None:
            calls += _calls_in(tree, str(path.relative_to(root)))
    return calls


def _module_level(body: ast.Module | list[ast.stmt] | None):
    """Statements that run at import: into if/try/with blocks, not into functions or classes."""
    for node in getattr(body, "body", body) or []:
        yield node
        if isinstance(node, (ast.If, ast.With, ast.AsyncWith)):
            yield from _module_level(node.body + getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body + [s for h in node.handlers for s in h.body] + node.orelse
                                     + node.finalbody)


def _absolute(node: ast.ImportFrom, package: str) -> str | None:
    parts = package.split(".")
    if node.level == 0:
        return node.module
    if node.level - 1 > len(parts):
        return None
    return ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))


class AiterSource:
    """The names of AITER's modules, read from its source."""

    def __init__(self, root: Path):
        self.root = root
        self._names: dict[str, set[str] | None] = {}

    def _exists(self, module: str) -> bool:
        base = self.root.joinpath(*module.split("."))
        return base.with_suffix(".py").is_file() or base.is_dir()

    def locate(self, module: str) -> str | None:
        """The module's path in the tree, following moved submodules part by part (None: absent)."""
        current, *parts = module.split(".")
        if not self._exists(current):
            return None
        for part in parts:
            wanted = f"{current}.{part}"
            current = wanted if self._exists(wanted) else self.moved(wanted)
            if current is None or not self._exists(current):
                return None
        return current

    def module_file(self, module: str) -> Path | None:
        located = self.locate(module)
        base = self.root.joinpath(*located.split(".")) if located else None
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None) if base else None

    def moved(self, module: str) -> str | None:
        """Where the package of `module` says a moved submodule now lives (None: nowhere)."""
        package, _, name = module.rpartition(".")
        init = self.root.joinpath(*package.split("."), "__init__.py") if package else None
        for node in _module_level(_parse(init) if init and init.is_file() else None):
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            for key, target in zip(value.keys, value.values) if isinstance(value, ast.Dict) else ():
                if (isinstance(key, ast.Constant) and key.value == name and isinstance(target, ast.Constant)
                        and isinstance(target.value, str) and target.value != name):
                    return f"{package}.{target.value}"
        return None

    def names(self, module: str) -> set[str] | None:
        """The module's names; None: it computes them at run time (every name counts)."""
        if module in self._names:
            return self._names[module]
        self._names[module] = set()  # a cycle of star imports adds nothing more
        path = self.module_file(module)
        found: set[str] | None = set()
        located = self.locate(module) or module
        package = located if path is not None and path.name == "__init__.py" else located.rpartition(".")[0]
        for node in _module_level(_parse(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name == "__getattr__":
                    found = None
                    break
                found.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    found |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Import):
                found |= {(a.asname or a.name.split(".")[0]) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, package)
                found |= {a.asname or a.name for a in node.names if a.name != "*"}
                if any(a.name == "*" for a in node.names) and (source or "").split(".")[0] == "aiter":
                    star = self.exported(source)
                    found = None if star is None else found | star
            elif isinstance(node, ast.Expr) and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                                                     and n.func.id == "globals" for n in ast.walk(node)):
                found = None
            if found is None:
                break
        self._names[module] = found
        return found

    def exported(self, module: str) -> set[str] | None:
        """What `from module import *` brings in."""
        names = self.names(module)
        for node in _module_level(_parse(self.module_file(module))):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                    for t in node.targets):
                try:
                    return set(ast.literal_eval(node.value))
                except ValueError:
                    return None
        return None if names is None else {n for n in names if not n.startswith("_")}

    def has(self, call: Call) -> bool:
        if self.locate(f"{call.module}.{call.name}") is not None:
            return True
        names = self.names(call.module) if self.locate(call.module) is not None else set()
        return names is None or call.name in names


def missing(vllm_root: Path, aiter_root: Path, calls: list[Call] | None = None) -> list[Call]:
    """The calls (default: those of vllm_root) that the AITER under aiter_root lacks."""
    if not (aiter_root / "aiter").is_dir():
        raise SystemExit(f"aiter_calls: {aiter_root / 'aiter'} is not a folder: give the folder that holds "
                         "the aiter package")
    source = AiterSource(aiter_root)
    return [c for c in (vllm_calls(vllm_root) if calls is None else calls) if not source.has(c)]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "list":
        for name in sorted({str(c) for c in vllm_calls(Path(argv[1]))}):
            print(name)
        return 0
    if len(argv) == 3 and argv[0] == "check":
        calls = vllm_calls(Path(argv[1]))
        first: dict[str, str] = {}
        for c in missing(Path(argv[1]), Path(argv[2]), calls):
            first.setdefault(str(c), c.where)
        if first:
            listed = ", ".join(f"{name} ({where})" for name, where in sorted(first.items()))
            print(f"error: this AITER lacks {len(first)} function(s) this vLLM calls: {listed}: build the AITER "
                  "the track names (versions.json tracks.<track>.aiter) or a vLLM of this AITER's track",
                  file=sys.stderr)
            return 1
        print(f"aiter_calls: every one of the {len({str(c) for c in calls})} AITER names vLLM calls is in "
              f"{Path(argv[2]) / 'aiter'}")
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
