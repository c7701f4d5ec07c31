#!/usr/bin/env python3
"""A hash lock holds `name==version` pins (extras allowed), each with `--hash=sha256:<64 hex>`
entries, comments and blank lines, nothing else: no option, include, URL, range, wildcard, marker
or ${VARIABLE}; plain ASCII without control characters or an encoding declaration. A version is a
PEP 440 version, and no pin ends as an archive's file name does: pip reads `demo==1.0.zip` (or
`demo==1.0+x.tar.gz`) as a local archive in its working folder and builds it, past --index-url. Lines are
joined and comments removed as pip does; a refusal names the line's kind, never its values.

    python3 lock_lines.py LOCK                      exit 0 for a lock of pins and hashes; else one line, exit 1
    python3 lock_lines.py entry LOCK NAME           NAME's pin as pip reads it, one line: name==version --hash=...
    python3 lock_lines.py version LOCK NAME         the version NAME is pinned at
    python3 lock_lines.py pins LOCK                 name==version of each pin, one a line, in the lock's order
    python3 lock_lines.py input-sha256 LOCK INPUT   the sha256 of INPUT that the lock's header records
                                                    (`# input INPUT sha256:<64 hex>`)

The questions read only a lock this module accepts, and compare names as pip does (case, and runs of
-_. alike). Each failure is one line on stderr naming the lock: exit 1 when the lock lacks what was
asked, 2 when it cannot be read or is not a lock (or the command is wrong). The shell scripts and
Dockerfile steps ask these instead of reading a lock with awk, sed, grep or cut
(tests/test_shell_lock_reads.py).

Standard library only: install_lock.sh runs it before anything is installed.
"""
from __future__ import annotations

import os
import re
import stat
import sys

# pip's comment rule and PEP 263 encoding declaration (pip/_internal/req/req_file.py, utils/encoding.py)
COMMENT = re.compile(r"(^|\s+)#.*$")
ENCODING = re.compile(rb"coding[:=]\s*([-\w.]+)")
PIN = re.compile(r"\A([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
                 r"==([A-Za-z0-9](?:[A-Za-z0-9.+!_-]*[A-Za-z0-9])?)\Z")
HASH = re.compile(r"\A--hash=sha256:[0-9a-f]{64}\Z")
# PEP 440's version grammar (packaging.version's, which the build stages lack when they install
# their first lock; tests/test_lock_lines_contents.py holds the two to the same answers): epoch, release,
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


class Missing(Exception):
    """The lock lacks what was asked (exit 1)."""


class Unreadable(Exception):
    """The lock cannot be read, or is not a lock (exit 2)."""


def normalized(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: str) -> bytes:
    """A lock's bytes, once `problem` accepts them."""
    try:
        # opened without waiting (a FIFO's writer would be waited for) and read only when a regular file
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise Unreadable(f"{path}: cannot read the lock: not a regular file (a folder, device or pipe)")
        with os.fdopen(fd, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise Unreadable(f"{path}: cannot read the lock: {exc.strerror}") from None
    why = problem(path, data)
    if why:
        raise Unreadable(why)
    return data


def entry(path: str, name: str) -> str:
    """NAME's logical line (name==version --hash=sha256:...) in the lock at `path`, its words one space apart."""
    found = [line for _, line in logical_lines(read_lock(path).decode("ascii"))
             if normalized(line.split("==", 1)[0].split("[", 1)[0]) == normalized(name)]
    if not found:
        raise Missing(f"{path} has no entry for {name}")
    if len(found) > 1:
        raise Unreadable(f"{path} pins {name} {len(found)} times: a lock pins each name once")
    return " ".join(found[0].split())


def version(path: str, name: str) -> str:
    return requirements(entry(path, name).encode())[0][1]


def pins(path: str) -> list[str]:
    return [f"{name}=={version}" for name, version in requirements(read_lock(path))]


def input_sha256(path: str, source: str) -> str:
    """The sha256 of `source` that the lock's header records (`# input SOURCE sha256:<64 hex>`)."""
    header = re.compile(rf"# input {re.escape(source)} sha256:([0-9a-f]{{64}})")
    found = {m.group(1) for line in read_lock(path).decode("ascii").split("\n") if (m := header.fullmatch(line))}
    if not found:
        raise Missing(f"{path} records no {source} sha256 (# input {source} sha256:<64 hex>)")
    if len(found) > 1:
        raise Unreadable(f"{path} records {len(found)} sha256s of {source}: a lock records its input once")
    return found.pop()


QUESTIONS = {"entry": (entry, "LOCK NAME"), "version": (version, "LOCK NAME"),
             "pins": (lambda path: "\n".join(pins(path)), "LOCK"), "input-sha256": (input_sha256, "LOCK INPUT")}


def main(argv: list[str]) -> int:
    if argv and argv[0] in QUESTIONS:
        answer, usage = QUESTIONS[argv[0]]
        if len(argv) != len(usage.split()) + 1:
            print(f"usage: lock_lines.py {argv[0]} {usage}", file=sys.stderr)
            return 2
        try:
            print(answer(*argv[1:]))
        except Missing as exc:
            print(exc, file=sys.stderr)
            return 1
        except Unreadable as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    if len(argv) != 1:
        print(f"usage: lock_lines.py LOCK, or lock_lines.py {{{','.join(QUESTIONS)}}} LOCK ...", file=sys.stderr)
        return 2
    try:
        read_lock(argv[0])
    except Unreadable as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
