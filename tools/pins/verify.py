"""`verify`: the versions file is well formed, and every global Dockerfile ARG default and docker-bake.pins.json
agree with it."""
from __future__ import annotations

import hashlib
from pathlib import Path

from packaging.version import Version

from rocm_vllm_runtime import files, numeric, schema, secret_values
from .. import build_scripts
from . import model, render
from .model import PinError

lock_lines = build_scripts.load("lock_lines")  # docker/lock_lines.py, the one reader of a lock's lines

SCHEMA_FILE = model.REPO_ROOT / "versions.schema.json"


def check_schema(data: dict) -> list[str]:
    """versions.json against versions.schema.json, then what holds across fields (unresolved lists, track
    names, commit prefixes, TheRock's release index, no credentials in a URL)."""
    secret = {path: why for path, value in _urls(data, "") if (why := credentials_problem(path, value) or
                                                                _port_problem(path, value))}
    errors = [f"{path}: {why}" for path, why in secret.items()]  # the value is not shown
    errors += [e for e in schema.problems(data, files.read_json(SCHEMA_FILE, SCHEMA_FILE.name))
               if e.split(":", 1)[0] not in secret]
    if errors:
        return errors
    _unresolved(data, "", errors)
    if data["default_track"] not in data["tracks"]:
        errors.append(f"default_track: {data['default_track']} is not a key of tracks ({', '.join(data['tracks'])})")
    for name, own in data["tracks"].items():
        where = f"tracks.{name}"
        if own["aiter"] not in data["aiter"]["pins"]:
            errors.append(f"{where}.aiter: {own['aiter']} is not a key of aiter.pins: add that pin or name another")
        vllm = own["vllm"]
        if "{}.{}".format(*Version(vllm["version"]).release) != name:
            errors.append(f"{where}.vllm.version: {vllm['version']} is not of release line {name}: rename the "
                          "track or fix the version")
        if vllm["commit"] and not vllm["commit"].startswith(vllm.get("commit_prefix", "")):
            errors.append(f"{where}.vllm.commit {vllm['commit']} does not start with {where}.vllm.commit_prefix "
                          f"{vllm['commit_prefix']}: wrong commit")
        if "therock" in own:
            if problem := model.therock_index_problem(own["therock"]["index_url"]):
                errors.append(f"{where}.therock.index_url: {problem}: TheRock's release index over https")
    for name, pin in data["aiter"]["pins"].items():
        for key in ("ck_commit", "requirements_lock_sha256"):
            if pin["commit"] is None and pin[key] is not None:
                errors.append(f"aiter.pins.{name}.{key} is set but commit is not: it is read from the commit")
    return errors


def _unresolved(node, path: str, errors: list[str]) -> None:
    if isinstance(node, dict):
        listed = node.get("unresolved", [])
        for field in listed:
            if field not in node:
                errors.append(f"{path}.unresolved names {field}, which is not a field of {path}")
            elif node[field] is not None:
                errors.append(f"{path}.{field} is set but still listed in {path}.unresolved: remove it from the list")
        for key, value in node.items():
            here = f"{path}.{key}" if path else key
            if value is None and key not in listed:
                errors.append(f"{here} is null but not listed in {path or 'the top'}.unresolved: set it or list it")
            _unresolved(value, here, errors)


def _urls(node, path: str):
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}" if path else key
            if key in model.REPOSITORY_KEYS + model.URL_KEYS and isinstance(value, str):
                yield here, value
            yield from _urls(value, here)


def _port_problem(path: str, value: str) -> str | None:
    """Why an http(s) URL's host and port cannot be read (numeric.url: a port is a TCP port)."""
    if not value.startswith(("https://", "http://")):
        return None
    try:
        numeric.url(path, value)
    except numeric.SettingError as exc:
        return str(exc).removeprefix(f"{path}=")
    return None


def credentials_problem(key: str, value: str) -> str | None:
    """Why a URL of the versions file holds credentials (None: it holds none)."""
    spans = secret_values.userinfo_spans(value)
    if not spans:
        return None
    userinfo = value[spans[0][0]:spans[0][1]]
    if key.rsplit(".", 1)[-1] in model.REPOSITORY_KEYS and value.lower().startswith(("ssh://", "git://")) \
            and ":" not in userinfo:
        return None
    return ("holds credentials (user:password@ or token@ before the host): a committed file never holds them; "
            "give them to pip or git through their own configuration (netrc, a credential helper)")


def check_backend_range(data: dict, root: Path = model.REPO_ROOT) -> list[str]:
    """The backend's SUPPORTED_VLLM runs from the oldest track up to one of the tracks (a track past it is one
    the plugin was not yet compared with)."""
    path, declared = model.backend_supported_vllm(root)
    if not path.exists():
        return []
    allowed = model.backend_ranges(data)
    if declared not in allowed.values():
        return [f"{model.BACKEND_INIT}: SUPPORTED_VLLM is {declared!r}, which does not run from the oldest track up "
                f"to a track: change SUPPORTED_VLLM to one of {', '.join(repr(r) for r in allowed.values())}"]
    return []


