"""One owner for reading a number or a URL from a setting (DESIGN: one owner per kind of risky
operation): rocm_vllm_runtime.numeric. int() and float() took "++8011" past a check into a
traceback, a 5000-digit value past int()'s digit limit, 1e10 seconds into an overflow; urllib's
port of N + 65536 wrapped round onto N. So the product's Python (runtime/src, backend/src, ci/,
docker/, tools/ and deploy/, without tests; the in-image suites of runtime/suites included) is read as
syntax trees, and these fail outside numeric.py:

* int() or float() of a value read from the environment (os.environ, os.getenv, env.get(...),
  env[...], or a name assigned from one of those in the same module);
* the .port of a urllib.parse.urlsplit/urlparse result (directly or through a name assigned
  from one).

Uses that cannot go through the owner are counted in KNOWN, one entry per file with the reason,
so that a new one fails as well. The scanner is checked against planted uses of each form."""
from __future__ import annotations

import ast

from owner_scan import outside_owner

OWNER = "runtime/src/rocm_vllm_runtime/numeric.py"
ENV_READS = ("os.environ", "os.getenv", "environ.get(", "environ[", "env.get(", "env[", "ENV.get(", "ENV[")
URL_SPLITS = ("urlsplit", "urlparse")

# (file, form) -> (how many, why)
KNOWN = {
    ("backend/src/vllm_aiter_mla/config.py", "number"): (2, "AITER_MLA_COMPILE_THREADS: the backend package does "
                                                           "not depend on the runtime (its own digits check)"),
}


def _env_read(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return any(read in text for read in ENV_READS)


def _is_split(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func).endswith(URL_SPLITS)


def uses(source: str) -> list[tuple[str, int, str]]:
    """(form, line, code) of each read of a number or a URL's port that is not the owner's."""
    tree = ast.parse(source)
    from_env: set[str] = set()
    from_split: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if _env_read(node.value):
                from_env |= names
            if _is_split(node.value):
                from_split |= names
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "float") \
                and node.args:
            arg = node.args[0]
            if _env_read(arg) or (isinstance(arg, ast.Name) and arg.id in from_env):
                found.append(("number", node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Attribute) and node.attr == "port" and (
                _is_split(node.value) or (isinstance(node.value, ast.Name) and node.value.id in from_split)):
            found.append(("url port", node.lineno, ast.unparse(node)))
    return sorted(found, key=lambda use: use[1])


def test_numbers_and_url_ports_are_read_only_by_their_owner() -> None:
    wrong, stale = outside_owner(OWNER, uses, KNOWN)
    assert not wrong, ("read through rocm_vllm_runtime.numeric (whole, port, duration, real, url) instead:\n"
                       + "\n".join(wrong))
    assert not stale, f"KNOWN entries that no longer match the code: {stale}"


def test_the_scanner_catches_each_form() -> None:
    planted = '''
import os, urllib.parse
from urllib.parse import urlsplit
a = int(os.environ["BENCH_PORT"])
b = float(os.environ.get("T", "3"))
raw = env.get("N") or "1"
c = int(raw)
d = urllib.parse.urlsplit(url).port
parts = urlsplit(url)
e = parts.port
f = int(other)  # not from the environment
g = numeric.url("--url", url).port
'''
    found = [(form, line) for form, line, _ in uses(planted)]
    assert found == [("number", 4), ("number", 5), ("number", 7), ("url port", 8), ("url port", 10)], found
