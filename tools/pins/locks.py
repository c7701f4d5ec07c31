"""Hash-locked requirement files (docker/locks/locks.json): `python3 -m tools.pins lock [NAME...] [--check]`.

Each lock is `uv pip compile --generate-hashes` of its inputs for the platform it is installed on, with
only the PyPI releases uploaded before exclude_newer; vLLM's (one per track) from requirements/rocm.txt
of the track's sdist, less what the base image provides. --check fails when one differs from the file."""
from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version
from rocm_vllm_runtime import files, schema

from .. import build_scripts
from . import discover, model, resolve
from .model import PinError

pinned_dists = build_scripts.load("pinned_dists")  # docker/pinned_dists.py: what the base image pins

LOCKS_FILE = Path("docker/locks/locks.json")
SCHEMA_FILE = model.REPO_ROOT / "docker/locks/locks.schema.json"  # its shape and patterns (JSON Schema)
SDIST = "sdist:"


@dataclass(frozen=True)
class Lock:
    name: str
    inputs: tuple[str, ...]  # paths from the repository root, or sdist:<path in the track's sdist>
    output: str
    python: str
    platform: str | None  # uv --python-platform; None: every platform (--universal)
    no_deps: bool = False
    no_emit: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    find_links: str | None = None  # index of wheels not on PyPI (PIP_FIND_LINKS first)
    overrides: tuple[str, ...] = ()  # uv --override lines: requirement lines of upstream that cannot be met
    track: str | None = None
    family: str = ""  # the locks.json entry (a per_track entry makes one lock per track)
    command: str = ""  # what makes it, when not `python3 -m tools.pins lock NAME`
    only_binary: bool = False  # wheels only (uv --only-binary :all:): installed by install_lock.sh


def load(root: Path) -> dict:
    """locks.json, checked against docker/locks/locks.schema.json: a PinError naming the first problem."""
    spec = model.load(root / LOCKS_FILE)
    errors = schema.problems(spec, files.read_json(SCHEMA_FILE, SCHEMA_FILE.name))
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise PinError(f"{LOCKS_FILE}: {errors[0]}{more}")
    return spec


def base_image_dists(root: Path) -> tuple[str, ...]:  # noqa: ARG001
    """The distributions the base image pins (docker/pinned_dists.py FIXED)."""
    return pinned_dists.FIXED


def platform_tag(spec: dict) -> str:
    """uv's --python-platform tag of a platform (glibc, machine; their patterns: the schemas)."""
    return f"{spec['machine']}-manylinux_{spec['glibc'].replace('.', '_')}"


def locks(root: Path, data: dict, spec: dict | None = None) -> list[Lock]:
    """Every lock locks.json defines (a per_track lock once per built track of the versions file data)."""
    spec = spec if spec is not None else load(root)
    platforms = {"image": (platform_tag(data["platform"]), data["python"]["version"]),
                 **{name: (platform_tag(value), value["python"]) for name, value in spec.get("platforms", {}).items()}}
    out = []
    for name, entry in sorted(spec.get("locks", {}).items()):
        where = f"locks.json locks.{name}"
        kind = entry.get("platform")
        if kind == "universal":
            platform, python = None, min((p[1] for p in platforms.values()), key=Version)
        elif kind in platforms:
            platform, python = platforms[kind]
        else:
            raise PinError(f"{where}.platform: {kind!r} is not universal, image or a key of platforms")
        overrides = entry.get("overrides") or {}
        common = dict(python=python, platform=platform, no_deps=bool(entry.get("no_deps")),
                      no_emit=tuple(entry.get("no_emit", ())),
                      remove=base_image_dists(root) if entry.get("remove") else (), find_links=entry.get("find_links"))
        if entry.get("per_track"):
            # only where the images are built: a track on another stack has no image to install its lock into
            for track in model.built_track_names(data):
                out.append(Lock(f"{name}-{track}", tuple(entry["inputs"]), entry["output"].format(track=track),
                                track=track, family=name,
                                overrides=tuple(overrides.get(track, {}).get("requirements", ())), **common))
        else:
            if any(i.startswith(SDIST) for i in entry["inputs"]):
                raise PinError(f"{where}.inputs: sdist inputs need per_track: true")
            out.append(Lock(name, tuple(entry["inputs"]), entry["output"], family=name, **common))
    return out


