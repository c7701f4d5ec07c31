"""vllm_builtin.py is the one module that reads vLLM's built-in ROCM_AITER_MLA backend.

Every module of the package is read as a syntax tree: none but vllm_builtin.py may import the
built-in's module (``vllm.v1.attention.backends.mla.rocm_aiter_mla``) or reach a private
(``_``-prefixed) name of it, whether through the module, a name imported from it or one of the
built-in's classes that vllm_builtin hands out (``BuiltinImpl``, ...). So a new vLLM release
touches vllm_builtin.py, routing.py and the surface data only.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "vllm_aiter_mla"
OWNER = "vllm_builtin.py"
BUILTIN_MODULE = "rocm_aiter_mla"


def _names_of_the_builtin(tree: ast.Module) -> set[str]:
    """The local names bound to the built-in's module or to something taken from it: its module
    (``import ... rocm_aiter_mla as builtin``), names imported from it, and every name imported from
    vllm_builtin (the module and the built-in's classes it hands out)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            from_builtin = BUILTIN_MODULE in module.split(".")
            from_owner = module.split(".")[-1] == OWNER.removesuffix(".py")
            for alias in node.names:
                if from_builtin or from_owner or alias.name in (BUILTIN_MODULE, OWNER.removesuffix(".py")):
                    names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if BUILTIN_MODULE in alias.name.split("."):
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def _root(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def boundary_breaches(text: str, rel: str) -> list[str]:
    """Each import of the built-in's module and each read of a private name of it in one module's
    source, one line each."""
    tree = ast.parse(text)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            named = [node.module or "", *(a.name for a in node.names)]
        elif isinstance(node, ast.Import):
            named = [a.name for a in node.names]
        else:
            named = []
        if any(BUILTIN_MODULE in part.split(".") for part in named):
            found.append(f"{rel}:{node.lineno}: imports vLLM's built-in ({BUILTIN_MODULE}): read it in {OWNER}")
    builtin_names = _names_of_the_builtin(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _root(node) in builtin_names:
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)} reads a private name of vLLM's built-in: "
                         f"add a named function to {OWNER}")
    return found


def package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != OWNER)


def test_only_vllm_builtin_reads_the_builtin_backend() -> None:
    modules = package_modules()
    assert len(modules) > 10 and (PACKAGE / "backend.py") in modules
    found = [line for path in modules for line in boundary_breaches(path.read_text(), path.name)]
    assert not found, "vLLM's built-in read outside vllm_builtin.py:\n" + "\n".join(found)


def test_the_owner_does_read_the_builtin() -> None:
    """The scan would find the owner's own reads: what it looks for is real code, not a pattern
    that matches nothing."""
    assert boundary_breaches((PACKAGE / OWNER).read_text(), OWNER)


PLANTED = {
    "import-from": "from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin\n",
    "import": "import vllm.v1.attention.backends.mla.rocm_aiter_mla\n",
    "import-name": "from vllm.v1.attention.backends.mla.rocm_aiter_mla import AiterMLAImpl\n",
    "private-via-owner-class": "from .vllm_builtin import BuiltinMetadataBuilder\n\ndef f(b, p):\n"
                               "    return BuiltinMetadataBuilder._build_context_chunk_kv_indices(b, p)\n",
    "private-via-owner-module": "from . import vllm_builtin\n\n"
                                "def f():\n    return vllm_builtin.builtin._fp8_mla_prefill_supported()\n",
}


def test_a_planted_read_of_the_builtin_is_caught() -> None:
    for name, text in PLANTED.items():
        assert boundary_breaches(text, "planted.py"), name
    # public names through vllm_builtin, and private names of the module's own objects, are fine
    fine = ("from .vllm_builtin import BuiltinImpl, layer_calls\n\nclass A(BuiltinImpl):\n"
            "    def f(self):\n        return self._steps, layer_calls\n")
    assert boundary_breaches(fine, "fine.py") == []


def test_a_planted_read_in_the_real_backend_is_caught() -> None:
    """backend.py as it was before the boundary (the built-in's private builder method called
    directly): the scan finds both the import and the private read."""
    text = (PACKAGE / "backend.py").read_text()
    assert boundary_breaches(text, "backend.py") == []
    planted = text.replace("builtin_context_chunk_kv_indices(self, prefill)",
                           "builtin.AiterMLAMetadataBuilder._build_context_chunk_kv_indices(self, prefill)")
    planted = "from vllm.v1.attention.backends.mla import rocm_aiter_mla as builtin\n" + planted
    assert planted != text
    found = boundary_breaches(planted, "backend.py")
    assert len(found) == 2, found
