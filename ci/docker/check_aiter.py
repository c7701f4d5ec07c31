#!/usr/bin/env python3
"""Check an AITER wheel and its installed copy before an image ships it.

    check_aiter.py wheel WHEEL --modules "m1 m2" --archs "gfx942;gfx950"
        the wheel holds aiter/jit/<module>.so for every required module and MLA ASM
        kernels (aiter_meta/hsa/<arch>/mla/*.co) for every GPU arch
    check_aiter.py libs SITE_PACKAGES [--lib-path DIR ...]
        every prebuilt .so of the installed package resolves its libraries and symbol
        versions (GLIBCXX included) with ldd in this image
    check_aiter.py modules WHEEL    print the prebuilt module names, one per line
    check_aiter.py kernels SOURCE --tag TAG --tables DIR
        the backend's MLA kernel table for this AITER pin (DIR/TAG.json) is what SOURCE (the
        AITER source the wheel was built from) dispatches: derived from its kernel lists with
        the rules of aiter_kernel_table.py; no table, changed dispatch code or a differing row
        stops the build

Exit status 1 with one line per problem naming what is missing and the setting to change.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path


def prebuilt_modules(names: list[str]) -> list[str]:
    return sorted({m.group(1) for n in names if (m := re.match(r"^aiter/jit/([^/]+)\.so$", n))})


def check_wheel(wheel: Path, modules: list[str], archs: list[str]) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    problems = []
    built = set(prebuilt_modules(names))
    for module in modules:
        if module not in built:
            problems.append(f"{wheel.name}: no prebuilt aiter/jit/{module}.so (the wheel was built without "
                            f"PREBUILD_KERNELS=1 or the module failed; see aiter.required_modules in versions.json)")
    for arch in archs:
        if not any(n.startswith(f"aiter_meta/hsa/{arch}/mla/") and n.endswith(".co") for n in names):
            problems.append(f"{wheel.name}: no MLA ASM kernels for {arch} (aiter_meta/hsa/{arch}/mla/*.co): "
                            f"this AITER does not support {arch}; remove it from gpu_archs in versions.json")
    return problems


def check_libs(site: Path, lib_paths: list[str]) -> list[str]:
    sos = sorted((site / "aiter" / "jit").glob("*.so"))
    if not sos:
        return [f"{site}/aiter/jit holds no prebuilt .so files: the installed AITER has no prebuilt kernels"]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(lib_paths + [env.get("LD_LIBRARY_PATH", "")]).strip(":")
    problems = []
    for so in sos:
        proc = subprocess.run(["ldd", str(so)], capture_output=True, text=True, env=env)
        text = proc.stdout + proc.stderr
        missing = [line.strip() for line in text.splitlines() if "not found" in line]
        if proc.returncode != 0 or missing:
            detail = "; ".join(missing) or text.strip().splitlines()[-1:]
            problems.append(f"{so.name}: unresolved libraries or symbol versions in this image: {detail} "
                            f"(built against a newer toolchain than the runtime image has)")
    return problems


def check_kernels(source: Path, tag: str, tables: Path) -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import aiter_kernel_table  # noqa: PLC0415  (a sibling script, stdlib only)

    return aiter_kernel_table.check(source, tables / f"{tag}.json")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("wheel")
    p.add_argument("wheel", type=Path)
    p.add_argument("--modules", required=True, help="space-separated required module names")
    p.add_argument("--archs", required=True, help="';'-separated GPU archs")
    p = sub.add_parser("libs")
    p.add_argument("site", type=Path)
    p.add_argument("--lib-path", action="append", default=[])
    p = sub.add_parser("modules")
    p.add_argument("wheel", type=Path)
    p = sub.add_parser("kernels")
    p.add_argument("source", type=Path)
    p.add_argument("--tag", required=True)
    p.add_argument("--tables", type=Path, required=True)
    ns = parser.parse_args(argv)

    if ns.cmd == "modules":
        with zipfile.ZipFile(ns.wheel) as zf:
            print("\n".join(prebuilt_modules(zf.namelist())))
        return 0
    if ns.cmd == "wheel":
        problems = check_wheel(ns.wheel, ns.modules.split(), [a for a in ns.archs.split(";") if a])
    elif ns.cmd == "kernels":
        problems = check_kernels(ns.source, ns.tag, ns.tables)
    else:
        problems = check_libs(ns.site, ns.lib_path)
    for line in problems:
        print(f"aiter-check: ERROR: {line}", file=sys.stderr)
    if not problems:
        print(f"aiter-check: OK ({ns.cmd})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