def base_image_versions(data: dict, track: str | None) -> dict[str, str]:
    """{name: version (public part)} of the PyTorch wheels the base image of the track pins."""
    if track is not None and model.track_stack(data, track) == model.THEROCK_STACK:
        torch = data["tracks"][track]["therock"]["torch"]
    else:
        torch = model.section(data, "pytorch", track)["torch"]
    return {name: torch[name].split("+")[0] for name in sorted(torch) if torch[name]}


def _blocks(body: str) -> list[tuple[str, list[str], set[str]]]:
    """(name, lines, what requires it) of each requirement of uv's annotated output."""
    blocks: list[tuple[str, list[str], set[str]]] = []
    for line in body.splitlines():
        if re.match(r"[A-Za-z0-9]", line):
            blocks.append((re.split(r"[=\[ ;]", line, 1)[0].lower().replace("_", "-"), [line], set()))
        elif blocks:
            blocks[-1][1].append(line)
            via = re.match(r"\s+#\s+(?:via\s+)?(\S.*)$", line)
            if via and via.group(1) != "via":
                blocks[-1][2].add(via.group(1).strip().lower().replace("_", "-"))
    return blocks


def without(body: str, removed: set[str]) -> str:
    """uv's output less the removed distributions and what only they (transitively) require."""
    blocks = _blocks(body)
    gone = {n.lower() for n in removed}
    while more := {name for name, _, via in blocks if name not in gone and via and via <= gone}:
        gone |= more
    return "".join("\n".join(lines) + "\n" for name, lines, _ in blocks if name not in gone)


def uv_command() -> list[str]:
    """uv from this Python's environment (tools/uv.lock and tests/requirements.lock install it), else from PATH."""
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.is_file() else shutil.which("uv")
    if not found:
        raise PinError("uv not found beside this Python or on PATH: install uv "
                       "(https://docs.astral.sh/uv/getting-started/installation/) and run the pin tool with it from "
                       "the repository root: uv run --locked --project tools python -m tools.pins ...")
    return [found]


def _includes(path: Path) -> list[Path]:
    """path and the files its -r/-c lines include, recursively."""
    seen: list[Path] = []
    todo = [path]
    while todo:
        current = todo.pop(0)
        if current in seen:
            continue
        seen.append(current)
        todo += [(current.parent / m.group(1)).resolve() for line in current.read_text().splitlines()
                 if (m := re.match(r"\s*(?:-r|-c|--requirement|--constraint)\s*=?\s*(\S+)", line))]
    return seen


def _sdist_tree(archive: Path, dest: Path) -> Path:
    """The sdist's requirements/ folder, unpacked into dest (discover.unpack: a member that would
    leave dest is refused in one line and nothing is written outside it)."""
    discover.unpack(archive, dest, keep=lambda path: path.startswith("requirements/"))
    if not (dest / "requirements").is_dir():
        raise PinError(f"{archive.name}: no requirements/ folder in the sdist")
    return dest


BODY_RE = re.compile(r"^# body sha256:([0-9a-f]{64}) \((\d+) requirements\)$", re.M)


def split_lock(text: str) -> tuple[str, str]:
    """(header, body) of a lock's text: the header is its leading comment lines."""
    lines = text.splitlines(keepends=True)
    n = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return "".join(lines[:n]), "".join(lines[n:])


def requirement_count(text: str) -> int:
    return len(_blocks(split_lock(text)[1]))


def body_line(body: str) -> str:
    """The header line recording the body's sha256 and entry count: a lock cut or edited below it is told."""
    return f"# body sha256:{hashlib.sha256(body.encode()).hexdigest()} ({len(_blocks(body))} requirements)"


def body_problem(name: str, text: str) -> str:
    """'' when the body of the lock `name` is the one its header records; else one line."""
    head, body = split_lock(text)
    recorded = BODY_RE.search(head)
    if not recorded:
        return f"{name} records no digest of its requirements (# body sha256:...): run python3 -m tools.pins lock"
    digest, count = BODY_RE.search(body_line(body)).groups()
    if count != recorded.group(2):
        return (f"{name} holds {count} requirements, not the {recorded.group(2)} its header records (a cut lock): "
                "run python3 -m tools.pins lock")
    if digest != recorded.group(1):
        return (f"{name}: its requirements are not the ones its header records (an edited lock): "
                "run python3 -m tools.pins lock")
    return ""


