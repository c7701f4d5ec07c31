#!/usr/bin/env python3
"""Check an AITER wheel and its installed copy before an image ships it.

    check_aiter.py wheel WHEEL --modules "m1 m2" --archs "gfx942;gfx950"
        the wheel holds aiter/jit/<module>.so for every required module and MLA ASM
        kernels (aiter_meta/hsa/<arch>/mla/*.co) for every GPU arch
    check_aiter.py libs SITE_PACKAGES [--lib-path DIR ...]
        every prebuilt .so of the installed package resolves its libraries and symbol
        versions (GLIBCXX included) with ldd in this image
    check_aiter.py modules WHEEL    print the prebuilt module names, one per line
    check_aiter.py kernel-lists ROOT --archs "gfx942;gfx950"
        ROOT (an AITER source tree or an installed aiter_meta folder) holds for every arch MLA
        decode kernel lists hsa/<arch>/mla/*.csv (a header and rows) and the .co files they name

Exit status 1 with one line per problem naming what is missing and the setting to change.
"""
from __future__ import annotations

import argparse
import csv
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
    built = set(prebuilt_modules(names))
    problems = [f"{wheel.name}: no prebuilt aiter/jit/{module}.so (the wheel was built without "
                f"PREBUILD_KERNELS=1 or the module failed; see aiter.required_modules in versions.json)"
                for module in modules if module not in built]
    return problems + [f"{wheel.name}: no MLA ASM kernels for {arch} (aiter_meta/hsa/{arch}/mla/*.co): "
                       f"this AITER does not support {arch}; remove it from gpu_archs in versions.json"
                       for arch in archs
                       if not any(n.startswith(f"aiter_meta/hsa/{arch}/mla/") and n.endswith(".co") for n in names)]


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


def _fix(arch: str) -> str:
    return (f"remove {arch} from gpu_archs in versions.json (GPU_ARCHS for one build), or build an AITER pin "
            f"that has them (tracks.<track>.aiter in versions.json, AITER_PIN for one build)")


def _plain_relative(name: str) -> bool:
    """A path that stays inside the folder it is read in (no root, no '..')."""
    return bool(Path(name).parts) and not Path(name).is_absolute() and ".." not in Path(name).parts


def check_kernel_list(path: Path, arch: str) -> list[str]:
    """One kernel list: a CSV with a header and rows whose code objects (co_name, else every column
    whose values all end in .co) are beside it."""
    where = f"{path} ({arch})"
    try:
        with path.open(newline="") as f:
            table = [row for row in csv.reader(f) if any(cell.strip() for cell in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return [f"{where}: cannot read this MLA kernel list ({exc}); {_fix(arch)}"]
    if len(table) < 2:
        return [f"{where}: MLA kernel list without {'rows' if table else 'a header and rows'}: this AITER "
                f"has no MLA decode kernels for {arch}; {_fix(arch)}"]
    header, rows, folder = [cell.strip() for cell in table[0]], table[1:], path.parent
    columns = [header.index("co_name")] if "co_name" in header else [
        i for i in range(len(header)) if all(i < len(row) and row[i].strip().endswith(".co") for row in rows)]
    if not columns:  # a list whose columns name no .co: the folder holds code objects at least
        if any(folder.glob("*.co")):
            return []
        return [f"{where}: no code objects (*.co) beside this MLA kernel list: this AITER has no MLA decode "
                f"kernels for {arch}; {_fix(arch)}"]
    cells = [row[i].strip() if i < len(row) else "" for row in rows for i in columns]
    names = [c for c in cells if c]
    problems = []
    if len(names) < len(cells):
        problems.append(f"{where}: {len(cells) - len(names)} row(s) name no code object ({header[columns[0]]} "
                        f"empty); {_fix(arch)}")
    unsafe = sorted({n for n in names if not _plain_relative(n)})
    if unsafe:
        problems.append(f"{where}: names code objects outside its folder ({', '.join(unsafe)}): not an AITER "
                        f"kernel list; {_fix(arch)}")
    missing = sorted({n for n in names if _plain_relative(n) and not (folder / n).is_file()})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        problems.append(f"{where}: {len(missing)} code object(s) it lists are missing beside it ({shown}): "
                        f"this AITER is incomplete for {arch} (an --build-context aiter-src checkout without "
                        f"its hsa/ files?); {_fix(arch)}")
    return problems


def check_kernel_lists(root: Path, archs: list[str]) -> list[str]:
    problems = []
    for arch in archs:
        if not _plain_relative(arch) or len(Path(arch).parts) != 1:
            problems.append(f"GPU arch {arch!r} is not a plain name: fix gpu_archs in versions.json (GPU_ARCHS "
                            f"for one build)")
            continue
        folder = root / "hsa" / arch / "mla"
        if not folder.is_dir():
            problems.append(f"{folder}: no MLA kernel folder for {arch}: this AITER has no MLA decode kernels "
                            f"for {arch}; {_fix(arch)}")
            continue
        lists = sorted(folder.glob("*.csv"))
        if not lists:
            problems.append(f"{folder}: no MLA kernel list (*.csv) for {arch}: this AITER has no MLA decode "
                            f"kernels for {arch}; {_fix(arch)}")
        for path in lists:
            problems += check_kernel_list(path, arch)
    return problems


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
    sub.add_parser("modules").add_argument("wheel", type=Path)
    p = sub.add_parser("kernel-lists")
    p.add_argument("root", type=Path)
    p.add_argument("--archs", required=True, help="';'-separated GPU archs")
    ns = parser.parse_args(argv)
    archs = [a for a in getattr(ns, "archs", "").split(";") if a]
    if ns.cmd == "modules":
        with zipfile.ZipFile(ns.wheel) as zf:
            print("\n".join(prebuilt_modules(zf.namelist())))
        return 0
    if ns.cmd == "wheel":
        problems = check_wheel(ns.wheel, ns.modules.split(), archs)
    elif ns.cmd == "kernel-lists":
        problems = check_kernel_lists(ns.root, archs) if archs else [
            "no GPU archs given (--archs): set GPU_ARCHS (gpu_archs in versions.json)"]
    else:
        problems = check_libs(ns.site, ns.lib_path)
    for line in problems:
        print(f"aiter-check: ERROR: {line}", file=sys.stderr)
    if not problems:
        print(f"aiter-check: OK ({ns.cmd})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
