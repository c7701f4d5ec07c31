"""`verify`: the versions file is well formed and every global Dockerfile ARG default agrees with it."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from .. import runtime_modules
from ..docker import lock_lines
from . import model
from .model import COMMIT_RE, DIGEST_RE, SHA256_RE, PinError

secrets = runtime_modules.module("secrets")


def _check_unresolved_list(node: dict, path: str, errors: list[str]) -> None:
    listed = node.get("unresolved", [])
    if not _names(listed, f"{path}.unresolved", errors):
        return
    for field in listed:
        if field not in node:
            errors.append(f"{path}.unresolved names {field!r}, which is not a field of {path}")
        elif node[field] is not None:
            errors.append(f"{path}.{field} is set but still listed in {path}.unresolved: remove it from the list")


def _names(value, path: str, errors: list[str]) -> bool:
    """value is a list of non-empty strings (no null, number, list or object among them)."""
    if not isinstance(value, list):
        errors.append(f"{path}: must be a list of names")
        return False
    bad = [v for v in value if not isinstance(v, str) or not v.strip()]
    if bad:
        errors.append(f"{path}: {bad[0]!r} is not a name: every element must be a non-empty string")
        return False
    return True


def _check_format(node: dict, path: str, field: str, regex, what: str, errors: list[str]) -> None:
    value = node.get(field)
    if value is None:
        return
    if not isinstance(value, str) or not regex.match(value):
        errors.append(f"{path}.{field} = {value!r}: must be {what}")


def _type_ok(value, types) -> bool:
    # JSON true/false are not numbers (bool is an int in Python)
    if isinstance(value, bool):
        return types is bool or (isinstance(types, tuple) and bool in types)
    return isinstance(value, types)


def _check_therock(track: dict, path: str, errors: list[str]) -> None:
    """A therock track's TheRock section: the https release index alone (never a nightly one), the
    PyTorch versions (what the track installs is derived from them, the SDK version and gpu_archs:
    model.therock_requirements), and the sha256 of the hash lock of those wheels (null until a host
    that reaches the index makes it)."""
    therock = track["therock"]
    if not _require(therock, path, {"index_url": str, "torch": dict, "lock_sha256": str, "triton": dict}, errors):
        return
    _check_unresolved_list(therock, path, errors)
    problem = model.therock_index_problem(therock["index_url"] or "")
    if problem:
        errors.append(f"{path}.index_url: {problem}: TheRock's release index over https (never a nightly index)")
    _check_torch_lock(therock, path, errors)
    triton = therock.get("triton")
    if _require(triton, f"{path}.triton", {"repository": str, "commit": str, "version": str}, errors):
        _check_unresolved_list(triton, f"{path}.triton", errors)
        if triton["commit"] is not None and not COMMIT_RE.match(triton["commit"]):
            errors.append(f"{path}.triton.commit = {triton['commit']!r}: a full 40-hex commit")
        if not (triton["repository"] or "").startswith("https://"):
            errors.append(f"{path}.triton.repository: an https:// git repository")


def _check_torch_lock(node: dict, path: str, errors: list[str]) -> None:
    """The versions of the PyTorch wheels (torch: each of model.TORCH_WHEELS, nothing else) and the
    sha256 of the hash lock made from them (lock_sha256: null until a host that reaches the index
    makes it) of a therock or pytorch section."""
    torch = node["torch"]
    if set(torch) != set(model.TORCH_WHEELS) or not all(isinstance(v, str) and v for v in torch.values()):
        errors.append(f"{path}.torch: the versions of {', '.join(model.TORCH_WHEELS)}, nothing else")
    lock = node["lock_sha256"]
    if lock is not None and not SHA256_RE.match(lock):
        errors.append(f"{path}.lock_sha256 = {lock!r}: 64 lowercase hex digits")


def _require(node, path: str, fields: dict, errors: list[str], optional: dict | None = None) -> bool:
    """node is an object with every field of fields, each of that type or null, null only where
    "unresolved" lists it; optional fields, when present, of their type; no key other than
    those, "about" (text) and "unresolved"."""
    if not isinstance(node, dict):
        errors.append(f"{path}: must be an object")
        return False
    optional = optional or {}
    known = set(fields) | set(optional) | {"about", "unresolved"}
    for key in node:
        if key not in known:
            errors.append(f"{path}.{key}: unknown key (known: {', '.join(sorted(known))}): fix the spelling")
    if "about" in node and not isinstance(node["about"], str):
        errors.append(f"{path}.about: must be text")
    listed = node.get("unresolved") if isinstance(node.get("unresolved"), list) else []
    ok = True
    for field, types in {**fields, **{k: v for k, v in optional.items() if k in node}}.items():
        if field not in node:
            errors.append(f"{path}.{field}: missing")
            ok = False
        elif node[field] is None:
            if "unresolved" not in node:  # an object that holds no pins: null is never right
                errors.append(f"{path}.{field}: must not be null")
                ok = False
            elif field not in listed:
                errors.append(f"{path}.{field} is null but not listed in {path}.unresolved: set it or list it")
                ok = False
        elif not _type_ok(node[field], types):
            errors.append(f"{path}.{field}: wrong type {type(node[field]).__name__}")
            ok = False
    return ok


def check_schema(data: dict) -> list[str]:
    errors: list[str] = []
    if not _require(data, "versions", {
        "schema": int, "source_date_epoch": int, "gpu_archs": list, "python": dict, "rocm": dict,
        "base_image": dict, "pytorch": dict, "aiter": dict, "vllm": dict, "platform": dict,
        "default_track": str, "tracks": dict,
    }, errors):
        return errors
    sections = ("schema", "gpu_archs", "python", "rocm", "platform", "base_image", "pytorch", "aiter", "vllm",
                "default_track", "tracks")
    if any(data[k] is None for k in sections) or not _type_ok(data["schema"], int):
        return errors + [f"versions: {', '.join(sections)} must not be null"]
    for key in ("gpu_archs",):
        if not _names(data[key], key, errors):
            return errors
    if data["schema"] != model.SCHEMA:
        errors.append(f"schema = {data['schema']!r}: this tool reads schema {model.SCHEMA} (release tracks)")
    epoch = data["source_date_epoch"]
    if epoch is None or not model.EPOCH_RANGE[0] <= epoch <= model.EPOCH_RANGE[1]:
        errors.append(f"source_date_epoch = {epoch!r}: must be a Unix time from {model.EPOCH_RANGE[0]} "
                      f"(1980-01-01, the earliest a wheel's zip entries hold) to {model.EPOCH_RANGE[1]} (2100-01-01)")

    archs = data["gpu_archs"]
    if not archs:
        errors.append("gpu_archs: empty; list at least one of " + ", ".join(model.ALLOWED_GPU_ARCHS))
    for arch in archs:
        if arch not in model.ALLOWED_GPU_ARCHS:
            errors.append(f"gpu_archs: {arch!r} is not supported by AITER MLA; "
                          f"allowed: {', '.join(model.ALLOWED_GPU_ARCHS)}")
    if len(set(archs)) != len(archs):
        errors.append("gpu_archs: duplicate entries")

    if _require(data["python"], "python", {"version": str}, errors):
        if not re.match(r"^3\.\d+$", data["python"]["version"] or ""):
            errors.append(f"python.version = {data['python']['version']!r}: must be like 3.12")
    _check_rocm(data["rocm"], "rocm", errors)
    if _require(data["platform"], "platform", {"glibc": str, "machine": str}, errors):
        if not re.match(r"^2\.\d+$", data["platform"]["glibc"] or ""):
            errors.append(f"platform.glibc = {data['platform']['glibc']!r}: must be like 2.35")
        if data["platform"]["machine"] not in model.MACHINES:
            errors.append(f"platform.machine = {data['platform']['machine']!r}: one of {', '.join(model.MACHINES)}")

    _check_base_image(data["base_image"], "base_image", errors)
    _check_pytorch(data["pytorch"], "pytorch", errors)

    aiter = data["aiter"]
    if _require(aiter, "aiter", {"repository": str, "ck_submodule_path": str,
                                 "hipkittens_repository": str, "required_modules": list, "pins": dict}, errors) \
            and _names(aiter["required_modules"], "aiter.required_modules", errors):
        if not aiter["required_modules"]:
            errors.append("aiter.required_modules: empty; list the prebuilt modules the image must hold")
        for name, pin in aiter["pins"].items():
            path = f"aiter.pins.{name}"
            if _require(pin, path, {"tag": str, "commit": str, "ck_commit": str, "hipkittens_commit": str,
                                    "requirements_lock_sha256": str}, errors):
                _check_unresolved_list(pin, path, errors)
                _check_format(pin, path, "commit", COMMIT_RE, "a full 40-hex commit", errors)
                _check_format(pin, path, "ck_commit", COMMIT_RE, "a full 40-hex commit", errors)
                if pin["hipkittens_commit"] != "none":
                    _check_format(pin, path, "hipkittens_commit", COMMIT_RE,
                                  'a full 40-hex commit, or "none" (this AITER clones no HipKittens)', errors)
                if pin["requirements_lock_sha256"] != model.NO_REQUIREMENTS:
                    _check_format(pin, path, "requirements_lock_sha256", SHA256_RE,
                                  f'the sha256 of ci/locks/aiter-<tag>.txt, or "{model.NO_REQUIREMENTS}" (the commit '
                                  'has no requirements.txt)', errors)
                if pin["commit"] is None and pin["requirements_lock_sha256"] is not None:
                    errors.append(f"{path}.requirements_lock_sha256 is set but commit is not: the lock is made from "
                                  "the commit's requirements.txt")
                if isinstance(pin["tag"], str):
                    try:
                        model.aiter_lock_name(pin["tag"])
                    except model.PinError as exc:
                        errors.append(f"{path}.tag: {exc}")
                if pin["commit"] is None and pin["ck_commit"] is not None:
                    errors.append(f"{path}.ck_commit is set but commit is not: "
                                  "the CK commit comes from the AITER commit")

    vllm = data["vllm"]
    if _require(vllm, "vllm", {"repository": str, "triton_kernels": dict}, errors, optional={"index_url": str}):
        if vllm.get("index_url") is not None and not str(vllm["index_url"]).startswith("https://"):
            errors.append("vllm.index_url: must be an https:// URL (PyPI's JSON API, where discover finds releases)")
        _require(vllm["triton_kernels"], "vllm.triton_kernels", {"repository": str, "path": str}, errors)
    _check_tracks(data, errors)
    if not errors:
        check_strings(data, "", errors)
    return errors


def credentials_problem(key: str, value: str) -> str | None:
    """Why a URL of the versions file holds credentials (None: it holds none). Its userinfo is read
    as the one masking reads it (secrets.userinfo_spans: up to its authority's last @, whatever the
    password holds); only an ssh:// or git:// repository may name a user, without a password."""
    spans = secrets.userinfo_spans(value)
    if not spans:
        return None
    userinfo = value[spans[0][0]:spans[0][1]]
    if key in model.REPOSITORY_KEYS and value.lower().startswith(("ssh://", "git://")) and ":" not in userinfo:
        return None
    return ("holds credentials (user:password@ or token@ before the host): a committed file never holds them; "
            "give them to pip or git through their own configuration (netrc, a credential helper)")


