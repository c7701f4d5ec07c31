#!/usr/bin/env python3
"""Keep the distributions the base image pins (torch, torchvision, torchaudio, the Triton of
ROCm torch, amdsmi, amd-aiter) unchanged while other requirements are installed.

Run with the Python of the environment to protect:

    pinned_dists.py constraints OUT     write a pip constraints file: NAME==VERSION of each
                                        pinned distribution installed (torch, its Triton,
                                        amdsmi must be installed)
    pinned_dists.py snapshot OUT        record the pinned distributions and their versions (JSON)
    pinned_dists.py compare BEFORE --step NAME [--allow DIST ...]
                                        fail when one of them (other than the DISTs this step
                                        installs on purpose) changed, appeared or disappeared
                                        since the snapshot BEFORE
    pinned_dists.py torch-triton [--expect NAME==VERSION]
                                        print the Triton requirement of the installed torch
                                        (NAME==VERSION, from torch's metadata); with --expect,
                                        fail unless it is that
    pinned_dists.py torch-triton-set NAME==VERSION
                                        make the installed torch require exactly that Triton
                                        (the one the image built from source, on the therock
                                        stack: TheRock's torch names another); prints the
                                        Requires-Dist line replaced
    pinned_dists.py triton-alias        when ROCm torch's Triton is not the distribution
                                        `triton` (pytorch-triton-rocm, triton-rocm), record an
                                        alias distribution `triton` of the same version that
                                        owns no files and requires the real one: packages
                                        requiring `triton` (xgrammar) are then satisfied by the
                                        ROCm Triton instead of pulling PyPI's CUDA triton

Triton's distribution name and version are read from torch's own metadata (Requires-Dist):
versions.json pins no Triton of its own for ROCm torch (the PyTorch lock holds the one torch
requires; install_torch.sh checks them equal with torch-triton --expect). Requirement lines and
distribution names are read with `packaging`
(ci/docker/requirements-scripts.txt). Errors: one line each, exit status 1.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import sys
import sysconfig
from pathlib import Path

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    sys.exit("pinned-dists: ERROR: the Python package `packaging` is not installed in this Python: "
             "install ci/docker/requirements-scripts.txt (the base image's torch stage does)")

FIXED = ("torch", "torchvision", "torchaudio", "amdsmi", "amd-aiter", "triton")
REQUIRED = ("torch", "amdsmi")


class Problem(Exception):
    pass


def version(name: str) -> str | None:
    """The installed version of `name`: None when it is not installed, "" when its metadata has no
    Version (installed all the same); Problem when its metadata cannot be read. The build scripts'
    one reader of installed metadata (they run in the base image's Python, without the backend's
    reader, which the base image's layers must not depend on)."""
    try:
        found = md.distribution(name).metadata.get("Version")
    except md.PackageNotFoundError:
        return None
    except (KeyError, AttributeError, TypeError):  # no metadata file at all
        found = None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError among them
        raise unreadable(name, exc) from None
    return str(found).strip() if found else ""


def unreadable(name: str, exc: Exception) -> Problem:
    why = f"is not UTF-8 text (byte {exc.start})" if isinstance(exc, UnicodeDecodeError) else f"cannot be read ({exc})"
    return Problem(f"the package metadata of the installed {name} {why}: reinstall it")


def shown(name: str) -> str:
    """NAME VERSION for messages; an install without a version is named as such."""
    found = version(name)
    return f"{name} {found}" if found else f"{name} (installed, no version in its metadata)" if found == "" \
        else f"{name} (not installed)"


def requires(name: str) -> list[str] | None:
    """The Requires-Dist lines of `name`; None when it is not installed."""
    try:
        return md.requires(name) or []
    except md.PackageNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise unreadable(name, exc) from None


def torch_requirements() -> list[Requirement]:
    """torch's Requires-Dist that apply to this Python (markers evaluated, extras left out)."""
    lines = requires("torch")
    if lines is None:
        raise Problem("torch is not installed: build the base image's torch stage first")
    out = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise Problem(f"{shown('torch')} has a Requires-Dist pip cannot read ({line!r}: {exc}): "
                          "check pytorch.torch in versions.json and the PyTorch lock") from None
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req)
    return out


