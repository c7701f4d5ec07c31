#!/usr/bin/env python3
"""A hash lock holds `name==version` pins (extras allowed), each with `--hash=sha256:<64 hex>`
entries, comments and blank lines, nothing else: no option, include, URL, range, wildcard, marker
or ${VARIABLE}; plain ASCII without control characters or an encoding declaration. A version is a
PEP 440 version, and no pin ends as an archive's file name does: pip reads `demo==1.0.zip` (or
`demo==1.0+x.tar.gz`) as a local archive in its working folder and builds it, past --index-url. Lines are
joined and comments removed as pip does; a refusal names the line's kind, never its values.

    python3 lock_lines.py LOCK     exit 0 for a lock of pins and hashes; else one line, exit 1

Standard library only: install_lock.sh runs it before anything is installed.
"""
from __future__ import annotations

import re
import sys

# pip's comment rule and PEP 263 encoding declaration (pip/_internal/req/req_file.py, utils/encoding.py)
COMMENT = re.compile(r"(^|\s+)#.*$")
ENCODING = re.compile(rb"coding[:=]\s*([-\w.]+)")
PIN = re.compile(r"\A([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
                 r"==([A-Za-z0-9](?:[A-Za-z0-9.+!_-]*[A-Za-z0-9])?)\Z")
HASH = re.compile(r"\A--hash=sha256:[0-9a-f]{64}\Z")
# PEP 440's version grammar (packaging.version's, which the build stages lack when they install
# their first lock; tests/test_lock_contents.py holds the two to the same answers): epoch, release,
# pre, post, dev and local segments, their spellings and separators.
VERSION = re.compile(r"""
    v?(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*
    (?:[-_.]?(?:alpha|a|beta|b|preview|pre|c|rc)[-_.]?[0-9]*)?
    (?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?
    (?:[-_.]?dev[-_.]?[0-9]*)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?""", re.VERBOSE | re.IGNORECASE)
# What pip takes for an archive file (pip/_internal/utils/filetypes.py): a requirement ending so is
# read as a path.
ARCHIVE_ENDINGS = (".zip", ".whl", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tlz", ".tar.lz", ".tar.lzma",
                   ".tar.gz", ".tgz", ".tar")
OPTION_NAME = re.compile(r"\A(--?[A-Za-z][A-Za-z0-9-]*)")


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each non-blank line as pip joins and uncomments them."""
    out, pending, start = [], [], 0
    for number, line in enumerate([*text.splitlines(), ""], 1):
        if not pending:
            start = number
        if line.endswith("\\") and not COMMENT.match(line):
            pending.append(line.strip("\\"))
            continue
        joined = COMMENT.sub("", "".join(pending) + (" " + line if COMMENT.match(line) else line)).strip()
        pending = []
        if joined:
            out.append((start, joined))
    return out


def _what(token: str) -> str:
    option = OPTION_NAME.match(token)
    return f"the option {option.group(1)}" if option else "a word that is not a --hash=sha256: entry"


def _line_problem(line: str) -> str | None:
    first, *hashes = line.split()
    if first.startswith("-"):
        return f"{_what(first)}, not a requirement"
    if "@" in line.split(" --", 1)[0] or "://" in first:
        return "a direct URL requirement (name @ URL), not name==version"
    if ";" in line:
        return "an environment marker: a lock pins one platform's wheels, name==version alone"
    pin = PIN.match(first)
    if not pin:
        return "not name==version (a pin of one version: no range, wildcard, marker or variable)"
    if not VERSION.fullmatch(pin.group(2)):
        return "a version that is not a PEP 440 version (such as 2.9.1 or 2.9.1+rocm7.0): pip may read it as a file"
    if first.lower().endswith(ARCHIVE_ENDINGS):
        return "a pin that ends as an archive's file name does (.zip, .whl, .tar.gz, ...): pip reads it as a file"
    other = next((w for w in hashes if not HASH.match(w)), None)
    if other is not None and other.startswith("--hash"):
        return "a --hash entry that is not sha256:<64 lowercase hex> (no --hash=sha256 for this pin)"
    if other is not None:
        return f"{_what(other)} after the pin (only --hash=sha256: entries may follow it)"
    return None if hashes else "no --hash=sha256: entry for this pin"


def problem(name: str, data: bytes) -> str | None:
    """None when `data` (a lock's bytes) holds pins and hashes alone; else one line naming `name`
    and the line."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        return f"{name}:{line}: not ASCII: a lock is plain ASCII (pip would decode it by a BOM or a coding line)"
    for number, raw in enumerate(data.split(b"\n")[:2], 1):
        if raw[:1] == b"#" and ENCODING.search(raw):
            return f"{name}:{number}: an encoding declaration: pip would decode the lock by it; a lock declares none"
    bad = next((i for i, c in enumerate(text) if not (" " <= c <= "~" or c == "\n")), None)
    if bad is not None:
        line = text[:bad].count("\n") + 1
        return f"{name}:{line}: a control character (U+{ord(text[bad]):04X}): pip splits lines at some; a lock has none"
    lines = logical_lines(text)
    for number, line in lines:
        why = _line_problem(line)
        if why:
            return (f"{name}:{number}: {why}: a lock holds name==version pins with their --hash=sha256: entries "
                    "and nothing else (no index, link, include or URL)")
    return None if lines else f"{name}: holds no requirement"


def requirements(data: bytes) -> list[tuple[str, str]]:
    """(name, version) of each pin of a lock that `problem` accepts, in order."""
    pins = (PIN.match(line.split(" ", 1)[0]) for _, line in logical_lines(data.decode("ascii")))
    return [m.groups() for m in pins if m]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: lock_lines.py LOCK", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as f:
            why = problem(argv[0], f.read())
    except OSError as exc:
        why = f"{argv[0]}: cannot read the lock: {exc.strerror}"
    if why:
        print(why, file=sys.stderr)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
