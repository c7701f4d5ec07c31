"""docs/ say what the code does.

* docs/building.md lists the stages of Dockerfile.rocm_base and Dockerfile.rocm, in order, and the
  stage list in the comment at the top of each Dockerfile is the same; its build variables are
  docker-bake.hcl's.
* Every message docs/troubleshooting.md quotes is one the code prints. A quoted message is a code
  span in the first column of a table whose first header cell is "message", or any code span on
  that page that starts as this project's messages start (`[rocm-vllm] `, `error: `,
  `warning: `, or a program's name and `ERROR: `). It is quoted as printed, with `<name>` or
  `...` for each part that varies. Every constant part (the text between those placeholders)
  must be in the source: *.py, *.sh, Dockerfile*, *.hcl and #! scripts, without docs/ and test
  code. A part may span several pieces of source text only where a program joins them: at an
  f-string field, a %s or {} of a format string, a shell expansion, or the end of a string.
"""
from __future__ import annotations

import ast
import bisect
import re
import subprocess
from functools import lru_cache
from pathlib import Path

from dockerfile_model import buildkit_parser, stages

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = ("Dockerfile.rocm_base", "Dockerfile.rocm")

# ------------------------------------------------------------------------------ stage lists

STAGE_LIST = re.compile(r"Stages of `([^`]+)`(?:, in order)?:((?:\s*`[^`]+`,?)+)")


def dockerfile_stages(name: str) -> list[str]:
    return [stage for stage, _, _ in stages(buildkit_parser().parse_file(str(ROOT / name))) if stage]


def documented_stages(markdown: str) -> dict[str, list[str]]:
    """{Dockerfile: [stage, ...]} of every "Stages of `Dockerfile...`: `a`, `b`, ..." list."""
    return {m.group(1): re.findall(r"`([^`]+)`", m.group(2)) for m in STAGE_LIST.finditer(markdown)}


def header_stages(dockerfile_text: str) -> list[str]:
    """The stage names of the "# Stages, ..." comment at the top of a Dockerfile: one per line,
    three spaces after the #; deeper-indented lines continue a description."""
    lines = dockerfile_text.split("# Stages", 1)[1].splitlines()[1:]
    names = []
    for line in lines:
        if not line.startswith("#   "):
            break
        m = re.match(r"#   ([a-z][a-z0-9-]*)(\s|$)", line)
        if m:
            names.append(m.group(1))
    return names


def test_building_md_lists_every_stage_of_each_dockerfile_in_order() -> None:
    listed = documented_stages((ROOT / "docs/building.md").read_text())
    for name in DOCKERFILES:
        assert name in listed, f"docs/building.md has no 'Stages of `{name}`: ...' list"
        assert listed[name] == dockerfile_stages(name), (
            f"docs/building.md's stages of {name} are not the file's (in order): "
            f"{listed[name]} != {dockerfile_stages(name)}")


def test_each_dockerfiles_header_lists_its_stages_in_order() -> None:
    for name in DOCKERFILES:
        assert header_stages((ROOT / name).read_text()) == dockerfile_stages(name), (
            f"the stage list at the top of {name} is not its stages (in order)")


def test_a_missing_or_misplaced_stage_is_caught() -> None:
    text = (ROOT / "docs/building.md").read_text()
    real = dockerfile_stages("Dockerfile.rocm_base")
    assert documented_stages(text)["Dockerfile.rocm_base"] == real
    without = re.sub(r"`aiter-verify`,\s*", "", text, count=1)
    assert documented_stages(without)["Dockerfile.rocm_base"] == [s for s in real if s != "aiter-verify"]
    swapped = documented_stages(f"Stages of `Dockerfile.rocm_base`: `{real[1]}`, `{real[0]}`.")["Dockerfile.rocm_base"]
    assert swapped != real[:2] and sorted(swapped) == sorted(real[:2])
    header = ("# Stages, named after what they produce:\n"
              "#   base   ROCm\n#          more of it\n#   torch  wheels\n# end\n")
    assert header_stages(header) == ["base", "torch"]


# ------------------------------------------------------------------------------ build variables

def bake_variables() -> set[str]:
    return set(re.findall(r'^variable "([A-Za-z_][A-Za-z0-9_]*)"', (ROOT / "docker-bake.hcl").read_text(), re.M))


def table_first_column(markdown: str, heading: str) -> list[str]:
    section = markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]