def torch_triton_requirement() -> Requirement:
    """The Triton requirement of torch (the first whose name contains triton)."""
    found = next((r for r in torch_requirements() if "triton" in canonicalize_name(r.name)), None)
    if found is None:
        raise Problem(f"{shown('torch')} names no Triton distribution in its metadata: "
                      "this is not a ROCm torch with Triton; check pytorch.torch in versions.json")
    return found


def triton_dist() -> str:
    """The Triton distribution torch requires (canonical name)."""
    return canonicalize_name(torch_triton_requirement().name)


def exact_version(req: Requirement) -> str | None:
    """The one version a requirement allows (name==V or name===V), else None."""
    exact = [s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
    return exact[0].version if len(exact) == 1 else None


def torch_triton() -> str:
    name = triton_dist()
    pinned = exact_version(torch_triton_requirement())
    if pinned is not None:
        return f"{name}=={pinned}"
    raise Problem(f"{shown('torch')} requires {name} without an exact version: its Triton cannot be pinned; "
                  "check pytorch.torch in versions.json")


def pinned_names() -> list[str]:
    names = list(FIXED)
    real = triton_dist()
    if real not in names:
        names.append(real)
    return names


def snapshot() -> dict[str, str | None]:
    return {name: version(name) for name in pinned_names()}


def constraints() -> str:
    snap = snapshot()
    missing = [n for n in (*REQUIRED, triton_dist()) if snap.get(n) is None]
    if missing:
        raise Problem(f"{', '.join(missing)} not installed in this environment: the base image installs "
                      "them (torch stage); rebuild it")
    versionless = [n for n, v in sorted(snap.items()) if v == ""]
    if versionless:
        raise Problem(f"{', '.join(versionless)} installed without a version in its package metadata, so it "
                      "cannot be pinned: reinstall it (rebuild the base image's torch stage)")
    lines = ["# The base image's pinned distributions: nothing installed later may change them."]
    lines += [f"{name}=={ver}" for name, ver in sorted(snap.items()) if ver is not None]
    return "\n".join(lines) + "\n"


def read_snapshot(path: Path) -> dict[str, str | None]:
    """A snapshot this script wrote (name -> version, null: not installed); Problem otherwise."""
    again = "run pinned_dists.py snapshot again before the step"
    try:
        before = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deeply
        raise Problem(f"{path} is not JSON ({type(exc).__name__}): {again}") from None
    if not isinstance(before, dict) or not all(v is None or isinstance(v, str) for v in before.values()):
        raise Problem(f"{path} is not a snapshot of pinned distributions (an object of names and versions): {again}")
    return before


def compare(before: dict, step: str, allow=()) -> list[str]:
    after = snapshot()
    problems = []
    for name in sorted((set(before) | set(after)) - {canonicalize_name(a) for a in allow}):
        old, new = before.get(name), after.get(name)
        if old != new:
            what = (f"installed {name} {new}" if old is None else f"removed {name} {old}" if new is None
                    else f"replaced {name} {old} by {new}")
            problems.append(f"{step}: {what}: a requirement conflicts with the base image's pins; "
                            "fix the pin in versions.json (pytorch, aiter) or the requirement")
    return problems


def triton_alias() -> str:
    real = triton_dist()
    if real == "triton":
        return "triton-alias: torch's Triton is the distribution triton; no alias needed"
    ver = version(real)
    if not ver:
        raise Problem(f"{shown(real)} is torch's Triton: install the pinned Triton wheel (again) first")
    existing = version("triton")
    if existing is not None and existing != ver:
        raise Problem(f"a distribution {shown('triton')} is installed beside {real} {ver}: "
                      "pip replaced the ROCm Triton; rebuild the torch stage")
    purelib = Path(sysconfig.get_paths()["purelib"])
    info = purelib / f"triton-{ver}.dist-info"
    info.mkdir(exist_ok=True)
    files = {
        "METADATA": (f"Metadata-Version: 2.1\nName: triton\nVersion: {ver}\n"
                     f"Summary: Alias: the Triton of this image is the distribution {real} {ver}\n"
                     f"Requires-Dist: {real}=={ver}\n"),
        "INSTALLER": "rocm-vllm\n",
    }
    for name, text in files.items():
        (info / name).write_text(text)
    (info / "RECORD").write_text("".join(f"{info.name}/{n},,\n" for n in (*files, "RECORD")))
    return f"triton-alias: distribution triton {ver} recorded as an alias of {real} {ver}"


def set_torch_triton(spec: str) -> str:
    """Rewrite the installed torch's Triton Requires-Dist (its first, as torch_triton_requirement
    reads it) to spec, NAME==VERSION of an installed distribution; the line replaced, and the new one."""
    wanted = Requirement(spec) if _valid(spec) else None
    if wanted is None or exact_version(wanted) is None:
        raise Problem(f"torch-triton-set {spec!r} is not NAME==VERSION: check tracks.<track>.therock.triton")
    name, ver = canonicalize_name(wanted.name), exact_version(wanted)
    if version(name) != ver:
        raise Problem(f"{shown(name)} is installed, not {name} {ver}: install the Triton wheel the image built first")
    old = torch_triton_requirement()
    dist = md.distribution("torch")
    meta = next((f for f in dist.files or [] if f.name == "METADATA" and f.parent.name.endswith(".dist-info")), None)
    if meta is None:
        raise Problem(f"{shown('torch')} lists no METADATA among its files: reinstall torch")
    path = Path(dist.locate_file(meta))
    lines = path.read_text(encoding="utf-8").split("\n")
    hits = [i for i, line in enumerate(lines) if line.startswith("Requires-Dist:") and _valid(line[14:].strip())
            and Requirement(line[14:].strip()).name == old.name]
    if not hits:
        raise Problem(f"{path} has no Requires-Dist line for {old.name}: reinstall torch")
    replaced = [lines[i] for i in hits]
    lines[hits[0]] = f"Requires-Dist: {name}=={ver}"
    for i in reversed(hits[1:]):
        del lines[i]
    path.write_text("\n".join(lines), encoding="utf-8")
    return f"torch-triton-set: torch's {' / '.join(replaced)} is now Requires-Dist: {name}=={ver}"


def _valid(text: str) -> bool:
    try:
        Requirement(text)
    except InvalidRequirement:
        return False
    return True


def expected(spec: str) -> str:
    """NAME==VERSION of an --expect value, the name canonical (as torch_triton prints it)."""
    try:
        req = Requirement(spec)
    except InvalidRequirement:
        raise Problem(f"--expect {spec!r} is not NAME==VERSION: check the Triton line of the PyTorch lock") from None
    return f"{canonicalize_name(req.name)}=={exact_version(req)}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("constraints").add_argument("out", type=Path)
    sub.add_parser("snapshot").add_argument("out", type=Path)
    p = sub.add_parser("compare")
    p.add_argument("before", type=Path)
    p.add_argument("--step", required=True)
    p.add_argument("--allow", action="append", default=[], help="a distribution this step installs on purpose")
    sub.add_parser("triton-alias")
    sub.add_parser("torch-triton").add_argument("--expect")
    sub.add_parser("torch-triton-set").add_argument("spec", metavar="NAME==VERSION")
    ns = parser.parse_args(argv)
    try:
        problems: list[str] = []
        if ns.cmd == "constraints":
            ns.out.write_text(constraints())
        elif ns.cmd == "snapshot":
            ns.out.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
        elif ns.cmd == "compare":
            problems = compare(read_snapshot(ns.before), ns.step, ns.allow)
        elif ns.cmd == "torch-triton":
            found = torch_triton()
            if ns.expect and expected(ns.expect) != found:
                raise Problem(f"{shown('torch')} requires {found}, not {ns.expect}, the Triton installed beside it: "
                              "make the PyTorch lock again (python3 -m ci.pins resolve wheels --force --write)")
            print(found)
        elif ns.cmd == "torch-triton-set":
            print(set_torch_triton(ns.spec))
        else:
            print(triton_alias())
    except (Problem, OSError, ValueError) as exc:
        problems = [str(exc)]
    for line in problems:
        print(f"pinned-dists: ERROR: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
