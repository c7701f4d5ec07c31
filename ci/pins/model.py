"""The versions file: loading, the unresolved-pin convention, and the build args it defines.

Convention: an unresolved pin is JSON null and its field name is listed in the
enclosing object's "unresolved" list. Build files render it as the sentinel
UNRESOLVED, which the build refuses unless ALLOW_UNRESOLVED=1 (development builds).
"""
from __future__ import annotations

import json
import re
import shlex
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
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


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
        raise PinError(f"aiter.pins has no pin named {name!r} (known: {known}); set AITER_PIN or aiter.default") from None


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
    }
    for key in WHEEL_KEYS:
        wheel = wheels[key]
        upper = key.upper()
        args[f"{upper}_PACKAGE"] = wheel["package"]
        args[f"{upper}_VERSION"] = render(wheel["version"])
        args[f"{upper}_SHA256"] = render(wheel["sha256"])
    return args


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


_ARG_RE = re.compile(r"^\s*ARG\s+(.*)$", re.IGNORECASE)


def dockerfile_arg_defaults(text: str) -> list[tuple[int, str, str | None]]:
    """(line number, name, default) of every ARG instruction (line continuations joined)."""
    out = []
    logical, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not logical:
            start = number
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        match = _ARG_RE.match(logical)
        if match:
            try:
                tokens = shlex.split(match.group(1), comments=True)
            except ValueError:
                tokens = match.group(1).split()
            for token in tokens:
                name, sep, default = token.partition("=")
                out.append((start, name, default if sep else None))
        logical = ""
    return out
