#!/usr/bin/env python3
"""vLLM's requirement files, read where they are (their `-r` includes are relative to their own
folder), against this project's pins.

    vllm_requirements.py files SRC
        every file of SRC that the vLLM build scripts name exists (one line per missing file)
    vllm_requirements.py build-tools SRC TOOLS
        the build tools pinned in TOOLS (a hash-pinned requirements file) satisfy what vLLM's
        ROCm build requirements (requirements/build/rocm.txt; in 0.34 rock.txt) ask of them; its
        lines for the base image's pinned
        distributions (torch, Triton, amdsmi, ...) are reported, never installed: the base
        image's builds are kept
    vllm_requirements.py triton-kernels SRC COMMIT
        vLLM's CMake fetches ROCm triton_kernels at COMMIT (versions.json vllm.triton_kernels)
    vllm_requirements.py lock SRC LOCK
        LOCK (ci/locks/vllm-<track>-rocm.txt, made by python3 -m ci.pins lock from the track's
        sdist) was made from exactly SRC's requirements/rocm.txt and the files it includes (the
        `# input PATH sha256:HEX` lines of its header)

Requirement files are read as pip reads them: `\\` continuations joined, comments removed,
`-r` includes followed (relative to the including file), options skipped (per requirement:
--hash=...); each requirement is parsed by `packaging` (names, extras, versions, markers, URLs).

Errors: one line each naming the file and the setting to change; exit status 1.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    sys.exit("vllm-requirements: ERROR: the Python package `packaging` is not installed in this Python: "
             "install ci/docker/requirements-scripts.txt (the base image's torch stage does)")

# Installed metadata is read by the build scripts' one reader, pinned_dists.py (beside this file).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pinned_dists import Problem, shown  # noqa: E402

# vLLM's ROCm build requirements, by release, the first a source has: requirements/build/rocm.txt
# up to 0.33 (0.33 has TheRock's rock.txt beside it); 0.34, which builds on TheRock ROCm only, has
# requirements/build/rock.txt alone.
BUILD_REQUIREMENTS = ("requirements/build/rocm.txt", "requirements/build/rock.txt")
RUNTIME_REQUIREMENTS = "requirements/rocm.txt"
# Every file of the vLLM source the scripts of this directory name (besides the build requirements).
NAMED_FILES = (
    RUNTIME_REQUIREMENTS,
    "requirements/common.txt",
    "cmake/external_projects/triton_kernels.cmake",
    "setup.py",
    "CMakeLists.txt",
)
PINNED = {"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm", "triton-rocm", "amdsmi", "amd-aiter"}


# pip's comment rule: `#` at the start of a line or after whitespace (a URL's #fragment stays).
COMMENT = re.compile(r"(^|\s+)#.*$")
INCLUDE = re.compile(r"^(?:-r|--requirement)(?:\s*=\s*|\s+|(?=[^-\s]))(\S+)$")


def logical_lines(path: Path) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line of a requirements file: lines ending in
    a backslash joined to the next, then comments removed, blank lines left out."""
    out, pending, start = [], "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        if not pending:
            start = number
        if raw.endswith("\\") and not COMMENT.match(raw):
            pending += raw[:-1] + " "
            continue
        line = COMMENT.sub("", pending + raw).strip()
        pending = ""
        if line:
            out.append((start, line))
    if pending.strip():
        out.append((start, COMMENT.sub("", pending).strip()))
    return out


def requirement_part(line: str) -> str:
    """The requirement of a line without the options that may follow it (--hash=...)."""
    words = line.split()
    cut = next((i for i, word in enumerate(words) if word.startswith("-")), len(words))
    return " ".join(words[:cut])