def test_building_md_build_variables_are_the_bake_files() -> None:
    documented = set(table_first_column((ROOT / "docs/building.md").read_text(), "Build variables"))
    unknown = documented - bake_variables()
    assert not unknown, f"docs/building.md's build variables that docker-bake.hcl does not declare: {sorted(unknown)}"
    # the CPU path's variables are documented with the CPU path
    elsewhere = set(re.findall(r"`([A-Z][A-Z0-9_]*)`", (ROOT / "docs/serving.md").read_text()))
    # settings are upper case; a lower-case variable is data (the pins file's, or read from it once)
    settings = {name for name in bake_variables() if not name.islower()}
    undocumented = settings - documented - elsewhere
    assert not undocumented, f"docker-bake.hcl variables no page documents: {sorted(undocumented)}"


# ------------------------------------------------------------------------------ quoted messages

# How this project's messages start: the runtime's "[rocm-vllm] ", a level, or a program's name
# and a level.
LEVEL = r"(error|warning|ERROR|WARNING): "
MESSAGE_START = re.compile(rf"^(\[rocm-vllm\] |{LEVEL}|[a-z][a-z0-9_.-]*: {LEVEL})")
# A part of a quoted message that varies.
PLACEHOLDER = re.compile(r"\.\.\.|…|<[A-Za-z][\w .-]*>")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def span_text(raw: str) -> str:
    """A code span's text: one line, one space stripped from each end when both have one, and a
    table's escaped | unescaped."""
    text = re.sub(r"\s+", " ", raw)
    if text.startswith(" ") and text.endswith(" ") and text.strip():
        text = text[1:-1]
    return text.replace("\\|", "|")


def quoted_messages(markdown: str) -> list[str]:
    """The messages a page quotes: each code span of a "message" table's first column, and every
    code span (or code block line) that starts as this project's messages do."""
    found: list[str] = []
    for block in FENCE.findall(markdown):
        found += [line.strip() for line in block.splitlines()[1:-1] if MESSAGE_START.match(line.strip())]
    prose = FENCE.sub("", markdown)
    table: list[str] = []  # the current table's header cells
    first_cells: list[str] = []
    for line in prose.splitlines():
        if not line.startswith("|"):
            table = []
            continue
        cells = [c.strip() for c in CELL_SPLIT.split(line.strip().strip("|"))]
        if not table:
            table = cells
        elif not re.fullmatch(r"[-:| ]+", line) and table[0].lower().startswith("message"):
            first_cells.append(cells[0])
    for cell in first_cells:
        found += [span_text(m.group(2)) for m in CODE_SPAN.finditer(cell) if span_text(m.group(2)) not in found]
    for m in CODE_SPAN.finditer(prose):
        text = span_text(m.group(2))
        if MESSAGE_START.match(text) and text not in found:
            found.append(text)
    return found


def constant_parts(message: str) -> list[str]:
    return [part.strip() for part in PLACEHOLDER.split(message) if part.strip()]


def source_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    files = []
    for name in sorted(set(out)):
        parts = Path(name).parts
        if parts[0] == "docs" or "tests" in parts or parts[-1] == "conftest.py":
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        if name.endswith((".py", ".sh", ".hcl")) or parts[-1].startswith("Dockerfile") or _shebang(path):
            files.append(path)
    return files