def header(lock: Lock, spec: dict, inputs: list[tuple[str, str]], body: str) -> str:
    where = f"{lock.platform}, Python {lock.python}" if lock.platform else f"every platform, Python {lock.python}+"
    options = f"{' --no-deps' if lock.no_deps else ''}{' --only-binary :all:' if lock.only_binary else ''}"
    lines = [f"# Locked by `{lock.command or f'python3 -m tools.pins lock {lock.name}'}` (uv pip compile "
             f"--generate-hashes{options}): do not edit; change the input and lock again.",
             f"# For {where}; PyPI releases uploaded before {spec['exclude_newer']}.",
             "# Install: pip install --require-hashes --no-deps -r <this file>"]
    if lock.remove:
        lines.append(f"# Left out (the base image provides them): {', '.join(lock.remove)}.")
    if lock.no_emit:
        lines.append(f"# Left out: {', '.join(lock.no_emit)} (see docker/locks/locks.json).")
    if lock.overrides:
        lines.append(f"# Overrides (see docker/locks/locks.json): {'; '.join(lock.overrides)}.")
    lines += [f"# input {name} sha256:{digest}" for name, digest in inputs]
    lines.append(body_line(body))
    return "\n".join(lines) + "\n"


def preferences(text: str) -> str:
    """A lock's requirement lines without hashes: what the resolver is offered to keep."""
    return "".join(lines[0].removesuffix("\\").rstrip() + "\n" for _, lines, _ in _blocks(split_lock(text)[1]))


def compile_lock(lock: Lock, root: Path, data: dict, spec: dict, sdist_cache: Path | None,
                 uv: list[str] | None = None, prefer: str | None = None, source: Path | None = None) -> str:
    """The lock's text as the resolver makes it now."""
    uv = uv or uv_command()
    with tempfile.TemporaryDirectory(prefix="ci-pins-lock-") as tmp:
        tmp_path = Path(tmp)
        if source is not None:
            cwd, inputs = source, list(lock.inputs)
        elif lock.track:
            archive = discover.fetch(discover.track_sdist(data, lock.track), sdist_cache)
            cwd = _sdist_tree(archive, tmp_path / "src")
            inputs = [i.removeprefix(SDIST) for i in lock.inputs]
        else:
            cwd, inputs = root, list(lock.inputs)
        recorded = [(str(path.relative_to(cwd.resolve())), hashlib.sha256(path.read_bytes()).hexdigest())
                    for name in inputs for path in _includes((cwd / name).resolve())]
        cmd = [*uv, "pip", "compile", "--generate-hashes", "--no-header", "--python-version", lock.python,
               "--exclude-newer", spec["exclude_newer"], "--index-url", spec.get("index_url", "https://pypi.org/simple"),
               "--no-config",
               # Every index page revalidated: a cached page from before a release must not decide
               # a lock (ml-dtypes 0.7.0, uploaded 2026-11-16, was missed from a stale cache).
               "--refresh"]
        cmd += ["--python-platform", lock.platform] if lock.platform else ["--universal"]
        if lock.no_deps:
            cmd.append("--no-deps")
        if lock.only_binary:
            cmd += ["--only-binary", ":all:"]
        for name in lock.no_emit:
            cmd += ["--no-emit-package", name]
        if lock.remove:
            # The base image's versions bound the resolution (PyPI's builds of the same releases
            # stand for the ROCm ones: same version numbers), then leave the lock.
            held = tmp_path / "base-image.txt"
            held.write_text("".join(f"{n}=={v}\n" for n, v in base_image_versions(data, lock.track).items()))
            cmd += ["--constraint", str(held)]
        if lock.overrides:
            override = tmp_path / "overrides.txt"
            override.write_text("".join(f"{line}\n" for line in lock.overrides))
            cmd += ["--override", str(override)]
        if lock.find_links:
            local = [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]
            cmd += [a for p in local for a in ("--find-links", p)] if local else \
                ["--extra-index-url", lock.find_links, "--index-strategy", "unsafe-best-match"]
        if prefer is not None:
            kept = tmp_path / "preferences.txt"
            kept.write_text(preferences(prefer))
            cmd += ["--output-file", str(kept)]
        cmd += inputs
        body = _uv_compile(cmd, cwd, f"lock {lock.name}")
        if lock.remove:
            body = without(body, set(lock.remove)).replace(f"-c {held}", "the base image")
        return header(lock, spec, recorded, body) + body


