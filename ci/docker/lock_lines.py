#!/usr/bin/env python3
"""A hash lock's contents, read as pip reads a requirements file, and held to what a lock is: the
one reading of a lock's body (install_lock.sh before pip reads it; python3 -m ci.pins verify).

    python3 lock_lines.py LOCK     exit 0 when LOCK holds pins and hashes alone; else one line
                                   naming LOCK and the line, exit status 1

A lock is a list of requirements `name==version` (extras allowed: name[a,b]==version), each followed
by one or more `--hash=sha256:<64 hex>` entries, with comments, blank lines and `\\` continuations
around them, and nothing else. Anything else would let pip read what the pin does not cover,
whatever the lock's sha256: an index or link option (--index-url, --extra-index-url, --find-links,
--trusted-host, --no-index), an include (-r, -c), an editable or direct URL (`name @ URL`), a range
or a wildcard, an environment marker, a ${VARIABLE} (pip expands it), another per-requirement
option (--config-settings). The file is plain ASCII without control characters (pip splits lines
at form feeds and other separators) and declares no encoding (pip decodes by a BOM or a PEP 263
line: UTF-7 turns `+AAo-` into a line break).

Lines are joined as pip joins them (a line ending in `\\` continues on the next unless it is a
comment line; a comment line ends the continuation) and comments removed as pip removes them
(`#` at the start or after whitespace). A refusal says what the line is (its option name, or its
kind), never its values: a line may hold an index's credentials.

Standard library only: it runs in the base image's build stages before anything is installed.
"""
from __future__ import annotations

import re
import sys

# pip's comment rule and PEP 263 encoding declaration (pip/_internal/req/req_file.py, utils/encoding.py)
COMMENT = re.compile(r"(^|\s+)#.*$")
ENCODING = re.compile(rb"coding[:=]\s*([-\w.]+)")
# name[extras]==version: a PEP 508 name, PEP 440 version characters (no wildcard, no ===)
PIN = re.compile(r"\A([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
                 r"==([A-Za-z0-9](?:[A-Za-z0-9.+!_-]*[A-Za-z0-9])?)\Z")
HASH = re.compile(r"\A--hash=sha256:[0-9a-f]{64}\Z")
OPTION_NAME = re.compile(r"\A(--?[A-Za-z][A-Za-z0-9-]*)")
_ALLOWED = frozenset(chr(c) for c in range(0x20, 0x7F)) | {"\n"}


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line pip reads: continuations joined as pip joins
    them, comments removed, blank lines left out."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.endswith("\\") or COMMENT.match(line):
            if COMMENT.match(line):
                line = " " + line
            if pending:
                pending.append(line)
                joined, pending = "".join(pending), []
            else:
                joined, start = line, number
            joined = COMMENT.sub("", joined).strip()
            if joined:
                out.append((start, joined))
        else:
            if not pending:
                start = number
            pending.append(line.strip("\\"))
    if pending:
        joined = COMMENT.sub("", "".join(pending)).strip()
        if joined:
            out.append((start, joined))
    return out


def _what(token: str) -> str:
    """What a token is, without its value."""
    option = OPTION_NAME.match(token)
    if option:
        return f"the option {option.group(1)}"
    return "a word that is not a --hash=sha256: entry"


def _line_problem(line: str) -> str | None:
    words = [w for w in line.split(" ") if w]
    first = words[0]
    if first.startswith("-"):
        return f"{_what(first)}, not a requirement"
    if "@" in line.split(" --", 1)[0] or "://" in first:
        return "a direct URL requirement (name @ URL), not name==version"
    if ";" in line:
        return "an environment marker: a lock pins one platform's wheels, name==version alone"
    if not PIN.match(first):
        return "not name==version (a pin of one version: no range, wildcard, marker or variable)"
    hashes = words[1:]
    other = next((w for w in hashes if not HASH.match(w)), None)
    if other is not None:
        if other.startswith("--hash"):
            return "a --hash entry that is not sha256:<64 lowercase hex> (no --hash=sha256 for this pin)"
        return f"{_what(other)} after the pin (only --hash=sha256: entries may follow it)"
    if not hashes:
        return "no --hash=sha256: entry for this pin"
    return None


def problem(name: str, data: bytes) -> str | None:
    """None when `data` (a lock's bytes) holds pins and hashes alone; else one line naming the lock
    (`name`) and the line, and what is wrong with it."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        return f"{name}:{line}: not ASCII: a lock is plain ASCII (pip would decode it by a BOM or a coding line)"
    for number, raw in enumerate(data.split(b"\n")[:2], 1):
        if raw[:1] == b"#" and ENCODING.search(raw):
            return f"{name}:{number}: an encoding declaration: pip would decode the lock by it; a lock declares none"
    bad = next((i for i, c in enumerate(text) if c not in _ALLOWED), None)
    if bad is not None:
        line = text[:bad].count("\n") + 1
        return (f"{name}:{line}: a control character (U+{ord(text[bad]):04X}): pip splits lines at some; a lock "
                "holds none")
    lines = logical_lines(text)
    for number, line in lines:
        why = _line_problem(line)
        if why:
            return (f"{name}:{number}: {why}: a lock holds name==version pins with their --hash=sha256: entries "
                    "and nothing else (no index, link, include or URL)")
    if not lines:
        return f"{name}: holds no requirement"
    return None


def requirements(data: bytes) -> list[tuple[str, str]]:
    """(name, version) of each pin of a lock that `problem` accepts, in order."""
    out = []
    for _, line in logical_lines(data.decode("ascii")):
        m = PIN.match(line.split(" ", 1)[0])
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: lock_lines.py LOCK", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as f:
            data = f.read()
    except OSError as exc:
        print(f"{argv[0]}: cannot read the lock: {exc.strerror}", file=sys.stderr)
        return 1
    why = problem(argv[0], data)
    if why:
        print(why, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