def read_requirements(path: Path, seen=None) -> list[tuple[Path, Requirement]]:
    """(file, requirement) of every requirement line, `-r` includes followed relative to the
    including file's folder; option lines (--extra-index-url, -c, ...) skipped."""
    seen = set() if seen is None else seen
    path = path.resolve()
    if path in seen:
        return []
    seen.add(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such requirements file")
    out = []
    for number, line in logical_lines(path):
        include = INCLUDE.match(line)
        if include:
            out += read_requirements(path.parent / include.group(1), seen)
            continue
        if line.startswith("-"):
            continue
        try:
            out.append((path, Requirement(requirement_part(line))))
        except InvalidRequirement as exc:
            raise ValueError(f"{path}:{number}: cannot parse {line!r}: {exc}") from None
    return out


def pinned_versions(tools: Path) -> dict[str, tuple[str, Path]]:
    """{canonical name: (version, file)} of the requirements of `tools` and its includes that
    are pinned to one exact version (name==version) for this Python (markers evaluated)."""
    pins = {}
    for origin, req in read_requirements(tools):
        if req.marker is not None and not req.marker.evaluate():
            continue
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
            pins[canonicalize_name(req.name)] = (specs[0].version, origin)
    return pins


LAYOUT = ("this vLLM source (the track's vllm.tag/commit) does not have the layout the build scripts (ci/docker) "
          "read (vLLM 0.32 to 0.34); pin one of those releases or update the scripts")


def build_requirements(src: Path) -> Path:
    """The source's ROCm build requirements file (FileNotFoundError naming every name tried)."""
    for name in BUILD_REQUIREMENTS:
        if (src / name).is_file():
            return src / name
    raise FileNotFoundError(f"{src}: none of {', '.join(BUILD_REQUIREMENTS)}: {LAYOUT}")


def check_files(src: Path) -> list[str]:
    missing = [f"{src}/{name}: missing: {LAYOUT}" for name in NAMED_FILES if not (src / name).is_file()]
    if not any((src / name).is_file() for name in BUILD_REQUIREMENTS):
        missing.append(f"{src}: none of {', '.join(BUILD_REQUIREMENTS)}: {LAYOUT}")
    return missing


def check_build_tools(src: Path, tools: Path) -> tuple[list[str], list[str]]:
    pins = pinned_versions(tools)
    problems, notes = [], []
    for origin, req in read_requirements(build_requirements(src)):
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        where = origin.relative_to(src.resolve())
        if name in PINNED:
            notes.append(f"{where} asks for {req}; the base image's {shown(name)} is kept")
        elif name in pins and not req.specifier.contains(pins[name][0], prereleases=True):
            pinned, pin_file = pins[name]
            problems.append(f"{where} needs {req} but {pin_file.name} pins {name}=={pinned}: "
                            f"change the pin in {pin_file.name}")
    return problems, notes


def check_triton_kernels(src: Path, commit: str) -> list[str]:
    cmake = src / "cmake/external_projects/triton_kernels.cmake"
    text = cmake.read_text()
    m = re.search(r'VLLM_TARGET_DEVICE STREQUAL "rocm".*?set\(TRITON_KERNELS_TAG "([^"]+)"\)', text, re.S)
    if not m:
        return [f"{cmake}: no ROCm TRITON_KERNELS_TAG found: this vLLM fetches triton_kernels differently; "
                "update ci/docker/vllm_source.sh"]
    if m.group(1) != commit:
        return [f"{cmake} fetches ROCm triton_kernels at {m.group(1)} but versions.json pins "
                f"vllm.triton_kernels.commit={commit}: set the pin to vLLM's"]
    return []


BODY_LINE = re.compile(r"^# body sha256:([0-9a-f]{64}) \((\d+) requirements\)$", re.M)


def lock_body_problems(name: str, text: str) -> list[str]:
    """A lock holds requirements, each pinned with == and its hashes, and its body is the one its
    header records (`# body sha256:HEX (N requirements)`, ci/pins/locks.py body_line): one truncated
    to its header, cut at or inside an entry, or edited is refused, not installed as less."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    head, body = "".join(lines[:start]), "".join(lines[start:])
    entries = re.split(r"^(?=[A-Za-z0-9])", body, flags=re.M)[1:]
    if not entries:
        return [f"{name} holds no requirements (truncated?): run python3 -m ci.pins lock vllm"]
    recorded = BODY_LINE.search(head)
    if not recorded:
        return [f"{name} records no digest of its requirements (# body sha256:...): run python3 -m ci.pins lock vllm"]
    if int(recorded.group(2)) != len(entries):
        return [f"{name} holds {len(entries)} requirements, not the {recorded.group(2)} its header records "
                "(a cut lock): run python3 -m ci.pins lock vllm"]
    if hashlib.sha256(body.encode()).hexdigest() != recorded.group(1):
        return [f"{name}: its requirements are not the ones its header records (an edited lock): "
                "run python3 -m ci.pins lock vllm"]
    bad = [e.split(None, 1)[0] for e in entries
           if not re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?==\S+", e) or "--hash=sha256:" not in e]
    if bad:
        return [f"{name}: {bad[0]} is not pinned with == and its hashes (a cut or edited lock): "
                "run python3 -m ci.pins lock vllm"]
    return []


def check_lock(src: Path, lock: Path) -> list[str]:
    if not lock.is_file():
        return [f"{lock}: no lock of vLLM's runtime requirements for this track: run python3 -m ci.pins lock vllm"]
    text = lock.read_text(errors="replace")
    recorded = dict(re.findall(r"^# input (\S+) sha256:([0-9a-f]{64})$", text, re.M))
    relock = f"run python3 -m ci.pins lock vllm (the lock {lock.name} is stale)"
    problems = lock_body_problems(lock.name, text)
    src = src.resolve()
    files = sorted({p for p, _ in read_requirements(src / RUNTIME_REQUIREMENTS)} | {src / RUNTIME_REQUIREMENTS})
    for path in files:
        name = path.relative_to(src).as_posix()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if name not in recorded:
            problems.append(f"{lock.name} was not made from {name}: {relock}")
        elif recorded[name] != digest:
            problems.append(f"{name} differs from the one {lock.name} was made from: {relock}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("files").add_argument("src", type=Path)
    p = sub.add_parser("build-tools")
    p.add_argument("src", type=Path)
    p.add_argument("tools", type=Path)
    p = sub.add_parser("triton-kernels")
    p.add_argument("src", type=Path)
    p.add_argument("commit")
    p = sub.add_parser("lock")
    p.add_argument("src", type=Path)
    p.add_argument("lock", type=Path)
    ns = parser.parse_args(argv)
    notes: list[str] = []
    try:
        problems = check_files(ns.src) if ns.cmd != "lock" else check_lock(ns.src, ns.lock)
        if not problems and ns.cmd == "build-tools":
            problems, notes = check_build_tools(ns.src, ns.tools)
        elif not problems and ns.cmd == "triton-kernels":
            problems = check_triton_kernels(ns.src, ns.commit)
    except (OSError, ValueError, Problem) as exc:
        problems = [str(exc)]
    for line in notes:
        print(f"vllm-requirements: {line}")
    for line in problems:
        print(f"vllm-requirements: ERROR: {line}", file=sys.stderr)
    if not problems:
        print(f"vllm-requirements: OK ({ns.cmd})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
