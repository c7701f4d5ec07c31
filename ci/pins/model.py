"""The versions file: loading, the unresolved-pin convention, and the build args it defines.

Convention: an unresolved pin is JSON null and its field name is listed in the
enclosing object's "unresolved" list. Build files render it as the sentinel
UNRESOLVED, which the build refuses unless ALLOW_UNRESOLVED=1 (development builds).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "versions.json"
DOCKERFILES = ("Dockerfile.rocm_base", "Dockerfile.rocm")

UNRESOLVED = "UNRESOLVED"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# GPU architectures AITER ships kernels for and this project builds for (CDNA3 and newer).
ALLOWED_GPU_ARCHS = ("gfx942", "gfx950")
WHEEL_KEYS = ("torch", "triton", "torchvision", "torchaudio")
# Machines the images are built for (platform.machine).
MACHINES = ("x86_64",)
# Ray (multi-node serving) and the requirements of Ray that vLLM does not bring, by build-arg prefix.
RAY_WHEELS = {"ray": "RAY", "msgpack": "RAY_MSGPACK"}


class PinError(Exception):
    """A problem with the versions file; the message names the field to change."""


def load(path: Path | str = VERSIONS_FILE) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PinError(f"{path}: cannot read the versions file ({exc.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PinError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None


def dump(data: dict, path: Path | str = VERSIONS_FILE) -> None:
    """Write data to path, keeping the file's formatting (only changed values are rewritten),
    atomically; nothing is written when nothing changed."""
    path = Path(path)
    try:
        old = path.read_text()
    except FileNotFoundError:
        old = None
    try:
        text = patch_json(old, data) if old is not None else None
    except (PinError, ValueError):  # keys added or removed, or the file was not JSON: write it whole
        text = None
    write_files({path: text if text is not None else json.dumps(data, indent=2) + "\n"})


# ---- format-keeping JSON edits -----------------------------------------------------------

_WS = re.compile(r"\s*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")


def _spans(text: str) -> dict[tuple, tuple[int, int]]:
    """(start, end) of the text of every value, by path (tuple of keys and indices)."""
    spans: dict[tuple, tuple[int, int]] = {}

    def value(i: int, path: tuple) -> int:
        i = _WS.match(text, i).end()
        start = i
        if text[i] == "{":
            i = _WS.match(text, i + 1).end()
            if text[i] == "}":
                i += 1
            else:
                while True:
                    m = _STRING.match(text, _WS.match(text, i).end())
                    key = json.loads(m.group(0))
                    i = _WS.match(text, m.end()).end()
                    assert text[i] == ":"
                    i = _WS.match(text, value(i + 1, path + (key,))).end()
                    if text[i] == ",":
                        i += 1
                        continue
                    assert text[i] == "}"
                    i += 1
                    break
        elif text[i] == "[":
            i = _WS.match(text, i + 1).end()
            if text[i] == "]":
                i += 1
            else:
                index = 0
                while True:
                    i = _WS.match(text, value(i, path + (index,))).end()
                    index += 1
                    if text[i] == ",":
                        i += 1
                        continue
                    assert text[i] == "]"
                    i += 1
                    break
        else:
            m = _STRING.match(text, i) or _SCALAR.match(text, i)
            i = m.end()
        spans[path] = (start, i)
        return i

    value(0, ())
    return spans


def patch_json(text: str, new: dict) -> str:
    """text (a JSON document) with the values that differ in new replaced in place: keys,
    order, indentation and line layout of everything else stay as they are."""
    old = json.loads(text)
    spans = _spans(text)
    edits: list[tuple[int, int, str]] = []

    def diff(a, b, path):
        if a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b):
            for key in a:
                diff(a[key], b[key], path + (key,))
            return
        start, end = spans[path]
        if isinstance(b, dict) and b and "\n" in text[start:end]:
            raise PinError(f"{'.'.join(map(str, path))}: keys changed; edit the versions file by hand")
        edits.append((start, end, json.dumps(b)))  # a value on one line stays on one line

    diff(old, new, ())
    for start, end, rendered in sorted(edits, reverse=True):
        text = text[:start] + rendered + text[end:]
    if json.loads(text) != new:  # pragma: no cover - a bug in the patcher, never a silent write
        raise PinError("internal error: the format-keeping edit of the versions file went wrong")
    return text


def write_files(contents: dict) -> list[Path]:
    """Write every {path: text} atomically and all or nothing: each goes to a temporary file
    beside it first; only when all are written are they renamed into place. Unchanged files
    are not touched. Returns the paths written."""
    todo = {}
    for path, text in contents.items():
        path = Path(path)
        try:
            if path.read_text() == text:
                continue
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise PinError(f"{path}: cannot read ({exc.strerror}): fix its permissions") from None
        if path.exists() and not os.access(path, os.W_OK):
            raise PinError(f"{path}: not writable: fix its permissions; nothing was written")
        todo[path] = text
    temps: dict[Path, str] = {}
    current = None
    try:
        for path, text in todo.items():
            current = path
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            temps[path] = tmp
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            if path.exists():
                os.chmod(tmp, path.stat().st_mode & 0o7777)
    except OSError as exc:
        for tmp in temps.values():
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise PinError(f"{current}: cannot write ({exc.strerror or exc}): free disk space or fix permissions; "
                       "nothing was written") from None
    for path, tmp in temps.items():
        os.replace(tmp, path)
    return list(temps)


def render(value) -> str:
    """A pin as a build-arg string: null becomes the UNRESOLVED sentinel."""
    if value is None:
        return UNRESOLVED
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    return str(value)


def aiter_pin(data: dict, name: str | None = None) -> dict:
    aiter = data["aiter"]
    name = name or aiter["default"]
    try:
        return aiter["pins"][name]
    except KeyError:
        known = ", ".join(sorted(aiter.get("pins", {})))
        raise PinError(f"aiter.pins has no pin named {name!r} (known: {known}); "
                       "set AITER_PIN or aiter.default") from None


def image_ref(base: dict, allow_unresolved: bool = False) -> str:
    """name:tag@digest. An unresolved digest gives name:tag@sha256:UNRESOLVED (an invalid
    reference, so a build fails at FROM) unless allow_unresolved, which drops the digest."""
    ref = f"{base['name']}:{base['tag']}"
    if base.get("digest"):
        return f"{ref}@{base['digest']}"
    return ref if allow_unresolved else f"{ref}@sha256:{UNRESOLVED}"


def build_args(data: dict, aiter_name: str | None = None, allow_unresolved: bool = False) -> dict[str, str]:
    """Every build arg the versions file defines, as the Dockerfiles and the bake file see it."""
    pin = aiter_pin(data, aiter_name)
    aiter = data["aiter"]
    wheels = data["pytorch"]["wheels"]
    args = {
        "ROCM_IMAGE": image_ref(data["base_image"], allow_unresolved),
        "ROCM_VERSION": data["rocm"]["version"],
        "PYTHON_VERSION": data["python"]["version"],
        "SOURCE_DATE_EPOCH": str(data["source_date_epoch"]),
        "GPU_ARCHS": render(data["gpu_archs"]),
        "TORCH_INDEX_URL": data["pytorch"]["index_url"],
        "AITER_REPO": aiter["repository"],
        "AITER_TAG": pin["tag"],
        "AITER_COMMIT": render(pin["commit"]),
        "AITER_CK_COMMIT": render(pin["ck_commit"]),
        "AITER_CK_PATH": aiter["ck_submodule_path"],
        "AITER_REQUIRED_MODULES": " ".join(aiter["required_modules"]),
        "VLLM_REPO": data["vllm"]["repository"],
        "VLLM_VERSION": data["vllm"]["version"],
        "VLLM_TAG": data["vllm"]["tag"],
        "VLLM_COMMIT": render(data["vllm"]["commit"]),
        "HIPKITTENS_REPO": aiter["hipkittens_repository"],
        "HIPKITTENS_COMMIT": render(pin["hipkittens_commit"]),
        "TRITON_KERNELS_REPO": data["vllm"]["triton_kernels"]["repository"],
        "TRITON_KERNELS_COMMIT": render(data["vllm"]["triton_kernels"]["commit"]),
        "TRITON_KERNELS_PATH": data["vllm"]["triton_kernels"]["path"],
    }
    for key in WHEEL_KEYS:
        wheel = wheels[key]
        upper = key.upper()
        args[f"{upper}_PACKAGE"] = render(wheel["package"])
        args[f"{upper}_VERSION"] = render(wheel["version"])
        args[f"{upper}_SHA256"] = render(wheel["sha256"])
    for key, prefix in RAY_WHEELS.items():
        wheel = data["ray"]["wheels"][key]
        args[f"{prefix}_VERSION"] = wheel["version"]
        args[f"{prefix}_HASHES"] = pip_hashes(wheel["sha256"])
    return args


def pip_hashes(sha256: dict | None) -> str:
    """A {python version: sha256} pin as pip --hash values ("sha256:<hex> ..."), in the sorted
    order of the keys (the order bake's for expression iterates the same map in)."""
    if sha256 is None:
        return UNRESOLVED
    return " ".join(f"sha256:{sha256[python]}" for python in sorted(sha256))


def unresolved_pins(data: dict, aiter_name: str | None = None) -> list[str]:
    """Dotted paths of every unresolved pin (null value listed in "unresolved").
    With aiter_name, AITER pins other than that one are left out (they are not built)."""
    found: list[str] = []

    def walk(node, path):
        if isinstance(node, dict):
            for field in node.get("unresolved", []) or []:
                found.append(f"{path}.{field}" if path else field)
            for key, value in node.items():
                if key != "unresolved":
                    walk(value, f"{path}.{key}" if path else key)

    walk(data, "")
    if aiter_name is not None:
        own = f"aiter.pins.{aiter_name}."
        found = [p for p in found if not p.startswith("aiter.pins.") or p.startswith(own)]
    return found


# A global ARG as the pin tool reads and writes it: one name, an optional default (double quotes
# when it holds spaces), one line. tests/test_dockerfiles_static.py holds this reading equal to
# BuildKit's own parser's.
_GLOBAL_ARG_RE = re.compile(r'^(\s*ARG\s+)([A-Za-z_][A-Za-z0-9_]*)(?:=("[^"]*"|[^\s"]*))?(\s*)$', re.IGNORECASE)
_FROM_RE = re.compile(r"^\s*FROM\s", re.IGNORECASE)


def _global_lines(text: str):
    """(index, line, match) of the lines before the first FROM; match: a global ARG, or None."""
    for i, line in enumerate(text.splitlines(keepends=True)):
        if _FROM_RE.match(line):
            return
        yield i, line, _GLOBAL_ARG_RE.match(line)


def global_arg_defaults(text: str) -> dict[str, tuple[int, str | None]]:
    """{name: (line number, default)} of the ARGs before the first FROM: the only ARGs that
    carry defaults (a stage re-declares an ARG by name)."""
    return {m.group(2): (i + 1, None if m.group(3) is None else m.group(3).strip('"'))
            for i, _, m in _global_lines(text) if m}


def global_arg_updates(data: dict, root: Path = REPO_ROOT) -> tuple[list[str], dict[Path, str]]:
    """(what changes, {path: new text}) of the Dockerfiles whose global ARG defaults differ from
    the versions file; every other byte stays as it is."""
    expected = build_args(data)
    changes: list[str] = []
    texts: dict[Path, str] = {}
    for name in DOCKERFILES:
        path = root / name
        if not path.exists():
            continue
        try:
            text = path.read_text()
        except OSError as exc:
            raise PinError(f"{path}: cannot read ({exc.strerror}): fix its permissions") from None
        lines = text.splitlines(keepends=True)
        for i, line, m in _global_lines(text):
            if m and m.group(2) in expected and m.group(3) is not None:
                new = expected[m.group(2)]
                if m.group(3).strip('"') != new:
                    value = f'"{new}"' if (" " in new or m.group(3).startswith('"')) else new
                    lines[i] = f"{m.group(1)}{m.group(2)}={value}{m.group(4)}"
                    changes.append(f"{name}:{i + 1}: ARG {m.group(2)}={new}")
        texts[path] = "".join(lines)
    return changes, texts
