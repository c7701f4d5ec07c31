"""Network reads of the pin tool have one door: every HTTP, registry and git call of every tools.pins
command goes through tools/pins/resolve.py (_http and _git: one total deadline, PINS_TIMEOUT, headers
included; HTTP connections within PINS_CONNECT_TIMEOUT). A new network call anywhere else in
tools/pins fails here."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The names that open a connection (urllib, http.client, socket).
NETWORK_CALLS = {"urlopen", "build_opener", "OpenerDirector", "HTTPConnection", "HTTPSConnection",
                 "create_connection", "socket", "urlretrieve", "PoolManager", "ProxyManager",
                 "connection_from_url", "HTTPConnectionPool", "HTTPSConnectionPool"}
OWNERS = {"tools/pins/resolve.py": "_http / _git, the one total deadline"}


def network_calls(source: str) -> list[int]:
    """Line numbers of calls that open a connection (by the called name, however imported), and
    of git run directly (a subprocess whose command starts with "git")."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in NETWORK_CALLS:
            lines.append(node.lineno)
        elif name in ("run", "Popen", "check_output", "check_call") and node.args:
            first = node.args[0]
            if isinstance(first, ast.List) and first.elts and isinstance(first.elts[0], ast.Constant) \
                    and first.elts[0].value == "git":
                lines.append(node.lineno)
    return lines


def test_only_the_owners_open_connections():
    found = {}
    for path in sorted((ROOT / "tools/pins").glob("*.py")):
        rel = str(path.relative_to(ROOT))
        lines = network_calls(path.read_text())
        if lines and rel not in OWNERS:
            found[rel] = lines
    assert not found, f"network calls outside tools/pins/resolve.py (_http, _git): {found}"
    # the owners do have them (the scan finds what it looks for)
    assert network_calls((ROOT / "tools/pins/resolve.py").read_text())


def test_a_planted_call_is_found():
    planted = ("import urllib.request as u\nfrom socket import create_connection\nimport subprocess\n"
               "def f():\n    u.urlopen('https://x')\n    create_connection(('h', 1))\n"
               "    subprocess.run(['git', 'ls-remote', 'x'])\n    subprocess.run(['ls'])\n"
               "    urllib3.PoolManager().request('GET', 'https://x')\n")
    assert network_calls(planted) == [5, 6, 7, 9]