def _uv_compile(cmd: list[str], cwd: Path | None, what: str, stdin: str | None = None,
                env: dict[str, str] | None = None) -> str:
    """uv pip compile's output within 900 s; otherwise a PinError naming `what` with uv's last words."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900, input=stdin, env=env)
    except subprocess.TimeoutExpired:
        raise PinError(f"{what}: uv pip compile took more than 900 s") from None
    if proc.returncode != 0:
        reason = " ".join(proc.stderr.split())[-1500:]
        raise PinError(f"{what}: uv pip compile failed: {reason}")
    return proc.stdout


def index_lock(data: dict, requirements: list[str], index_url: str, what: str, no_emit: tuple[str, ...] = (),
               uv: list[str] | None = None) -> str:
    """The body of a hash lock of `requirements` and all they require, resolved against `index_url` alone
    (never PyPI or a second index: no UV_* setting nor uv.toml is read) for the images' platform and Python."""
    platform = platform_tag(data["platform"])
    limit = math.ceil(resolve.timeout())
    cmd = [*(uv or uv_command()), "pip", "compile", "--generate-hashes", "--no-header", "--no-config",
           "--refresh", "--python-version", data["python"]["version"], "--python-platform", platform,
           "--index-url", index_url, "--index-strategy", "first-index", "--only-binary", ":all:",
           "--no-python-downloads", *(a for name in no_emit for a in ("--no-emit-package", name)), "-"]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("UV_")}, "UV_HTTP_TIMEOUT": str(limit)}
    return _uv_compile(cmd, None, f"{what} (each read within PINS_TIMEOUT={limit}s)",
                       stdin="".join(f"{line}\n" for line in requirements), env=env)


def _index_lock_text(data: dict, requirements: list[str], body: str, command: str, index_url: str, pin: str,
                     install: str, notes: tuple[str, ...] = ()) -> str:
    """A lock made by index_lock: its header and body."""
    platform = platform_tag(data["platform"])
    lines = [f"# Locked by `{command}` (uv pip compile --generate-hashes against "
             f"{resolve.secret_values.masked_url(index_url)} alone): do not edit; resolve again.",
             f"# For {platform}, Python {data['python']['version']}. Its sha256 is {pin} in versions.json.",
             f"# Install: {install} (pip --isolated --require-hashes --no-deps, that index alone)",
             *notes, *(f"# input {line}" for line in requirements), body_line(body)]
    return "\n".join(lines) + "\n" + body


# Left out of a TheRock lock: the Triton distributions TheRock's torch may name; the image builds its
# Triton from the pinned commit (tracks.<track>.therock.triton) and makes torch require that one.
THEROCK_BUILT_HERE = ("triton", "pytorch-triton-rocm", "triton-rocm")


def therock_lock(data: dict, track: str, uv: list[str] | None = None, index_url: str | None = None) -> str:
    """The hash lock of a therock track's TheRock wheels, against the track's release index alone."""
    therock = data["tracks"][track]["therock"]
    wanted = model.therock_requirements(data["tracks"][track]["rocm"]["version"], therock["torch"], data["gpu_archs"])
    body = index_lock(data, wanted, index_url or therock["index_url"], f"therock lock of track {track}",
                      THEROCK_BUILT_HERE, uv)
    return _index_lock_text(data, wanted, body, f"python3 -m tools.pins resolve therock --track {track}",
                            therock["index_url"], f"tracks.{track}.therock.lock_sha256",
                            "docker/therock_sdk.sh through docker/install_lock.sh",
                            (f"# Left out (the image builds Triton from source): {', '.join(THEROCK_BUILT_HERE)}.",))


