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
    pinned_dists.py check-report REPORT --step NAME
                                        fail when a `pip install --report` would install or
                                        replace one of them
    pinned_dists.py torch-triton [--expect NAME==VERSION]
                                        print the Triton requirement of the installed torch
                                        (NAME==VERSION, from torch's metadata); with --expect,
                                        fail unless it is that
    pinned_dists.py triton-alias        when ROCm torch's Triton is not the distribution
                                        `triton` (pytorch-triton-rocm, triton-rocm), record an
                                        alias distribution `triton` of the same version that
                                        owns no files and requires the real one: packages
                                        requiring `triton` (xgrammar) are then satisfied by the
                                        ROCm Triton instead of pulling PyPI's CUDA triton

Triton's distribution name is read from torch's own metadata (Requires-Dist); TRITON_PACKAGE,
when set, must agree. Errors: one line each, exit status 1.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import sys
import sysconfig
from pathlib import Path

FIXED = ("torch", "torchvision", "torchaudio", "amdsmi", "amd-aiter", "triton")
REQUIRED = ("torch", "amdsmi")


class Problem(Exception):
    pass


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def triton_dist() -> str:
    """The Triton distribution torch requires (first Requires-Dist whose name contains triton)."""
    try:
        requires = md.requires("torch") or []
    except md.PackageNotFoundError:
        raise Problem("torch is not installed: build the base image's torch stage first") from None
    names = [m.group(0) for r in requires if (m := re.match(r"[A-Za-z0-9_.-]+", r)) and "triton" in m.group(0).lower()]
    if not names:
        raise Problem(f"torch {version('torch')} names no Triton distribution in its metadata: "
                      "this is not a ROCm torch with Triton; check pytorch.wheels.torch in versions.json")
    found = norm(names[0])
    recorded = os.environ.get("TRITON_PACKAGE", "")
    if recorded not in ("", "UNRESOLVED") and norm(recorded) != found:
        raise Problem(f"torch {version('torch')} requires Triton as {found} but versions.json records "
                      f"pytorch.wheels.triton.package={recorded}: run python3 -m ci.pins resolve wheels --write")
    return found


def torch_triton() -> str:
    name = triton_dist()
    for r in md.requires("torch") or []:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*\(?\s*==\s*([^\s;,)]+)", r)
        if m and norm(m.group(1)) == name:
            return f"{name}=={m.group(2)}"
    raise Problem(f"torch {version('torch')} requires {name} without an exact version: pin "
                  "pytorch.wheels.triton.version in versions.json by hand")


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
    lines = ["# The base image's pinned distributions: nothing installed later may change them."]
    lines += [f"{name}=={ver}" for name, ver in sorted(snap.items()) if ver is not None]
    return "\n".join(lines) + "\n"


def compare(before: dict, step: str, allow=()) -> list[str]:
    after = snapshot()
    problems = []
    for name in sorted((set(before) | set(after)) - {norm(a) for a in allow}):
        old, new = before.get(name), after.get(name)
        if old != new:
            what = (f"installed {name} {new}" if old is None else f"removed {name} {old}" if new is None
                    else f"replaced {name} {old} by {new}")
            problems.append(f"{step}: {what}: a requirement conflicts with the base image's pins; "
                            "fix the pin in versions.json (pytorch.wheels, aiter) or the requirement")
    return problems


def check_report(report: dict, step: str) -> list[str]:
    pinned = set(pinned_names())
    problems = []
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        name = norm(meta.get("name", ""))
        if name in pinned:
            old = version(name)
            what = f"install {name} {meta.get('version')}" + (f" over {old}" if old else "")
            problems.append(f"{step}: pip would {what}: a requirement conflicts with the base image's pins; "
                            "fix the pin in versions.json or install under the constraints file")
    return problems


def triton_alias() -> str:
    real = triton_dist()
    if real == "triton":
        return "triton-alias: torch's Triton is the distribution triton; no alias needed"
    ver = version(real)
    if ver is None:
        raise Problem(f"{real} (torch's Triton) is not installed: install the pinned Triton wheel first")
    existing = version("triton")
    if existing is not None and existing != ver:
        raise Problem(f"a distribution triton {existing} is installed beside {real} {ver}: "
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("constraints").add_argument("out", type=Path)
    sub.add_parser("snapshot").add_argument("out", type=Path)
    p = sub.add_parser("compare")
    p.add_argument("before", type=Path)
    p.add_argument("--step", required=True)
    p.add_argument("--allow", action="append", default=[], help="a distribution this step installs on purpose")
    p = sub.add_parser("check-report")
    p.add_argument("report", type=Path, nargs="+")
    p.add_argument("--step", required=True)
    sub.add_parser("triton-alias")
    sub.add_parser("torch-triton").add_argument("--expect")
    ns = parser.parse_args(argv)
    try:
        problems: list[str] = []
        if ns.cmd == "constraints":
            ns.out.write_text(constraints())
        elif ns.cmd == "snapshot":
            ns.out.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
        elif ns.cmd == "compare":
            problems = compare(json.loads(ns.before.read_text()), ns.step, ns.allow)
        elif ns.cmd == "check-report":
            for path in ns.report:
                problems += check_report(json.loads(path.read_text()), ns.step)
        elif ns.cmd == "torch-triton":
            found = torch_triton()
            if ns.expect and norm(ns.expect.split("==")[0]) + "==" + ns.expect.split("==", 1)[-1] != found:
                raise Problem(f"torch {version('torch')} requires {found} but versions.json records {ns.expect} "
                              "(pytorch.wheels.triton): run python3 -m ci.pins resolve wheels --write")
            print(found)
        else:
            print(triton_alias())
    except (Problem, OSError, ValueError) as exc:
        problems = [str(exc)]
    for line in problems:
        print(f"pinned-dists: ERROR: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
