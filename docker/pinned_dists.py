#!/usr/bin/env python3
"""Keep the distributions the base image pins (torch, torchvision, torchaudio, torch's Triton,
amdsmi, amd-aiter) unchanged while other requirements are installed; run with the Python of the
environment to protect. Triton's name and version are read from torch's Requires-Dist.

    pinned_dists.py constraints OUT          write NAME==VERSION of each pinned distribution installed
    pinned_dists.py snapshot OUT             record them and their versions (JSON)
    pinned_dists.py compare BEFORE --step NAME [--allow DIST ...]
                                             fail when one (but the DISTs allowed) changed since BEFORE
    pinned_dists.py torch-triton [--expect NAME==VERSION]
                                             print torch's Triton requirement; fail unless it is --expect
    pinned_dists.py torch-triton-set NAME==VERSION
                                             make the installed torch require exactly that Triton
    pinned_dists.py triton-alias             when torch's Triton is not `triton`, record an alias
                                             distribution `triton` requiring it (so nothing pulls
                                             PyPI's CUDA triton)
Errors: one line each, exit status 1.
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
             "install docker/requirements-scripts.txt (the base image's torch stage does)")

FIXED = ("torch", "torchvision", "torchaudio", "amdsmi", "amd-aiter", "triton")
REQUIRED = ("torch", "amdsmi")


class Problem(Exception):
    pass


def version(name: str) -> str | None:
    """The installed version of `name` (None: not installed, "": no Version in its metadata). The
    build scripts' one reader of installed metadata (the base image has no backend package)."""
    try:
        found = md.distribution(name).metadata.get("Version")
    except md.PackageNotFoundError:
        return None
    except (KeyError, AttributeError, TypeError):  # no metadata file at all
        found = None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError among them
        raise unreadable(name, exc) from None
    return str(found).strip() if found else ""


def installed(normalized) -> dict[str, str]:
    """Every installed distribution with a name and a version: normalized(NAME) -> VERSION, the first of a
    name on sys.path (the one Python imports)."""
    found: dict[str, str] = {}
    for dist in md.distributions():
        try:
            name, found_version = dist.metadata["Name"], dist.version
        except (OSError, ValueError) as exc:  # UnicodeDecodeError among them
            raise unreadable(str(getattr(dist, "_path", "a distribution")), exc) from None
        if name and found_version:
            found.setdefault(normalized(name), found_version)
    return found


def unreadable(name: str, exc: Exception) -> Problem:
    why = f"is not UTF-8 text (byte {exc.start})" if isinstance(exc, UnicodeDecodeError) else f"cannot be read ({exc})"
    return Problem(f"the package metadata of the installed {name} {why}: reinstall it")


def shown(name: str) -> str:
    found = version(name)
    return f"{name} {found}" if found else f"{name} (installed, no version in its metadata)" if found == "" \
        else f"{name} (not installed)"


def requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def exact_version(req: Requirement) -> str | None:
    """The one version a requirement allows (name==V or name===V), else None."""
    exact = [s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
    return exact[0].version if len(exact) == 1 else None


def torch_triton_requirement() -> Requirement:
    """torch's first Requires-Dist naming a Triton that applies here (markers true, no extra)."""
    try:
        lines = md.requires("torch") or []
    except md.PackageNotFoundError:
        raise Problem("torch is not installed: build the base image's torch stage first") from None
    except (OSError, ValueError) as exc:
        raise unreadable("torch", exc) from None
    reqs = []
    for line in lines:
        try:
            reqs.append(Requirement(line))
        except InvalidRequirement as exc:
            raise Problem(f"{shown('torch')} has a Requires-Dist pip cannot read ({line!r}: {exc}): "
                          "check pytorch.torch in versions.json and the PyTorch lock") from None
    found = next((r for r in reqs if "triton" in canonicalize_name(r.name)
                  and (r.marker is None or r.marker.evaluate({"extra": ""}))), None)
    if found:
        return found
    raise Problem(f"{shown('torch')} names no Triton distribution in its metadata: "
                  "this is not a ROCm torch with Triton; check pytorch.torch in versions.json")


def triton_dist() -> str:
    return canonicalize_name(torch_triton_requirement().name)


def torch_triton() -> str:
    name, pinned = triton_dist(), exact_version(torch_triton_requirement())
    if pinned is None:
        raise Problem(f"{shown('torch')} requires {name} without an exact version: its Triton cannot be pinned; "
                      "check pytorch.torch in versions.json")
    return f"{name}=={pinned}"


def snapshot() -> dict[str, str | None]:
    return {name: version(name) for name in dict.fromkeys([*FIXED, triton_dist()])}


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
    return "\n".join(lines + [f"{name}=={ver}" for name, ver in sorted(snap.items()) if ver is not None]) + "\n"


def compare(path: Path, step: str, allow=()) -> list[str]:
    """What changed since the snapshot this script wrote at `path`; Problem when it is not one."""
    again = "run pinned_dists.py snapshot again before the step"
    try:
        before = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deeply
        raise Problem(f"{path} is not JSON ({type(exc).__name__}): {again}") from None
    if not isinstance(before, dict) or not all(v is None or isinstance(v, str) for v in before.values()):
        raise Problem(f"{path} is not a snapshot of pinned distributions (an object of names and versions): {again}")
    after, problems = snapshot(), []
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
    info = Path(sysconfig.get_paths()["purelib"]) / f"triton-{ver}.dist-info"
    info.mkdir(exist_ok=True)
    files = {"METADATA": (f"Metadata-Version: 2.1\nName: triton\nVersion: {ver}\n"
                          f"Summary: Alias: the Triton of this image is the distribution {real} {ver}\n"
                          f"Requires-Dist: {real}=={ver}\n"),
             "INSTALLER": "rocm-vllm\n"}
    for name, text in files.items():
        (info / name).write_text(text)
    (info / "RECORD").write_text("".join(f"{info.name}/{n},,\n" for n in (*files, "RECORD")))
    return f"triton-alias: distribution triton {ver} recorded as an alias of {real} {ver}"


def set_torch_triton(spec: str) -> str:
    """Rewrite torch's Triton Requires-Dist lines to one, `spec` (NAME==VERSION of an installed
    distribution); says which lines it replaced."""
    wanted = requirement(spec)
    ver = exact_version(wanted) if wanted else None
    if ver is None:
        raise Problem(f"torch-triton-set {spec!r} is not NAME==VERSION: check tracks.<track>.therock.triton")
    name = canonicalize_name(wanted.name)
    if version(name) != ver:
        raise Problem(f"{shown(name)} is installed, not {name} {ver}: install the Triton wheel the image built first")
    old = torch_triton_requirement()
    dist = md.distribution("torch")
    meta = next((f for f in dist.files or [] if f.name == "METADATA" and f.parent.name.endswith(".dist-info")), None)
    if meta is None:
        raise Problem(f"{shown('torch')} lists no METADATA among its files: reinstall torch")
    path = Path(dist.locate_file(meta))
    lines = path.read_text(encoding="utf-8").split("\n")
    hits = [i for i, line in enumerate(lines) if line.startswith("Requires-Dist:")
            and getattr(requirement(line[14:].strip()), "name", None) == old.name]
    if not hits:
        raise Problem(f"{path} has no Requires-Dist line for {old.name}: reinstall torch")
    replaced = [lines[i] for i in hits]
    lines[hits[0]] = f"Requires-Dist: {name}=={ver}"
    for i in reversed(hits[1:]):
        del lines[i]
    path.write_text("\n".join(lines), encoding="utf-8")
    return f"torch-triton-set: torch's {' / '.join(replaced)} is now Requires-Dist: {name}=={ver}"


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
    problems: list[str] = []
    try:
        if ns.cmd == "constraints":
            ns.out.write_text(constraints())
        elif ns.cmd == "snapshot":
            ns.out.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
        elif ns.cmd == "compare":
            problems = compare(ns.before, ns.step, ns.allow)
        elif ns.cmd == "torch-triton":
            found, expect = torch_triton(), requirement(ns.expect) if ns.expect else None
            if ns.expect and expect is None:
                raise Problem(f"--expect {ns.expect!r} is not NAME==VERSION: check the Triton line of the PyTorch lock")
            if expect and f"{canonicalize_name(expect.name)}=={exact_version(expect)}" != found:
                raise Problem(f"{shown('torch')} requires {found}, not {ns.expect}, the Triton installed beside it: "
                              "make the PyTorch lock again (python3 -m tools.pins resolve wheels --force --write)")
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
