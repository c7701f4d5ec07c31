"""Every lock read through the one lock reader, docker/lock_lines.py: the shell scripts (every *.sh,
the shell scripts of ci/ and docker/ without the ending, .ci/run) and the Dockerfiles' RUN steps ask
it (`lock_lines.py entry|version|pins|input-sha256 LOCK ...`) instead of reading a lock with awk,
sed, grep or cut, or line by line with read or mapfile. A lock is a `*.lock` file, a `*.txt` file of
docker/ or docker/locks/ (also as `$here/...txt` in docker/'s scripts), or a file a variable named for
a lock holds (`$lock`, `$locks/...`, `$PYTORCH_LOCK`). Such a parse would miss what the reader
refuses (an option, a URL, a second entry) and read `\\` continuations and comments otherwise than pip.

What remains is counted in ALLOWED, per file with its reason, so that a further one fails, and an
entry whose uses are gone fails until it is removed. The scanner is checked against planted reads and
against each of the reads it replaced."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from dockerfile_model import buildkit_parser
from owner_scan import shebang_shell

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = ("Dockerfile.rocm", "Dockerfile.rocm_base", "tests/docker/vllm-cpu.Dockerfile")
PARSERS = {"awk", "gawk", "mawk", "sed", "grep", "egrep", "fgrep", "cut"}
LINE_READERS = {"read", "mapfile", "readarray"}
# Words before a command's name: shell keywords, and prefixes that run the command after them.
PREFIXES = {"if", "then", "else", "elif", "do", "while", "until", "!", "time", "command", "exec", "env"}
LOCK = re.compile(r"""\.lock\b|(?:\bdocker/(?:locks/)?|\$\{?here\}?/(?:locks/)?)[^\s/"']+\.txt\b|"""
                  r"""\$\{?[A-Za-z_]*(?:lock|LOCK)[A-Za-z_]*\}?(?![A-Za-z_])""")

# file -> (how many, why)
ALLOWED: dict[str, tuple[int, str]] = {}


def scripts() -> list[Path]:
    found = [p for p in ROOT.rglob("*.sh") if p.is_file() and not _skipped(p)]
    found += [p for area in ("ci", "docker") for p in (ROOT / area).rglob("*")
              if p.is_file() and p.suffix == "" and shebang_shell(p) and not _skipped(p)]
    return sorted(set(found + [ROOT / ".ci/run"]))


def _skipped(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return rel.startswith((".git/", ".venv/")) or "/node_modules/" in rel


def commands(code: str) -> list[tuple[str, str]]:
    """(simple command, the separator after it) of shell code: split at unquoted ; | & ( ) { } and
    newlines, and into each $( ), <( ) or `...`; quotes kept, comments left out."""
    out: list[tuple[str, str]] = []
    word: list[str] = []
    quote = ""  # "'" or '"' while inside one
    i = 0

    def end(separator: str) -> None:
        text = "".join(word).strip()
        if text:
            out.append((text, separator))
        word.clear()

    while i < len(code):
        c = code[i]
        if quote == "'":
            word.append(c)
            quote = "" if c == "'" else quote
        elif c == "\\" and i + 1 < len(code):
            word.append(code[i:i + 2])
            i += 1
        elif code.startswith(("$(", "<(", ">("), i) and not code.startswith("$((", i):
            end(code[i:i + 2])
            i += 1
        elif c == "`":
            end(c)
        elif quote == '"':
            word.append(c)
            quote = "" if c == '"' else quote
        elif c in "'\"":
            word.append(c)
            quote = c
        elif c == "#" and (not word or word[-1] in " \t"):
            while i < len(code) and code[i] != "\n":
                i += 1
            continue
        elif c in ";|&(){}\n":
            end(c)
        else:
            word.append(c)
        i += 1
    end("")
    return out


def _words(command: str) -> list[str]:
    return re.findall(r"""(?:'[^']*'|"(?:\\.|[^"\\])*"|\\.|[^\s'"])+""", command)


def _name(words: list[str]) -> str:
    """The command a simple command runs: past keywords, prefixes and NAME=value assignments."""
    for word in words:
        if word in PREFIXES or re.match(r"[A-Za-z_][A-Za-z0-9_]*=", word):
            continue
        return word.rsplit("/", 1)[-1]
    return ""


def _lock_words(words: list[str]) -> list[str]:
    """The words that name a lock: operands and redirections, a parser's quoted program left out."""
    return [w for w in words if not w.startswith("'") and LOCK.search(w.lstrip("<").strip("\"'"))]


def reads(code: str) -> list[str]:
    """Each command of `code` that reads a lock without the reader: a parser given a lock, a parser a
    lock is piped into (`cat LOCK | awk`), a read, mapfile or loop (`done < LOCK`) fed from one."""
    found = []
    parts = commands(code)
    for n, (command, separator) in enumerate(parts):
        words = _words(command)
        name = _name(words)
        locks = _lock_words(words)
        if name in PARSERS and locks:
            found.append(command)
        elif name in LINE_READERS | {"done"} and any(w.startswith("<") or words[words.index(w) - 1] == "<"
                                                      for w in locks):
            found.append(command)
        elif name == "cat" and locks and separator == "|" and n + 1 < len(parts) \
                and _name(_words(parts[n + 1][0])) in PARSERS:
            found.append(f"{command} | {parts[n + 1][0]}")
    return found


def shell_text(path: Path) -> str:
    """A script's text with its `\\` continuations joined."""
    return path.read_text(errors="replace").replace("\\\n", " ")


def run_steps(path: Path) -> list[str]:
    """The shell of each RUN step of a Dockerfile (BuildKit's parser: continuations joined)."""
    parser = buildkit_parser()
    return [" ".join(c.value) for c in parser.parse_file(str(path)) if c.cmd.upper() == "RUN"]


def all_reads() -> Counter:
    count: Counter = Counter()
    lines: dict[str, list[str]] = {}
    for path in scripts():
        rel = path.relative_to(ROOT).as_posix()
        for command in reads(shell_text(path)):
            count[rel] += 1
            lines.setdefault(rel, []).append(command)
    for rel in DOCKERFILES:
        for step in run_steps(ROOT / rel):
            for command in reads(step):
                count[rel] += 1
                lines.setdefault(rel, []).append(command)
    all_reads.lines = lines  # type: ignore[attr-defined]
    return count


def test_every_lock_is_read_through_the_reader() -> None:
    count = all_reads()
    wrong = [f"{rel}: {command[:160]}" for rel, n in sorted(count.items()) if n > ALLOWED.get(rel, (0, ""))[0]
             for command in all_reads.lines[rel]]  # type: ignore[attr-defined]
    assert not wrong, ("ask docker/lock_lines.py (entry, version, pins, input-sha256) instead of reading the "
                       "lock with a text tool:\n" + "\n".join(wrong))


def test_each_allowed_read_is_still_there() -> None:
    count = all_reads()
    stale = [f"{rel}: {n} allowed, {count[rel]} found" for rel, (n, _) in ALLOWED.items() if count[rel] != n]
    assert not stale, "\n".join(stale)


def test_the_scan_sees_the_scripts_and_steps() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in scripts()}
    assert {"ci/test.sh", ".ci/run", "docker/install_torch.sh", "docker/aiter_requirements.sh",
            "serve-cpu.sh", "runtime/entrypoint.sh"} <= names, names
    assert any("lock_lines.py version" in step for step in run_steps(ROOT / "Dockerfile.rocm"))


