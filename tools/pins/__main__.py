"""python3 -m tools.pins verify [--strict] | resolve [WHAT...] [--write] | args | render | tracks | therock | format |
discover [--write] | lock [NAME...] [--check] [--upgrade]

--track NAME: one release track of versions.json (default: every track; args: default_track; therock:
the newest therock track). --aiter-pin NAME: an AITER pin of aiter.pins (default: the track's)."""
from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import importlib.util
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

# What the tool imports beyond the standard library, by import name: tools/pyproject.toml's dependencies
# (less uv, which only `resolve` and `lock` run: locks.uv_command says how to get it).
NEEDED = ("jsonschema", "packaging", "rocm_vllm_runtime", "urllib3")
# How the tool runs where this Python lacks them: uv makes and keeps its environment from tools/uv.lock.
UV_RUN = ("uv", "run", "--locked", "--project", "tools", "python", "-m", "tools.pins")
UV_INSTALL = "https://docs.astral.sh/uv/getting-started/installation/"
# The characters str.splitlines breaks a line at, shown escaped: each error is one line whatever the file holds.
_LINE_BREAKS = str.maketrans({c: ascii(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def libraries_or_exit(argv: list[str]) -> None:
    """Return where this Python has the tool's libraries; else stop in one line naming the uv command."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if not missing:
        return
    sys.exit(f"error: this Python lacks {', '.join(missing)} (tools/pyproject.toml): {_install_uv()}run the pin "
             f"tool with uv from the repository root: {_uv_command(argv, 'rocm_vllm_runtime' not in missing)}")


def _install_uv() -> str:
    return "" if shutil.which("uv") else f"install uv ({UV_INSTALL}), then "


def _uv_command(argv: list[str], can_mask: bool) -> str:
    """The uv command for these arguments, their credentials masked by the runtime's secrets; where this
    Python lacks the runtime too, the arguments are not shown (nothing could mask them)."""
    if not can_mask:
        return f"{' '.join(UV_RUN)} with the same arguments"
    from rocm_vllm_runtime import secret_values
    return secret_values.shown([*UV_RUN, *argv]).translate(_LINE_BREAKS)


if __name__ == "__main__":
    libraries_or_exit(sys.argv[1:])

from . import discover, locks, model, resolve, verify  # noqa: E402
from .model import PinError  # noqa: E402

RESOLVE_ITEMS = ("aiter", "vllm", "base-image", "wheels", "therock")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.pins", description=__doc__)
    parser.add_argument("--file", type=Path, default=model.VERSIONS_FILE, help="versions file (default: versions.json)")
    sub = parser.add_subparsers(dest="command", required=True)
    flag = {"action": "store_true"}
    cache = {"type": Path, "help": "where sdists are kept (default: ~/.cache/rocm-vllm-pins)"}
    for name, about, options in (
        ("verify", "check the versions file, the Dockerfiles' ARG defaults, the backend's range and the locks",
         {"--strict": {**flag, "help": "also fail on unresolved pins (release builds)"}, "--track": {},
          "--aiter-pin": {}}),
        ("resolve", "resolve tags to commits, the image digest and the wheel locks (needs network)",
         {"what": {"nargs": "*", "default": [], "metavar": "{" + ",".join(RESOLVE_ITEMS) + "}",
                   "help": "what to resolve (default: everything unresolved)"},
          "--track": {}, "--aiter-pin": {}, "--registry": {"help": "registry host[:port] to read the base image from"},
          "--write": {**flag, "help": "write the results (versions file, Dockerfiles' ARG defaults, locks)"},
          "--force": {**flag, "help": "replace pins that are set when upstream differs"}}),
        ("args", "print the build args of a track (NAME=value)", {"--track": {}, "--aiter-pin": {},
                                                                  "--allow-unresolved": flag}),
        ("tracks", "print the release tracks, newest first, and the backend's vLLM range",
         {"--json": {**flag, "help": "the track names as a JSON list"},
          "--names": {**flag, "help": "the track names, one a line (for scripts)"},
          "--built": {**flag, "help": "only the tracks whose images this repository builds"}}),
        ("therock", "print what a therock track installs (the input of its hash lock)", {"--track": {}}),
        ("format", "rewrite the versions file in its canonical layout", {}),
        ("render", "write the build files' pins from the versions file: docker-bake.pins.json (what bake reads) "
                   "and the Dockerfiles' ARG defaults", {}),
        ("discover", "add vLLM releases newer than the newest track as tracks (needs network)",
         {"--write": {**flag, "help": "write the new tracks"}, "--list": {**flag, "help": "only list the releases"},
          "--release": {"help": "add only this release"}, "--up-to": {"help": "leave out releases after this one"},
          "--summary": {"type": Path, "help": "write what changed upstream (Markdown) here"},
          "--aiter-tags": {**flag, "help": "also report newer AITER tags"}, "--sdist-cache": cache}),
        ("lock", "remake the hash locks of docker/locks/locks.json with uv (needs PyPI)",
         {"names": {"nargs": "*", "metavar": "NAME", "help": "locks to remake (default: every one)"},
          "--check": {**flag, "help": "write nothing; fail when a lock differs from what its inputs lock to"},
          "--upgrade": {**flag, "help": "take the newest releases, not the versions each lock holds"},
          "--sdist-cache": cache}),
    ):
        p = sub.add_parser(name, help=about)
        for option, kwargs in options.items():
            p.add_argument(option, **kwargs)

    ns = parser.parse_args(argv)
    try:
        try:
            root = ns.file.resolve().parent
        except (RuntimeError, OSError) as exc:  # a symlink loop
            raise PinError(f"{ns.file}: cannot resolve the path ({exc})") from None
        return run(ns, parser, root)
    except PinError as exc:
        error(exc)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


def error(text: object) -> None:
    print(f"error: {str(text).translate(_LINE_BREAKS)}", file=sys.stderr)


def _failed(path: Path, errors: list[str]) -> int:
    for line in errors:
        error(line)
    print(f"{path.name}: {len(errors)} error(s)", file=sys.stderr)
    return 1


def run(ns, parser, root: Path) -> int:
    data = model.load(ns.file)
    # The schema first, in every subcommand: nothing reads a malformed file.
    errors = verify.check_schema(data)
    if errors:
        return _failed(ns.file, errors)
    if getattr(ns, "aiter_pin", None) is not None and ns.aiter_pin not in data["aiter"]["pins"]:
        raise PinError(f"--aiter-pin {ns.aiter_pin}: not a key of aiter.pins (known: "
                       f"{', '.join(sorted(data['aiter']['pins']))})")
    if getattr(ns, "track", None) is not None and ns.track not in data["tracks"]:
        raise PinError(f"--track {ns.track}: not a key of tracks (known: {', '.join(model.track_names(data))})")
    if ns.command == "therock":
        return run_therock(ns, data)
    if ns.command == "tracks":
        built = model.built_track_names(data)
        names = built if ns.built else model.track_names(data)
        if ns.json or ns.names:
            print(json.dumps(names) if ns.json else "\n".join(names))
            return 0
        for name in names:
            own = data["tracks"][name]
            mark = " (default)" if name == data["default_track"] else ""
            print(f"{name}{mark}: vLLM {own['vllm']['version']}, AITER {data['aiter']['pins'][own['aiter']]['tag']}, "
                  f"ROCm {model.section(data, 'rocm', name)['version']} ({model.track_stack(data, name)}"
                  f"{'' if name in built else ', images not built here yet'})")
        print(backend_range_line(data, root))
        return 0
    if ns.command == "format":
        written = model.write_files({ns.file: model.canonical(data)})
        print(f"{ns.file.name}: {'rewritten in' if written else 'already in'} the canonical layout")
        return 0
    if ns.command == "render":
        changes, texts = model.global_arg_updates(data, root)
        model.write_files(texts)
        for line in changes:
            print(line)
        print(f"the build files are what {ns.file.name} renders to")
        return 0
    if ns.command == "discover":
        return run_discover(ns, data, root)
    if ns.command == "lock":
        return locks.run(root, data, ns.names, ns.check, sdist_cache(ns), ns.upgrade)
    if ns.command == "verify":
        errors, unresolved = verify.verify(data, ns.strict, root, ns.aiter_pin, ns.track)
        if ns.file.read_bytes() != model.canonical(data).encode():
            errors.insert(0, f"{ns.file.name} is not in the canonical layout (keys sorted, two-space indent, one "
                             "trailing newline): run python3 -m tools.pins format")
        if errors:
            return _failed(ns.file, errors)
        if unresolved:
            print(f"{ns.file.name}: OK, {len(unresolved)} unresolved pin(s) (verify --strict fails on them): "
                  + ", ".join(unresolved))
        else:
            print(f"{ns.file.name}: OK, every pin resolved")
        return 0
    if ns.command == "resolve":
        return run_resolve(ns, data, root)
    if ns.command == "args":
        for key, value in model.build_args(data, ns.aiter_pin, ns.allow_unresolved, ns.track).items():
            print(f"{key}={value}")
        return 0
    return 2


@dataclasses.dataclass
class Item:
    label: str
    needs: str
    run: Callable[[], list[str]]


def resolve_items(ns, data: dict, root: Path, what: list[str], tracks: list[str], pin_names: list[str],
                  lock_texts: dict[Path, str]) -> list[Item]:
    """The items to resolve; each lock one makes goes into lock_texts ({path: text})."""
    items: list[Item] = []
    for kind in what:
        if kind == "aiter":
            for name in pin_names:
                def run_aiter(name=name) -> list[str]:
                    changes = resolve.resolve_aiter(data, name, ns.force)
                    # the hash lock of its own requirements, from the commit's requirements.txt
                    return changes + resolve_aiter_lock(ns, data, root, name, lock_texts)
                items.append(Item(f"aiter.pins.{name}", _git_remote(data["aiter"]["repository"]), run_aiter))
        elif kind == "vllm":
            for track in tracks:
                items.append(Item(f"tracks.{track}.vllm", _git_remote(data["vllm"]["repository"]),
                                  lambda track=track: resolve.resolve_vllm(data, track, ns.force)))
        elif kind == "base-image":
            for track in _distinct(data, tracks, "base_image"):
                base = model.section(data, "base_image", track)
                if model.track_stack(data, track) == model.THEROCK_STACK and base.get("digest"):
                    continue  # a therock base is upstream's, by the digest its Dockerfile names (discover)
                ref = resolve.image_ref(base["name"], base["tag"], ns.registry)
                items.append(Item(model.section_path(data, "base_image", track),
                                  f"the container registry of {ref} (its digest)",
                                  lambda track=track: resolve.resolve_base_image(data, ns.registry, ns.force,
                                                                                 track)))
        elif kind == "therock":
            for track in [t for t in tracks if model.track_stack(data, t) == model.THEROCK_STACK]:
                index = data["tracks"][track]["therock"]["index_url"]
                items.append(Item(f"tracks.{track}.therock",
                                  f"TheRock's wheel index {_masked(index)} (the TheRock lock)",
                                  lambda track=track: resolve_therock(ns, data, root, track, lock_texts)))
        elif kind == "wheels":
            for track in _distinct(data, [t for t in tracks if model.pytorch_pins(data, t)], "pytorch"):
                index = model.section(data, "pytorch", track)["index_url"]
                items.append(Item(model.section_path(data, "pytorch", track),
                                  f"the PyTorch wheel index {_masked(index)} (the PyTorch lock)",
                                  lambda track=track: resolve_pytorch(ns, data, root, track, lock_texts)))
    return items


def run_resolve(ns, data: dict, root: Path) -> int:
    """Resolve every item all or nothing: one that fails is named, left as it was, and the others go on."""
    bad = [w for w in ns.what if w not in RESOLVE_ITEMS]
    if bad:
        raise PinError(f"resolve: unknown item(s) {', '.join(bad)}; choose from {', '.join(RESOLVE_ITEMS)}")
    tracks = [ns.track] if ns.track else model.track_names(data)
    # The AITER pins to resolve: --aiter-pin, else each track's own.
    pin_names = [ns.aiter_pin] if ns.aiter_pin else list(dict.fromkeys(data["tracks"][t]["aiter"] for t in tracks))
    unresolved = model.unresolved_pins(data)
    what = ns.what or [w for w, todo in (
        ("aiter", any(p.startswith(f"aiter.pins.{n}.") for n in pin_names for p in unresolved)),
        ("vllm", any(data["tracks"][t]["vllm"].get("unresolved") for t in tracks)),
        ("base-image", any(model.section(data, "base_image", t).get("unresolved") for t in tracks)),
        ("wheels", any(model.section(data, "pytorch", t).get("unresolved") for t in tracks
                       if model.pytorch_pins(data, t))),
        ("therock", any(data["tracks"][t]["therock"].get("unresolved") for t in tracks
                        if model.track_stack(data, t) == model.THEROCK_STACK)),
    ) if todo]
    lock_texts: dict[Path, str] = {}
    items = resolve_items(ns, data, root, what, tracks, pin_names, lock_texts)
    changes: list[str] = []
    failed: list[Item] = []
    for item in items:
        before = copy.deepcopy(data)
        try:
            changes += item.run()
        except PinError as exc:
            data.clear()
            data.update(before)  # what the item set before it failed is not kept
            failed.append(item)
            error(f"{item.label}: {exc}")
    for line in changes:
        print(line)
    if not changes and not failed:
        print("nothing changed")
    if ns.write and changes:
        _record(data, ns.file, root, lock_texts)
    elif changes:
        print("(dry run: add --write to record these)")
    if failed:
        needs = list(dict.fromkeys(item.needs for item in failed))
        print(f"error: resolve: {len(failed)} of {len(items)} item(s) not resolved "
              f"({', '.join(item.label for item in failed)}): they need {_and(needs)}; run "
              "python3 -m tools.pins resolve --write on a machine that reaches them", file=sys.stderr)
        return 1
    return 0


def resolve_therock(ns, data: dict, root: Path, track: str, lock_texts: dict[Path, str]) -> list[str]:
    return _resolve_lock(ns, data["tracks"][track]["therock"], f"tracks.{track}.therock",
                         root / model.LOCKS_DIR / model.therock_lock_name(track),
                         lambda: locks.therock_lock(data, track), lock_texts)


def resolve_pytorch(ns, data: dict, root: Path, track: str, lock_texts: dict[Path, str]) -> list[str]:
    return _resolve_lock(ns, model.section(data, "pytorch", track), model.section_path(data, "pytorch", track),
                         root / model.LOCKS_DIR / model.pytorch_lock_name(data, track),
                         lambda: locks.pytorch_lock(data, track), lock_texts)


def resolve_aiter_lock(ns, data: dict, root: Path, name: str, lock_texts: dict[Path, str]) -> list[str]:
    """The hash lock of AITER pin `name`'s own requirements, from its commit's requirements.txt; a commit
    without one pins model.NO_REQUIREMENTS and has no lock."""
    pin = data["aiter"]["pins"][name]
    if not pin.get("commit") or (pin.get("requirements_lock_sha256") and not ns.force):
        return []
    where = f"aiter.pins.{name}"
    path = root / model.LOCKS_DIR / model.aiter_lock_name(pin["tag"])
    with tempfile.TemporaryDirectory(prefix="pins-aiter-reqs-") as tmp:
        source = Path(tmp)
        resolve.fetch_files(data["aiter"]["repository"], pin["commit"], [locks.AITER_REQUIREMENTS], source)
        if not (source / locks.AITER_REQUIREMENTS).is_file():
            if pin.get("requirements_lock_sha256") == model.NO_REQUIREMENTS:
                return []
            pin["requirements_lock_sha256"] = model.NO_REQUIREMENTS
            pin["unresolved"] = [f for f in pin.get("unresolved", []) if f != "requirements_lock_sha256"]
            return [f"{where}.requirements_lock_sha256: {model.NO_REQUIREMENTS} ({pin['commit'][:12]} has no "
                    f"{locks.AITER_REQUIREMENTS})"]
        return _resolve_lock(ns, pin, where, path, lambda: locks.aiter_lock(data, name, source, root), lock_texts,
                             "requirements_lock_sha256")


def _resolve_lock(ns, node: dict, where: str, path: Path, make: Callable[[], str],
                  lock_texts: dict[Path, str], key: str = "lock_sha256") -> list[str]:
    """The lock `make` returns, to be written at path, and its sha256 into node's key; a lock already pinned
    is kept unless --force."""
    if node.get(key) and not ns.force:
        return []
    text = make()
    problem = verify.lock_lines.problem(str(model.LOCKS_DIR / path.name), text.encode())
    if problem:  # what the resolver made is no lock install_lock.sh takes: nothing is written
        raise PinError(f"{where}: {problem}")
    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest == node.get(key):
        return []
    lock_texts[path] = text
    node[key] = digest
    node["unresolved"] = [f for f in node.get("unresolved", []) if f != key]
    return [f"{where}.{key}: {digest} ({model.LOCKS_DIR / path.name}, {locks.requirement_count(text)} wheels)"]


def run_therock(ns, data: dict) -> int:
    """The requirement lines of a therock track, headed by how to lock them."""
    therock = model.therock_track_names(data)
    name = ns.track or (therock[0] if therock else None)
    if name is None or name not in therock:
        raise PinError(f"{'--track ' + name if name else 'versions.json'}: no therock track "
                       f"(therock tracks: {', '.join(therock) or 'none'})")
    track = data["tracks"][name]
    platform = locks.platform_tag(data["platform"])
    index = _masked(track["therock"]["index_url"])  # a mirror's credentials are not printed
    print(f"# TheRock wheels of track {name}; lock them against the release index alone:\n"
          f"#   uv pip compile --generate-hashes --index-url {index} "
          f"--python-version {data['python']['version']} --python-platform {platform} FILE")
    for line in model.therock_requirements(track["rocm"]["version"], track["therock"]["torch"], data["gpu_archs"]):
        print(line)
    return 0


def _record(data: dict, path: Path, root: Path, extra: dict[Path, str] | None = None) -> None:
    """The versions file, the Dockerfiles (and extra files) written together: all, or none."""
    docker_changes, texts = model.recorded_files(data, path, root)
    model.write_files({**texts, **(extra or {})})
    for line in docker_changes:
        print(line)


def _git_remote(url: str) -> str:
    return f"the git remote {_masked(url)} (commits)"


def _masked(url: str) -> str:
    return resolve.secret_values.masked_url(url)


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def backend_range_line(data: dict, root: Path) -> str:
    declared = model.backend_supported_vllm(root)[1] or model.supported_vllm(data)
    line = f"backend supports vLLM {declared}"
    aside = model.stepped_aside(data, declared)
    if aside:
        line += (f"; it steps aside on track {', '.join(aside)} (vLLM's built-in runs there) until the plugin is "
                 "compared with that release (tests/test_builtin_surface.py) and SUPPORTED_VLLM is widened by hand")
    return line


def sdist_cache(ns) -> Path:
    """--sdist-cache, else ~/.cache/rocm-vllm-pins; a PinError where there is no home folder to take."""
    if ns.sdist_cache is not None:
        return ns.sdist_cache
    try:
        return Path.home() / ".cache" / "rocm-vllm-pins"
    except (RuntimeError, KeyError):
        raise PinError("no home folder to keep sdists in (HOME is unset and the user has none): set HOME or pass "
                       "--sdist-cache DIR") from None


def run_discover(ns, data: dict, root: Path) -> int:
    index = data["vllm"].get("index_url") or discover.DEFAULT_INDEX
    found = discover.new_releases(data, discover.pypi_sdists(index), ns.up_to)
    if ns.release:
        found = [s for s in found if s.version == ns.release]
        if not found:
            raise PinError(f"--release {ns.release}: not a vLLM release newer than the newest track "
                           f"({model.track_names(data)[0]}) on PyPI")
    if ns.list:
        for sdist in found:
            print(sdist.version)
        return 0
    newest = model.track_names(data)[0]
    parts: list[str] = []
    if found:
        old_sdist = discover.track_sdist(data, newest)
        old = discover.read_release(discover.fetch(old_sdist, sdist_cache(ns)), old_sdist.version)
    for sdist in found:
        release = discover.read_release(discover.fetch(sdist, sdist_cache(ns)), sdist.version)
        proposal = discover.add_track(data, sdist, release)
        print(f"tracks.{proposal.track}: vLLM {proposal.version}, AITER {proposal.aiter_tag} "
              f"(from its {proposal.base_dockerfile})"
              + ("; the new default track" if data["default_track"] == proposal.track else ""))
        for note in proposal.notes:
            print(f"note: {note}")
        parts.append(discover.summary(old, release, proposal))
    if not found:
        print(f"no vLLM release newer than track {newest} (vLLM {data['tracks'][newest]['vllm']['version']}) on PyPI")
    if ns.aiter_tags:
        try:
            lines = discover.newer_aiter_tags(data, discover.aiter_tags(data["aiter"]["repository"]))
        except PinError as exc:  # a report only: the proposal stands without it
            lines = [f"AITER's tags could not be read ({exc})"]
        for line in lines:
            print(f"note: {line}")
        if lines:
            parts.append("### AITER\n\n" + "".join(f"- {line}\n" for line in lines))
    if ns.summary:
        model.write_files({ns.summary: "\n".join(parts) or "Nothing new upstream.\n"})
    if ns.write and found:
        errors = verify.check_schema(data)
        if errors:
            raise PinError(f"the proposed versions file would not verify: {errors[0]}")
        _record(data, ns.file, root)
        print(backend_range_line(data, root))
    elif found:
        print("(dry run: add --write to record these)")
    return 0


def _distinct(data: dict, tracks: list[str], key: str) -> list[str]:
    """One track per distinct section object (tracks that share the top-level one count once)."""
    seen: dict[int, str] = {}
    for track in tracks:
        seen.setdefault(id(model.section(data, key, track)), track)
    return list(seen.values())


if __name__ == "__main__":
    sys.exit(main())