def check_dockerfiles(data: dict, root: Path = model.REPO_ROOT) -> list[str]:
    """Every global ARG the versions file defines defaults to its value for the default track (stages
    re-declare ARGs by name only)."""
    errors: list[str] = []
    expected = model.build_args(data)
    for name in model.DOCKERFILES:
        path = root / name
        if not path.exists():
            continue
        for arg, (line, default) in model.global_arg_defaults(path.read_text()).items():
            if arg in expected and default != expected[arg]:
                errors.append(f"{name}:{line}: ARG {arg} defaults to {default!r} but versions.json gives "
                              f"{expected[arg]!r} (default track {data['default_track']}): change that ARG default")
    return errors


def pinned_locks(data: dict) -> list[tuple[str, dict, str, Path, str]]:
    """(where in versions.json, that section, the key pinning the lock's sha256, the lock's path, the command
    that makes it) of every hash lock the images install, each once (every AITER pin: AITER_PIN builds any)."""
    out: dict[Path, tuple[str, dict, str, Path, str]] = {}
    for name, pin in sorted(data["aiter"]["pins"].items()):
        path = model.LOCKS_DIR / model.aiter_lock_name(pin["tag"])
        out.setdefault(path, (f"aiter.pins.{name}", pin, "requirements_lock_sha256", path,
                              f"python3 -m tools.pins resolve aiter --aiter-pin {name} --force --write"))
    for name in model.built_track_names(data):
        if model.track_stack(data, name) == model.THEROCK_STACK:
            path = model.LOCKS_DIR / model.therock_lock_name(name)
            out.setdefault(path, (f"tracks.{name}.therock", data["tracks"][name]["therock"], "lock_sha256", path,
                                  f"python3 -m tools.pins resolve therock --track {name} --force --write"))
        elif model.pytorch_pins(data, name):
            where = model.section_path(data, "pytorch", name)
            path = model.LOCKS_DIR / model.pytorch_lock_name(data, name)
            track = f" --track {name}" if where != "pytorch" else ""
            out.setdefault(path, (where, model.section(data, "pytorch", name), "lock_sha256", path,
                                  f"python3 -m tools.pins resolve wheels{track} --force --write"))
    return list(out.values())


def committed_locks(root: Path, data: dict) -> list[Path]:
    """The hash locks of docker/locks/locks.json in this checkout (paths from root)."""
    from . import locks  # noqa: PLC0415  (locks imports the modules verify is imported by)

    if not (root / locks.LOCKS_FILE).is_file():
        return []
    return sorted({Path(lk.output) for lk in locks.locks(root, data) if (root / lk.output).is_file()})


def check_locks(data: dict, root: Path = model.REPO_ROOT) -> list[str]:
    """A lock whose sha256 is pinned is in docker/locks/ with exactly that sha256: the build refuses any other."""
    errors = []
    for where, node, key, path, command in pinned_locks(data):
        pinned = node.get(key)
        if not pinned or pinned == model.NO_REQUIREMENTS:
            continue
        try:
            body = (root / path).read_bytes()
        except FileNotFoundError:
            errors.append(f"{where}.{key} is set but {path} is missing: run {command} on a host that reaches "
                          "its index")
            continue
        actual = hashlib.sha256(body).hexdigest()
        if actual != pinned:
            errors.append(f"{path} has sha256 {actual}, not {where}.{key} {pinned}: the lock was edited; "
                          f"make it again ({command})")
            continue
        if problem := lock_lines.problem(str(path), body):
            errors.append(f"{problem}; make it again ({command})")
    try:
        committed = committed_locks(root, data)
    except PinError as exc:
        return errors + [f"docker/locks/locks.json: {exc}"]
    for path in committed:
        if problem := lock_lines.problem(str(path), (root / path).read_bytes()):
            errors.append(f"{problem}; make it again (python3 -m tools.pins lock)")
    return errors


def verify(data: dict, strict: bool = False, root: Path = model.REPO_ROOT,
           aiter_name: str | None = None, track: str | None = None) -> tuple[list[str], list[str]]:
    """Returns (errors, unresolved pins)."""
    errors = check_schema(data)
    if errors:
        return errors, []
    if aiter_name is not None and aiter_name not in data["aiter"]["pins"]:
        return [f"AITER pin {aiter_name!r} is not a key of aiter.pins"], []
    if track is not None and track not in data["tracks"]:
        return [f"track {track!r} is not a key of tracks ({', '.join(model.track_names(data))})"], []
    errors += check_dockerfiles(data, root)
    errors += render.check(data, root)
    errors += check_backend_range(data, root)
    errors += check_locks(data, root)
    if track is None and aiter_name is None:
        unresolved = model.unresolved_pins(data)
        # AITER pins no track builds are kept for AITER_PIN builds; unresolved there is no error.
        used = {data["tracks"][t]["aiter"] for t in data["tracks"]}
        unresolved = [p for p in unresolved
                      if not p.startswith("aiter.pins.") or any(p.startswith(f"aiter.pins.{u}.") for u in used)]
    else:
        unresolved = model.unresolved_pins(data, aiter_name, track)
    if strict:
        errors += [f"{p}: unresolved (strict): run `python3 -m tools.pins resolve --write` on a connected machine"
                   for p in unresolved]
    return errors, unresolved
