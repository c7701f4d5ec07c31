#!/usr/bin/env python3
"""vLLM's requirement files, read in place as pip reads them (`-r` relative to the including file),
against this project's pins. Errors: one line each naming the setting to change; exit status 1.

    vllm_requirements.py files SRC                  every file of SRC the build scripts name exists
    vllm_requirements.py build-tools SRC TOOLS      the tools hash-pinned in TOOLS satisfy vLLM's ROCm
                                                    build requirements (its lines for the base image's
                                                    pinned distributions are reported, never installed)
    vllm_requirements.py triton-kernels SRC COMMIT  vLLM's CMake fetches ROCm triton_kernels at COMMIT
    vllm_requirements.py lock SRC LOCK              LOCK (docker/locks/vllm-<track>-rocm.txt) was made from
                                                    SRC's requirements/rocm.txt and its includes
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
             "install docker/requirements-scripts.txt (the base image's torch stage does)")

# Beside this file: pip's line joining (lock_lines.py), the one reader of installed metadata (pinned_dists.py).
if __package__:  # imported as a module of tools/build_scripts.py's private package (the pin tool, the tests)
    from .lock_lines import logical_lines
    from .pinned_dists import Problem, exact_version, shown
else:  # run as a script in a build stage: Python puts its folder first on the path
    from lock_lines import logical_lines
    from pinned_dists import Problem, exact_version, shown

# The first a source has: rocm.txt up to 0.33, rock.txt (TheRock) alone in 0.34.
BUILD_REQUIREMENTS = ("requirements/build/rocm.txt", "requirements/build/rock.txt")
RUNTIME_REQUIREMENTS = "requirements/rocm.txt"
NAMED_FILES = (RUNTIME_REQUIREMENTS, "requirements/common.txt", "cmake/external_projects/triton_kernels.cmake",
               "setup.py", "CMakeLists.txt")
PINNED = {"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm", "triton-rocm", "amdsmi", "amd-aiter"}
INCLUDE = re.compile(r"^(?:-r|--requirement)(?:\s*=\s*|\s+|(?=[^-\s]))(\S+)$")
LAYOUT = ("this vLLM source (the track's vllm.tag/commit) does not have the layout the build scripts (docker/) "
          "read (vLLM 0.32 to 0.34); pin one of those releases or update the scripts")
RELOCK = "run python3 -m tools.pins lock vllm"


def read_requirements(path: Path, seen=None) -> list[tuple[Path, Requirement]]:
    """(file, requirement) of every requirement line, `-r` includes followed; other options skipped."""
    seen = set() if seen is None else seen
    path = path.resolve()
    if path in seen:
        return []
    seen.add(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such requirements file")
    out = []
    for number, line in logical_lines(path.read_text()):
        include = INCLUDE.match(line)
        if include:
            out += read_requirements(path.parent / include.group(1), seen)
        elif not line.startswith("-"):
            words = line.split()  # the requirement, without the options after it (--hash=...)
            text = " ".join(words[:next((i for i, w in enumerate(words) if w.startswith("-")), len(words))])
            try:
                out.append((path, Requirement(text)))
            except InvalidRequirement as exc:
                raise ValueError(f"{path}:{number}: cannot parse {line!r}: {exc}") from None
    return out


def applying(path: Path) -> list[tuple[Path, Requirement]]:
    """The requirements of `path` whose markers hold for this Python."""
    return [(p, r) for p, r in read_requirements(path) if r.marker is None or r.marker.evaluate()]


def pinned_versions(tools: Path) -> dict[str, tuple[str, Path]]:
    """{canonical name: (version, file)} of the requirements pinned to one version (==)."""
    return {canonicalize_name(r.name): (exact_version(r), p) for p, r in applying(tools) if exact_version(r)}


def build_requirements(src: Path) -> Path:
    found = next((src / name for name in BUILD_REQUIREMENTS if (src / name).is_file()), None)
    if found is None:
        raise FileNotFoundError(f"{src}: none of {', '.join(BUILD_REQUIREMENTS)}: {LAYOUT}")
    return found


def check_files(src: Path) -> list[str]:
    missing = [f"{src}/{name}: missing: {LAYOUT}" for name in NAMED_FILES if not (src / name).is_file()]
    try:
        build_requirements(src)
    except FileNotFoundError as exc:
        missing.append(str(exc))
    return missing


def check_build_tools(src: Path, tools: Path) -> tuple[list[str], list[str]]:
    pins = pinned_versions(tools)
    problems, notes = [], []
    for origin, req in applying(build_requirements(src)):
        name, where = canonicalize_name(req.name), origin.relative_to(src.resolve())
        if name in PINNED:
            notes.append(f"{where} asks for {req}; the base image's {shown(name)} is kept")
        elif name in pins and not req.specifier.contains(pins[name][0], prereleases=True):
            pinned, pin_file = pins[name]
            problems.append(f"{where} needs {req} but {pin_file.name} pins {name}=={pinned}: "
                            f"change the pin in {pin_file.name}")
    return problems, notes


def check_triton_kernels(src: Path, commit: str) -> list[str]:
    cmake = src / "cmake/external_projects/triton_kernels.cmake"
    m = re.search(r'VLLM_TARGET_DEVICE STREQUAL "rocm".*?set\(TRITON_KERNELS_TAG "([^"]+)"\)', cmake.read_text(), re.S)
    if not m:
        return [f"{cmake}: no ROCm TRITON_KERNELS_TAG found: this vLLM fetches triton_kernels differently; "
                "update docker/vllm_source.sh"]
    if m.group(1) != commit:
        return [f"{cmake} fetches ROCm triton_kernels at {m.group(1)} but versions.json pins "
                f"vllm.triton_kernels.commit={commit}: set the pin to vLLM's"]
    return []


def lock_body_problems(name: str, text: str) -> list[str]:
    """The lock's entries are pinned with == and hashes, and its body is the one its header records
    (`# body sha256:HEX (N requirements)`): a cut or edited lock is refused, not installed as less."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    head, body = "".join(lines[:start]), "".join(lines[start:])
    entries = re.split(r"^(?=[A-Za-z0-9])", body, flags=re.M)[1:]
    recorded = re.search(r"^# body sha256:([0-9a-f]{64}) \((\d+) requirements\)$", head, re.M)
    bad = [e.split(None, 1)[0] for e in entries
           if not re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?==\S+", e) or "--hash=sha256:" not in e]
    if not entries:
        return [f"{name} holds no requirements (truncated?): {RELOCK}"]
    if not recorded:
        return [f"{name} records no digest of its requirements (# body sha256:...): {RELOCK}"]
    if int(recorded.group(2)) != len(entries):
        return [f"{name} holds {len(entries)} requirements, not the {recorded.group(2)} its header records "
                f"(a cut lock): {RELOCK}"]
    if hashlib.sha256(body.encode()).hexdigest() != recorded.group(1):
        return [f"{name}: its requirements are not the ones its header records (an edited lock): {RELOCK}"]
    if bad:
        return [f"{name}: {bad[0]} is not pinned with == and its hashes (a cut or edited lock): {RELOCK}"]
    return []


def check_lock(src: Path, lock: Path) -> list[str]:
    if not lock.is_file():
        return [f"{lock}: no lock of vLLM's runtime requirements for this track: {RELOCK}"]
    text = lock.read_text(errors="replace")
    recorded = dict(re.findall(r"^# input (\S+) sha256:([0-9a-f]{64})$", text, re.M))
    relock = f"{RELOCK} (the lock {lock.name} is stale)"
    problems = lock_body_problems(lock.name, text)
    src = src.resolve()
    for path in sorted({p for p, _ in read_requirements(src / RUNTIME_REQUIREMENTS)} | {src / RUNTIME_REQUIREMENTS}):
        name = path.relative_to(src).as_posix()
        if name not in recorded:
            problems.append(f"{lock.name} was not made from {name}: {relock}")
        elif recorded[name] != hashlib.sha256(path.read_bytes()).hexdigest():
            problems.append(f"{name} differs from the one {lock.name} was made from: {relock}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd, second in (("files", None), ("build-tools", "tools"), ("triton-kernels", "commit"), ("lock", "lock")):
        p = sub.add_parser(cmd)
        p.add_argument("src", type=Path)
        if second:
            p.add_argument(second, type=str if second == "commit" else Path)
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
