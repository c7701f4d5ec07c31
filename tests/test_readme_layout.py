"""README.md and docs/ follow the tree: README's layout table names every path that exists and
every top-level entry of the repository and every entry directly under ci/; README stays short
and links every page of docs/; every relative link in README and docs/ reaches an existing file
(and, with #anchor, a heading of that file)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150
# [text](target): the target up to the first space or closing parenthesis
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


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
    files = tracked() + [str(p.relative_to(ROOT)) for p in doc_pages()]
    top = {f.split("/", 1)[0] for f in files}
    ci = {"/".join(f.split("/", 2)[:2]) for f in files if f.startswith("ci/")}
    wanted = {p for p in top | ci if not p.startswith(".") or p in {".ci", ".github"}}
    # files that describe themselves or hold the tools' settings
    wanted -= {"README.md", "conftest.py", "pytest.ini", "ruff.toml", ".env.example", "ci/__init__.py"}
    return sorted(p for p in wanted if p not in named and not any(n.startswith(p + "/") for n in named))


def doc_pages() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md"))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    in_fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and re.match(r"#{1,6} ", line):
            found.add(slug(line.lstrip("#")))
    return found


def relative_links(markdown: str) -> list[str]:
    """Link targets outside code: no scheme, no mail address."""
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)
    prose = "\n".join(line for line in prose.splitlines() if not line.startswith("    "))
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def broken_links(source: Path, markdown: str) -> list[str]:
    broken = []
    for target in relative_links(markdown):
        path, _, anchor = target.partition("#")
        dest = (source.parent / path).resolve() if path else source
        if not dest.is_file():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return broken


def unlinked_pages(readme: str) -> list[str]:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(readme)}
    return [str(p.relative_to(ROOT)) for p in doc_pages() if p.resolve() not in linked]


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
    without_tools = "\n".join(line for line in readme.splitlines() if not line.startswith("| `tools/"))
    assert unnamed_entries(without_tools) == ["tools"]
    without_docs = "\n".join(line for line in readme.splitlines() if not line.startswith("| `docs/` |"))
    assert unnamed_entries(without_docs) == ["docs"]


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines, the limit is {README_MAX_LINES - 1}: move reference text to docs/")


def test_docs_exist_and_every_page_is_linked_from_readme() -> None:
    assert doc_pages(), "docs/ has no pages"
    unlinked = unlinked_pages((ROOT / "README.md").read_text())
    assert not unlinked, f"README.md does not link: {unlinked}"


def test_every_relative_link_resolves() -> None:
    broken = {}
    for source in [ROOT / "README.md", *doc_pages()]:
        found = broken_links(source, source.read_text())
        if found:
            broken[str(source.relative_to(ROOT))] = found
    assert not broken, f"links to nothing: {broken}"


def test_an_unlinked_page_or_a_broken_link_is_caught() -> None:
    readme = (ROOT / "README.md").read_text()
    first = doc_pages()[0]
    target = f"docs/{first.name}"
    without = "\n".join(line for line in readme.splitlines() if f"]({target}" not in line)
    assert str(first.relative_to(ROOT)) in unlinked_pages(without)
    assert broken_links(ROOT / "README.md", "see [x](docs/no-such-page.md)") == [
        "docs/no-such-page.md (no file docs/no-such-page.md)"]
    assert broken_links(ROOT / "README.md", f"see [x]({target}#no-such-heading)") == [
        f"{target}#no-such-heading (no heading #no-such-heading in {target})"]
    # links inside code are text, not links
    assert broken_links(ROOT / "README.md", "`[x](docs/no-such-page.md)`\n\n    [x](nowhere.md)\n") == []
    assert slug("Accuracy gate (`selftest accuracy`)") == "accuracy-gate-selftest-accuracy"
    assert slug("Users, privileges and volumes") == "users-privileges-and-volumes"