def _string_problem(key: str, value: str) -> str | None:
    """Why a string of the versions file at key cannot be a pin (None: it can)."""
    if key in model.REPOSITORY_KEYS or key in model.URL_KEYS:
        problem = credentials_problem(key, value)
        if problem:
            return problem
    if key in model.REPOSITORY_KEYS:
        if not model.REPOSITORY_RE.match(value):
            return ("must be a git repository: an https://, http://, git://, ssh:// or file:// URL, user@host:path "
                    "or an absolute path, without spaces or quotes, not starting with '-'")
    elif key in model.URL_KEYS:
        if not model.HTTPS_URL_RE.match(value):
            return "must be an https:// URL without spaces or quotes"
    elif not model.NAME_RE.match(value):
        return ("must be a name, version, tag or relative path: letters, digits and . _ + / : @ = ~ -, "
                "starting with a letter or digit (no spaces, quotes or line breaks)")
    return None


def check_strings(node, path: str, errors: list[str], key: str = "") -> None:
    """Every string of the versions file matches the pattern of its key (model.REPOSITORY_RE,
    HTTPS_URL_RE, NAME_RE; "about" is free text on one line): nothing reaches a build arg, a git
    or pip command line or a printed command with a line break, a quote or a leading '-'."""
    if isinstance(node, dict):
        for k, v in node.items():
            check_strings(v, f"{path}.{k}" if path else k, errors, k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            check_strings(v, f"{path}[{i}]", errors, key)
    elif isinstance(node, str):
        if key == "about":
            if any(ord(c) < 32 or ord(c) == 127 for c in node):
                errors.append(f"{path}: must be one line of text (no control characters)")
            return
        problem = _string_problem(key, node)
        if problem and (key in model.REPOSITORY_KEYS or key in model.URL_KEYS) and \
                credentials_problem(key, node):
            errors.append(f"{path}: {problem}")  # the value is not shown
        elif problem:
            errors.append(f"{path} = {secrets.masked_url(repr(node))}: {problem}")


def _check_rocm(node, path: str, errors: list[str]) -> None:
    _require(node, path, {"version": str}, errors)


def _check_base_image(base, path: str, errors: list[str]) -> None:
    if _require(base, path, {"name": str, "tag": str, "digest": str}, errors):
        _check_unresolved_list(base, path, errors)
        _check_format(base, path, "digest", DIGEST_RE, "sha256:<64 lowercase hex>", errors)
        if base["tag"] == "latest":
            errors.append(f"{path}.tag: 'latest' is not a pin; name a release tag")


def _check_pytorch(torch, where: str, errors: list[str]) -> None:
    """A pytorch section: the https index, the versions of the PyTorch wheels (their Triton is the
    one torch requires: the lock holds it) and the sha256 of the hash lock of those wheels and
    everything they require, resolved against that index alone (null until a host that reaches the
    index makes it)."""
    if _require(torch, where, {"index_url": str, "torch": dict, "lock_sha256": str}, errors):
        _check_unresolved_list(torch, where, errors)
        if not str(torch["index_url"]).startswith("https://"):
            errors.append(f"{where}.index_url: must be an https:// URL")
        _check_torch_lock(torch, where, errors)


_VERSION_RE = re.compile(r"^([0-9]+)\.([0-9]+)\.[0-9]+$")
_OVERRIDE_CHECKS = {"rocm": _check_rocm, "base_image": _check_base_image, "pytorch": _check_pytorch}


def _check_tracks(data: dict, errors: list[str]) -> None:
    """tracks: {"<major>.<minor>": {vllm pins, aiter pin name, upstream_base_dockerfile, overrides}}."""
    tracks = data["tracks"]
    if not tracks:
        errors.append("tracks: empty; add the vLLM release track(s) the images build")
        return
    if data["default_track"] not in tracks:
        errors.append(f"default_track = {data['default_track']!r}: not a key of tracks "
                      f"({', '.join(sorted(tracks))})")
    for name, own in tracks.items():
        path = f"tracks.{name}"
        if not model.TRACK_RE.match(name):
            errors.append(f"{path}: a track is named after its vLLM release line, like 0.33")
        if not _require(own, path, {"aiter": str, "upstream_base_dockerfile": str, "vllm": dict}, errors,
                        optional={**dict.fromkeys(model.TRACK_OVERRIDES, dict), "stack": str,
                                                 "therock": dict}):
            continue
        if own.get("stack", model.ROCM_IMAGE_STACK) not in model.STACKS:
            errors.append(f"{path}.stack = {own['stack']!r}: not one of {', '.join(model.STACKS)}")
        elif own.get("stack") == model.THEROCK_STACK and not {"base_image", "rocm", "therock"} <= set(own):
            errors.append(f"{path}: a therock track names its own base_image (the plain ubuntu image, by digest), "
                          "rocm (the TheRock SDK version) and therock (its wheel index and what it installs)")
        elif own.get("stack") == model.THEROCK_STACK:
            _check_therock(own, f"{path}.therock", errors)
        elif "therock" in own:
            errors.append(f"{path}.therock: only a therock track installs TheRock wheels (stack is "
                          f"{own.get('stack', model.ROCM_IMAGE_STACK)})")
        for key in model.TRACK_OVERRIDES:
            if key in own:
                _OVERRIDE_CHECKS[key](own[key], f"{path}.{key}", errors)
        pins = data["aiter"].get("pins") if isinstance(data["aiter"], dict) else None
        if not isinstance(pins, dict) or own["aiter"] not in pins:
            errors.append(f"{path}.aiter = {own['aiter']!r}: not a key of aiter.pins: add that pin or name another")
        vllm = own["vllm"]
        where = f"{path}.vllm"
        if not _require(vllm, where, {"version": str, "tag": str, "commit": str, "sdist": dict,
                                      "triton_kernels_commit": str}, errors, optional={"commit_prefix": str}):
            continue
        _check_unresolved_list(vllm, where, errors)
        m = _VERSION_RE.match(vllm["version"] or "")
        if not m:
            errors.append(f"{where}.version = {vllm['version']!r}: must be a release like 0.33.0")
        elif f"{m.group(1)}.{m.group(2)}" != name:
            errors.append(f"{where}.version = {vllm['version']!r} is not of release line {name}: "
                          "rename the track or fix the version")
        sdist = vllm["sdist"]
        if _require(sdist, f"{where}.sdist", {"url": str, "sha256": str}, errors):
            _check_unresolved_list(sdist, f"{where}.sdist", errors)
            _check_format(sdist, f"{where}.sdist", "sha256", SHA256_RE, "64 lowercase hex digits", errors)
            if sdist["url"] and not sdist["url"].startswith("https://"):
                errors.append(f"{where}.sdist.url: must be an https:// URL")
        _check_format(vllm, where, "triton_kernels_commit", COMMIT_RE, "a full 40-hex commit", errors)
        _check_format(vllm, where, "commit", COMMIT_RE, "a full 40-hex commit", errors)
        prefix = vllm.get("commit_prefix")
        if prefix and vllm["commit"] and not vllm["commit"].startswith(prefix):
            errors.append(f"{where}.commit {vllm['commit']} does not start with {where}.commit_prefix {prefix}: "
                          "wrong commit")


def check_backend_range(data: dict, root: Path = model.REPO_ROOT) -> list[str]:
    """The backend's SUPPORTED_VLLM runs from the oldest track up to one of the tracks (the plugin
    refuses other vLLMs; a track past its range is one the plugin was not yet compared with)."""
    path, declared = model.backend_supported_vllm(root)
    if not path.exists():
        return []
    allowed = model.backend_ranges(data)
    if declared not in allowed.values():
        return [f"{model.BACKEND_INIT}: SUPPORTED_VLLM is {declared!r}, which does not run from the oldest track up "
                f"to a track: change SUPPORTED_VLLM to one of {', '.join(repr(r) for r in allowed.values())}"]
    return []


def check_dockerfiles(data: dict, root: Path = model.REPO_ROOT) -> list[str]:
    """Every global ARG (before the first FROM) whose name the versions file defines defaults to
    the versions file's value for the default track. Stages re-declare ARGs by name only, so
    these are the defaults."""
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
    """(where in versions.json, that section, the key that pins the lock's sha256, its lock's path,
    the command that makes it) of every hash lock the images install: each therock track's TheRock
    lock, the PyTorch lock of each pytorch section a rocm-image track reads (a shared one once)
    (lock_sha256), and the lock of each AITER pin's own requirements (requirements_lock_sha256;
    every pin, AITER_PIN builds any)."""
    out: dict[Path, tuple[str, dict, str, Path, str]] = {}
    for name, pin in sorted(data["aiter"]["pins"].items()):
        path = model.LOCKS_DIR / model.aiter_lock_name(pin["tag"])
        out.setdefault(path, (f"aiter.pins.{name}", pin, "requirements_lock_sha256", path,
                              f"python3 -m ci.pins resolve aiter --aiter-pin {name} --force --write"))
    for name in model.built_track_names(data):
        if model.track_stack(data, name) == model.THEROCK_STACK:
            path = model.LOCKS_DIR / model.therock_lock_name(name)
            out.setdefault(path, (f"tracks.{name}.therock", data["tracks"][name]["therock"], "lock_sha256", path,
                                  f"python3 -m ci.pins resolve therock --track {name} --force --write"))
        elif model.pytorch_pins(data, name):
            where = model.section_path(data, "pytorch", name)
            path = model.LOCKS_DIR / model.pytorch_lock_name(data, name)
            track = f" --track {name}" if where != "pytorch" else ""
            out.setdefault(path, (where, model.section(data, "pytorch", name), "lock_sha256", path,
                                  f"python3 -m ci.pins resolve wheels{track} --force --write"))
    return list(out.values())


def committed_locks(root: Path, data: dict) -> list[Path]:
    """The hash locks of ci/locks/locks.json that are in this checkout (paths from root): the build
    and the test machines install them with pip --require-hashes."""
    from . import locks  # noqa: PLC0415  (locks imports the modules verify is imported by)

    if not (root / locks.LOCKS_FILE).is_file():
        return []
    return sorted({Path(lk.output) for lk in locks.locks(root, data) if (root / lk.output).is_file()})


def check_locks(data: dict, root: Path = model.REPO_ROOT) -> list[str]:
    """A lock whose sha256 is pinned (a therock or pytorch section's lock_sha256, an AITER pin's
    requirements_lock_sha256) is in ci/locks/ with exactly that sha256: the build refuses any other.
    Every lock pip installs, pinned or committed (locks.json), holds name==version pins with their
    hashes and nothing else (ci/docker/lock_lines.py, which install_lock.sh runs before pip)."""
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
        problem = lock_lines.problem(str(path), body)
        if problem:
            errors.append(f"{problem}; make it again ({command})")
    try:
        committed = committed_locks(root, data)
    except PinError as exc:
        return errors + [f"ci/locks/locks.json: {exc}"]
    for path in committed:
        problem = lock_lines.problem(str(path), (root / path).read_bytes())
        if problem:
            errors.append(f"{problem}; make it again (python3 -m ci.pins lock)")
    return errors


def verify(data: dict, strict: bool = False, root: Path = model.REPO_ROOT,
           aiter_name: str | None = None, track: str | None = None) -> tuple[list[str], list[str]]:
    """Returns (errors, unresolved pins). Under strict, unresolved pins are errors too.
    track: the track being built (its pins count; default: every track); aiter_name: the AITER
    pin being built instead of the track's."""
    errors = check_schema(data)
    if errors:
        return errors, []
    if aiter_name is not None and aiter_name not in data["aiter"]["pins"]:
        return [f"AITER pin {aiter_name!r} is not a key of aiter.pins"], []
    if track is not None and track not in data["tracks"]:
        return [f"track {track!r} is not a key of tracks ({', '.join(model.track_names(data))})"], []
    errors += check_dockerfiles(data, root)
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
        errors += [f"{p}: unresolved (strict): run `python3 -m ci.pins resolve --write` on a connected machine"
                   for p in unresolved]
    return errors, unresolved
