#!/usr/bin/env python3
"""The decisions of install_ray.sh, which runs pip: what the Ray layer installs and holds, and whether
what it installed is exactly that.

    python3 -B ray_layer.py plan LOCK WORK           WORK/constraints.txt: NAME==VERSION of every
        installed distribution (the first of a name on sys.path: the one imported), so installing Ray
        moves none of them; WORK/requirements.txt: the lock's entries of ray, and of msgpack where the
        image lacks it, with their hashes. Prints `<ray version> <name>...`.
    python3 -B ray_layer.py check ROOT VERSION NAME...   ROOT holds exactly the distributions NAME...,
        and ray imports from it at VERSION.

The lock is read by lock_lines.py, the one reader of hash locks (beside this file in the build stage).
Standard library only: it runs in the vLLM image being built. Errors: one line `install-ray: ERROR:
...`, exit status 1.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import lock_lines
import pinned_dists

LOCK_COMMAND = "python3 -m tools.pins lock ray"
IMPORT_TIMEOUT_S = 300


class LayerError(Exception):
    """One line: what is wrong and what to change."""


def held() -> dict[str, str]:
    """NAME -> VERSION of every installed distribution, the first of a name on sys.path, as the build
    scripts' one reader of installed metadata (pinned_dists.py, beside this file) reads them."""
    return pinned_dists.installed(lock_lines.normalized)


def constraints(installed: dict[str, str]) -> str:
    return ("# Every distribution of the image: installing Ray moves none of them.\n"
            + "".join(f"{name}=={version}\n" for name, version in sorted(installed.items())))


def lock_entries(lock: Path) -> dict[str, str]:
    """normalized name -> the lock's logical line (name==version --hash=...), as lock_lines reads it."""
    try:
        data = lock.read_bytes()
    except OSError as exc:
        raise LayerError(f"{lock}: cannot read the lock: {exc.strerror}") from None
    problem = lock_lines.problem(str(lock), data)
    if problem:
        raise LayerError(f"{problem}; make it again: {LOCK_COMMAND}")
    return {lock_lines.normalized(line.split("==", 1)[0].split("[", 1)[0]): line
            for _, line in lock_lines.logical_lines(data.decode("ascii"))}


def requirements(entries: dict[str, str], wanted: Sequence[str], lock: Path) -> str:
    missing = [name for name in wanted if name not in entries]
    if missing:
        raise LayerError(f"{lock} has no hash-pinned {', '.join(missing)}: run {LOCK_COMMAND}")
    return "".join(f"{entries[name]}\n" for name in wanted)


def plan(lock: Path, work: Path) -> tuple[str, list[str]]:
    """Write the constraints and the requirements; Ray's version and the names to install."""
    installed = held()
    wanted = ["ray"] + ([] if "msgpack" in installed else ["msgpack"])
    entries = lock_entries(lock)
    text = requirements(entries, wanted, lock)
    (work / "constraints.txt").write_text(constraints(installed))
    (work / "requirements.txt").write_text(text)
    version = lock_lines.requirements(entries["ray"].encode())[0][1]
    return version, wanted


def site_folders(root: Path) -> list[Path]:
    return [Path(f"{root}{site}") for site in sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})]


def installed_under(root: Path) -> set[str]:
    """Distributions installed under root: dist-info folders in its site-packages (Ray's wheel carries
    more inside ray/)."""
    return {lock_lines.normalized(p.name[: -len(".dist-info")].rsplit("-", 1)[0]) for site in site_folders(root)
            for p in site.glob("*.dist-info")}


def check(root: Path, version: str, wanted: Sequence[str]) -> str:
    found = installed_under(root)
    if found != set(wanted):
        raise LayerError(f"the Ray layer holds {', '.join(sorted(found))} but only {', '.join(sorted(wanted))} may "
                         "be installed: a requirement of Ray replaced one of the image's distributions; change "
                         f"docker/requirements-ray.in (then {LOCK_COMMAND})")
    env = {**os.environ, "PYTHONPATH": ":".join(str(s) for s in site_folders(root))}
    try:
        got = subprocess.run([sys.executable, "-B", "-c", "import ray; print(ray.__version__)"], env=env,
                             capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LayerError(f"ray from the Ray layer did not import within {IMPORT_TIMEOUT_S} s") from None
    if got.returncode != 0 or got.stdout.strip() != version:
        said = got.stderr.strip().splitlines()[-1:] or [""]
        raise LayerError(f"ray from the Ray layer gives {got.stdout.strip() or 'no version'} (want {version}): "
                         f"{said[0]}")
    return f"install-ray: OK ray {version} imports ({', '.join(sorted(wanted))} installed under {root})"


def main(argv: Sequence[str]) -> int:
    try:
        if len(argv) == 3 and argv[0] == "plan":
            version, wanted = plan(Path(argv[1]), Path(argv[2]))
            print(version, *wanted)
        elif len(argv) >= 4 and argv[0] == "check":
            print(check(Path(argv[1]), argv[2], argv[3:]))
        else:
            print("usage: ray_layer.py plan LOCK WORK | check ROOT VERSION NAME...", file=sys.stderr)
            return 2
    except LayerError as exc:
        print(f"install-ray: ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