def pytorch_lock(data: dict, track: str, uv: list[str] | None = None, index_url: str | None = None) -> str:
    """The hash lock of the PyTorch wheels a rocm-image track installs, against its section's index alone."""
    pytorch = model.section(data, "pytorch", track)
    where = model.section_path(data, "pytorch", track)
    wanted = model.torch_requirements(pytorch["torch"])
    body = index_lock(data, wanted, index_url or pytorch["index_url"], f"PyTorch lock of {where}", uv=uv)
    command = "python3 -m tools.pins resolve wheels" + (f" --track {track}" if where != "pytorch" else "")
    return _index_lock_text(data, wanted, body, command, pytorch["index_url"], f"{where}.lock_sha256",
                            "docker/install_torch.sh through docker/install_lock.sh")


AITER_REQUIREMENTS = "requirements.txt"  # AITER's own requirements, at the root of its source


def aiter_lock(data: dict, name: str, source: Path, root: Path = model.REPO_ROOT, uv: list[str] | None = None,
               index_url: str | None = None) -> str:
    """The hash lock of AITER pin `name`'s own requirements (source/requirements.txt), made as locks.json's
    PyPI locks are: the base image's distributions bound the resolution with the versions of the newest track
    that builds this pin, then leave the lock with what only they require (the install never replaces them)."""
    pin = data["aiter"]["pins"][name]
    if any(re.match(r"\s*(?:-r|-c|--requirement|--constraint)\b", line)
           for line in (source / AITER_REQUIREMENTS).read_text().splitlines()):
        raise PinError(f"AITER {pin['tag']}: its {AITER_REQUIREMENTS} includes other files (-r/-c): lock them too "
                       "(tools/pins/locks.py aiter_lock fetches requirements.txt alone)")
    tracks = [t for t in model.built_track_names(data) if data["tracks"][t]["aiter"] == name]
    spec = load(root)
    if index_url:
        spec = {**spec, "index_url": index_url}
    platform = platform_tag(data["platform"])
    lock = Lock(f"aiter-{pin['tag']}", (AITER_REQUIREMENTS,), str(model.LOCKS_DIR / model.aiter_lock_name(pin["tag"])),
                data["python"]["version"], platform, remove=base_image_dists(root),
                track=tracks[0] if tracks else None, family="aiter", only_binary=True,
                command=f"python3 -m tools.pins resolve aiter --aiter-pin {name} --write")
    return compile_lock(lock, root, data, spec, None, uv, source=source)


LOCK_JOBS = 4  # locks resolved at once


def run(root: Path, data: dict, names: list[str], check: bool, sdist_cache: Path, upgrade: bool = False) -> int:
    spec = load(root)
    known = locks(root, data, spec)
    chosen = [lk for lk in known if not names or lk.name in names or lk.family in names]
    unknown = [n for n in names if not any(n in (lk.name, lk.family) for lk in known)]
    if unknown:
        raise PinError(f"lock: unknown lock(s) {', '.join(unknown)}; known: {', '.join(lk.name for lk in known)}")
    uv = uv_command()
    stale, texts = [], {}
    now = {lk.name: (root / lk.output).read_text() if (root / lk.output).is_file() else None for lk in chosen}

    def made(lk: Lock) -> str:
        print(f"lock {lk.name}: resolving {', '.join(lk.inputs)} ...", file=sys.stderr, flush=True)
        return compile_lock(lk, root, data, spec, sdist_cache, uv, prefer=None if upgrade else now[lk.name])

    # The resolver mostly waits on the index: LOCK_JOBS locks resolved at once, reported in order.
    with ThreadPoolExecutor(max_workers=LOCK_JOBS) as pool:
        outcomes = list(zip(chosen, pool.map(made, chosen)))
    for lk, text in outcomes:
        if now[lk.name] != text:
            stale.append(lk)
            texts[root / lk.output] = text
        print(f"lock {lk.name}: {lk.output} {'differs' if now[lk.name] != text else 'up to date'} "
              f"({len(_blocks(text))} distributions)")
    if check:
        for lk in stale:
            print(f"error: {lk.output} is not what its inputs lock to now: run python3 -m tools.pins lock {lk.name}",
                  file=sys.stderr)
        return 1 if stale else 0
    model.write_files(texts)
    return 0
