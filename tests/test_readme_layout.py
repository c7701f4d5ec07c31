"""README.md's layout table follows the tree: every path it names exists, and every top-level
entry of the repository and every entry directly under ci/ is named in it."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layout_paths(readme: str) -> set[str]:
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "README.md: the Layout section has no table rows"
    return {p.rstrip("/") for row in rows for p in re.findall(r"`([^`]+)`", row.split("|")[1])}


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def missing_paths(readme: str) -> list[str]:
    return sorted(p for p in layout_paths(readme) if not (ROOT / p).exists())


def unnamed_entries(readme: str) -> list[str]:
    named = layout_paths(readme)
    files = tracked()
    top = {f.split("/", 1)[0] for f in files}
    ci = {"/".join(f.split("/", 2)[:2]) for f in files if f.startswith("ci/")}
    wanted = {p for p in top | ci if not p.startswith(".") or p in {".ci", ".github"}}
    # files that describe themselves or hold the tools' settings
    wanted -= {"README.md", "conftest.py", "pytest.ini", "ruff.toml", ".env.example", "ci/__init__.py"}
    return sorted(p for p in wanted if p not in named and not any(n.startswith(p + "/") for n in named))


def test_every_named_path_exists() -> None:
    missing = missing_paths((ROOT / "README.md").read_text())
    assert not missing, f"README.md Layout names paths that do not exist: {missing}"


def test_every_top_level_and_ci_entry_is_named() -> None:
    unnamed = unnamed_entries((ROOT / "README.md").read_text())
    assert not unnamed, f"README.md Layout does not name: {unnamed} (add a row, or fix the table)"


def test_a_stale_or_missing_row_is_caught() -> None:
    readme = (ROOT / "README.md").read_text()
    stale = readme.replace("| `tests/` |", "| `tests/`, `ci/no-such-folder/` |", 1)
    assert missing_paths(stale) == ["ci/no-such-folder"]
    without_pins = "\n".join(line for line in readme.splitlines() if not line.startswith("| `ci/pins/` |"))
    assert unnamed_entries(without_pins) == ["ci/pins"]