def _shebang(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == b"#!"


# Where a program joins text inside a string: %s-style and {}-style format fields.
FORMAT_FIELD = re.compile(r"%[-#0 +]*(?:\d+|\*)?(?:\.\d+)?[sdrifx]|\{[^{}]*\}")
# ... and in shell-like text: quotes and expansions.
SHELL_JOIN = re.compile(r'(?<!\\)"|\$\{[^}]*\}|\$\([^)]*\)|\$[A-Za-z_][A-Za-z0-9_]*|\$[0-9*@#?!$-]|\{[^{}\s]*\}')


def python_pieces(text: str) -> list[str]:
    """The strings of a Python file, split where it joins text into them; docstrings (strings as
    statements) print nothing and are left out."""
    tree = ast.parse(text)
    statements = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    pieces: list[str] = []
    for node in ast.walk(tree):
        if id(node) in statements:
            continue
        if isinstance(node, ast.JoinedStr):
            current = ""
            for value in node.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    current += value.value
                else:
                    pieces.append(current)
                    current = ""
            pieces.append(current)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            pieces += FORMAT_FIELD.split(node.value)
    return pieces


def shell_pieces(text: str) -> list[str]:
    return [piece for line in text.splitlines() for piece in SHELL_JOIN.split(line)]


class Source:
    """The pieces of text the repository's programs print from, and whether a constant part of a
    message is made of them."""

    def __init__(self, pieces: list[str]) -> None:
        pieces = sorted({re.sub(r"\s+", " ", p) for p in pieces if p.strip()})
        self.whole = set(pieces)
        self.text = "\0" + "\0".join(pieces) + "\0"
        self.starts = pieces
        self.ends = sorted(p[::-1] for p in pieces)

    @staticmethod
    def _begins(sorted_pieces: list[str], prefix: str) -> bool:
        i = bisect.bisect_left(sorted_pieces, prefix)
        return i < len(sorted_pieces) and sorted_pieces[i].startswith(prefix)

    def has(self, part: str) -> bool:
        """part is inside one piece, or is the end of a piece, whole pieces, then the start of one."""
        if part in self.text:
            return True
        reached = [i for i in range(1, len(part)) if self._begins(self.ends, part[:i][::-1])]
        seen = set(reached)
        while reached:
            i = reached.pop()
            if self._begins(self.starts, part[i:]):
                return True
            for j in range(i + 1, len(part)):
                if j not in seen and part[i:j] in self.whole:
                    seen.add(j)
                    reached.append(j)
        return False

    def missing(self, message: str) -> list[str]:
        return [part for part in constant_parts(message) if not self.has(part)]


@lru_cache(maxsize=1)
def source() -> Source:
    pieces: list[str] = []
    for path in source_files():
        text = path.read_text(errors="replace")
        python = path.suffix == ".py" or (path.suffix == "" and "python" in text.split("\n", 1)[0])
        if python:
            try:
                pieces += python_pieces(text)
                continue
            except SyntaxError:
                pass
        pieces += shell_pieces(text)
    return Source(pieces)


def test_every_message_troubleshooting_md_quotes_is_printed_by_the_code() -> None:
    messages = quoted_messages((ROOT / "docs/troubleshooting.md").read_text())
    assert len(messages) >= 10, f"docs/troubleshooting.md: only {len(messages)} quoted messages found: {messages}"
    unknown = {m: source().missing(m) for m in messages if source().missing(m)}
    assert not unknown, ("docs/troubleshooting.md quotes messages no code prints (message: parts not found; "
                         f"write a part that varies as <name> or ...): {unknown}")


def test_message_extraction_and_a_made_up_message() -> None:
    page = "\n".join([
        "Prose with `[rocm-vllm] error: in prose <x>` and a command `docker compose up`.",
        "",
        "| message | what to do |",
        "|---|---|",
        "| `first: one <n> two ...` (or ``second `quoted` part``) | run `error: not in the first column` |",
        "| `a \\| b` | nothing |",
        "",
        "| symptom | what to do |",
        "|---|---|",
        "| `Permission denied` | `chown` |",
        "",
        "```",
        "pinned-dists: ERROR: in a block",
        "echo not a message",
        "```",
    ])
    assert quoted_messages(page) == [
        "pinned-dists: ERROR: in a block", "first: one <n> two ...", "second `quoted` part", "a | b",
        "[rocm-vllm] error: in prose <x>", "error: not in the first column"]
    assert constant_parts("first: one <n> two ... three … four") == ["first: one", "two", "three", "four"]

    src = Source(python_pieces('"""error: a docstring prints nothing"""\nLOG = "[rocm-vllm]"\n'
                               'print(f"{LOG} error: {problem}")\n'
                               'problem = f"cannot open {node} ({why}): " "set X"\n'
                               'log("%s: not registered", p)\n')
                 + shell_pieces('fail() { echo "aiter-src: ERROR: $*" >&2; }\nfail "$1 is UNRESOLVED here"\n'))
    for printed in ("[rocm-vllm] error: cannot open <node> (<why>): set X", "... : not registered",
                    "aiter-src: ERROR: <pin> is UNRESOLVED here", "cannot open"):
        assert src.missing(printed) == [], printed
    # joined only where a program joins text, never inside a string
    assert src.missing("[rocm-vllm] error: open <node>") == ["[rocm-vllm] error: open"]
    assert src.missing("error: the frobnicator is out of sync") == ["error: the frobnicator is out of sync"]
    assert src.missing("error: a docstring prints nothing") == ["error: a docstring prints nothing"]
    assert source().missing("[rocm-vllm] error: the frobnicator is out of sync <n>") == [
        "[rocm-vllm] error: the frobnicator is out of sync"]
    # a message the page really quotes, with one word changed, is caught
    real = next(m for m in quoted_messages((ROOT / "docs/troubleshooting.md").read_text())
                if "cannot open the render node" in m)
    assert source().missing(real) == []
    assert source().missing(real.replace("render node", "render device")) != []