# The reads this scan replaced, as they stood: each is caught.
REPLACED = {
    "ci/test.sh": "uv_entry=$(awk '/^uv==/ {keep = 1; print; next} keep && /^ / {print; next} {keep = 0}' "
                  "tests/requirements.lock)",
    "Dockerfile.rocm": "mkdir -p /staging && RAY_VERSION=$(sed -n 's/^ray==\\([^ ]*\\) .*/\\1/p' "
                       "/opt/rocm-vllm/docker/requirements-ray.txt)  && export RAY_VERSION",
    "docker/install_torch.sh (versions)": 'grep -qxF -e "$req \\\\" -e "$req" "$lock" || die "x"',
    "docker/install_torch.sh (Triton)": "mapfile -t tritons < <(grep -oE '^[A-Za-z0-9._-]*triton[A-Za-z0-9._-]*=="
                                        "[^ ;\\\\]+' \"$lock\")",
    "docker/aiter_requirements.sh": "recorded=$(sed -n 's/^# input requirements\\.txt sha256:\\([0-9a-f]\\{64\\}\\)$"
                                    "/\\1/p' \"$lock\")",
}


def test_the_scan_catches_each_read_it_replaced() -> None:
    for where, code in REPLACED.items():
        assert len(reads(code)) == 1, (where, reads(code))


def test_the_scan_catches_planted_reads_and_passes_others() -> None:
    planted = """
v=$(grep '^ray==' docker/requirements-ray.txt | cut -d= -f3)
awk '/^torch==/' "$locks/$PYTORCH_LOCK"
x=$(cut -d' ' -f1 < "$here/requirements-scripts.txt")
while read -r line; do echo "$line"; done < "$lock"
mapfile -t lines < tests/requirements.lock
cat "${THEROCK_LOCK}" | sed -n 1p
if grep -q torch docker/locks/vllm-0.34-rocm.txt; then echo x; fi
"""
    assert len(reads(planted)) == 7, reads(planted)
    fine = """
# grep '^uv==' tests/requirements.lock in a comment
actual=$(sha256sum "$lock" | cut -d' ' -f1)
actual=$(sha256sum "$src/requirements.txt" | cut -d' ' -f1)
key=$( { python3 --version; cat tests/requirements.lock; } | sha256sum | cut -c1-16)
echo "error: grep the lock; cut out of tests/requirements.lock by hand" >&2
v=$(python3 -B docker/lock_lines.py version docker/requirements-ray.txt ray 2>&1)
grep -q x "$src/requirements.txt"
mapfile -t pins <<<"$listed"
"""
    assert reads(fine) == [], reads(fine)
