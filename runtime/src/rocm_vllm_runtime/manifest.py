"""The image manifest: what the image was built from and for. Every writer and reader of the
manifest goes through this module (standard library only: the image builds run it before the
package is installed anywhere).

Location: env `ROCM_VLLM_MANIFEST` (default /opt/rocm-vllm/manifest.json). JSON, schema 1:

    schema             1; a reader refuses any other (and a file without one)
    origin             "base-image": written by the base image (Dockerfile.rocm_base) and
                       completed by the vLLM image; "existing-image": the vLLM image was made
                       from an image without a manifest (VLLM_IMAGE, a CPU image) and describes
                       what that image has installed
    gpu_archs          the archs the image is for, e.g. ["gfx942", "gfx950"] (never empty)
    declared           true when gpu_archs is only declared (GPU_ARCHS), not built here
    rocm               {"version", "image"}
    python             {"version"}
    pytorch            {"index_url", "lock_sha256": the sha256 of the PyTorch lock the wheels were
                        installed from (null: unresolved, a development image),
                        "wheels": {"torch"|"triton"|"torchvision"|"torchaudio":
                        {"package", "version": the pinned version (Triton's: null, versions.json pins
                        none: the lock holds the one torch requires), "installed"}}}
                       (images written before the lock also hold wheels.<name>.sha256; it is not read)
    aiter              {"version", "distribution", "tag", "repository", "commit", "ck_commit",
                        "pinned", "requirements_lock_sha256": the sha256 of the hash lock AITER's own
                        requirements were installed from ("none": its commit has no requirements.txt;
                        null: unresolved, a development image)}, or null: the image carries no AITER
                        (e.g. a CPU image)
    prebuilt_modules   the AITER modules compiled ahead of time
    vllm               {"track": the release track (versions.json tracks, e.g. "0.33");
                        "version", "tag", "repository", "commit": the pins;
                        "image": VLLM_IMAGE when vLLM came from one;
                        "distribution", "installed": what the vLLM image has installed}
    ray                {"version"}: the Ray the vLLM image carries (RAY_VERSION), or null
    source_date_epoch  the build's SOURCE_DATE_EPOCH, or null
    unresolved         pins still unresolved (a development image): the names of the build args
                       that are UNRESOLVED (e.g. PYTORCH_LOCK_SHA256)

A value nobody knows is null. The build steps that write it:

    python3 -m rocm_vllm_runtime.manifest base --aiter-pins FILE --modules FILE [--out PATH]
        the base part (Dockerfile.rocm_base; the build args in the environment, as python3 -m
        tools.pins args prints them: ROCM_IMAGE, ROCM_VERSION, PYTHON_VERSION, GPU_ARCHS,
        SOURCE_DATE_EPOCH, AITER_TAG, AITER_REQUIREMENTS_LOCK_SHA256, PYTORCH_INDEX_URL,
        PYTORCH_LOCK_SHA256, TORCH_VERSION, TORCHVISION_VERSION, TORCHAUDIO_VERSION, VLLM_TRACK,
        VLLM_VERSION, VLLM_REPOSITORY, VLLM_TAG, VLLM_COMMIT; AITER_COMMIT, CK_COMMIT,
        HIPKITTENS_COMMIT, TRITON_KERNELS_COMMIT only under unresolved)
    python3 -m rocm_vllm_runtime.manifest vllm [--base PATH] --out PATH
        the vLLM part (Dockerfile.rocm): the installed vLLM must be release VLLM_VERSION; it is
        added to the base part read from --base, or, where there is none, a manifest of origin
        "existing-image" describes the image (GPU_ARCHS declared); RAY_VERSION, when set, is
        recorded as ray.version
    python3 -m rocm_vllm_runtime.manifest show [PATH]
        read and validate a manifest, print it

Errors: one line naming what to fix; exit status 1.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rocm_vllm_runtime import files, numeric
from rocm_vllm_runtime.distributions import AITER_DISTRIBUTIONS, VLLM_DISTRIBUTIONS
from rocm_vllm_runtime.files import write_text
from rocm_vllm_runtime.versions import Installed, MetadataError, installed, requires

SCHEMA = 1
MANIFEST_ENV = "ROCM_VLLM_MANIFEST"
DEFAULT_MANIFEST = "/opt/rocm-vllm/manifest.json"
# The most bytes of a manifest (or --aiter-pins) read: a real one is a few KiB.
MANIFEST_LIMIT = 4 << 20
BASE_IMAGE = "base-image"
EXISTING_IMAGE = "existing-image"
ORIGINS = (BASE_IMAGE, EXISTING_IMAGE)
# The wheels recorded under pytorch.wheels: the PyTorch wheels pinned by version (TORCH_VERSION, ...)
# and the Triton torch requires.
WHEELS = ("torch", "triton", "torchvision", "torchaudio")
UNRESOLVED = "UNRESOLVED"
# aiter-pins.json (aiter_source.sh verify): the verified source's commits, and whether they are the pins.
AITER_PIN_KEYS = ("repository", "tag", "commit", "ck_commit", "pinned")
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
Lookup = Callable[..., "Installed | None"]


class ManifestError(ValueError):
    """The manifest is missing, malformed or cannot be written; the message says what to fix."""


@dataclass(frozen=True)
class Rocm:
    version: str | None = None
    image: str | None = None


@dataclass(frozen=True)
class PythonInfo:
    version: str | None = None


@dataclass(frozen=True)
class Wheel:
    package: str | None = None
    version: str | None = None
    installed: str | None = None


@dataclass(frozen=True)
class PyTorch:
    index_url: str | None = None
    lock_sha256: str | None = None
    wheels: Mapping[str, Wheel] = field(default_factory=dict)


@dataclass(frozen=True)
class Aiter:
    version: str | None = None
    distribution: str | None = None
    tag: str | None = None
    repository: str | None = None
    commit: str | None = None
    ck_commit: str | None = None
    pinned: bool = False
    requirements_lock_sha256: str | None = None


@dataclass(frozen=True)
class Vllm:
    track: str | None = None
    version: str | None = None
    tag: str | None = None
    repository: str | None = None
    commit: str | None = None
    image: str | None = None
    distribution: str | None = None
    installed: str | None = None


@dataclass(frozen=True)
class Ray:
    version: str | None = None


@dataclass(frozen=True)
class Manifest:
    gpu_archs: tuple[str, ...]
    origin: str = BASE_IMAGE
    declared: bool = False
    rocm: Rocm = field(default_factory=Rocm)
    python: PythonInfo = field(default_factory=PythonInfo)
    pytorch: PyTorch = field(default_factory=PyTorch)
    aiter: Aiter | None = None
    prebuilt_modules: tuple[str, ...] = ()
    vllm: Vllm = field(default_factory=Vllm)
    ray: Ray | None = None
    source_date_epoch: int | None = None
    unresolved: tuple[str, ...] = ()
    schema: int = SCHEMA

    @property
    def aiter_commit(self) -> str:
        return (self.aiter.commit if self.aiter else None) or ""

    def to_json(self) -> dict:
        return {**asdict(self), "gpu_archs": list(self.gpu_archs), "prebuilt_modules": list(self.prebuilt_modules),
                "unresolved": list(self.unresolved)}


# ------------------------------------------------------------------------------------ reading

def manifest_path(env: Mapping[str, str]) -> str:
    return env.get(MANIFEST_ENV) or DEFAULT_MANIFEST


def _object(value: object, key: str, where: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ManifestError(f"{where}: {key!r} must be an object")
    return value


def _text(section: Mapping[str, object], name: str, key: str, where: str) -> str | None:
    value = section.get(name)
    if value is not None and not isinstance(value, str):
        raise ManifestError(f"{where}: '{key}.{name}' must be a string or null")
    return value


def _texts(cls, section: Mapping[str, object], key: str, where: str, **extra):
    names = [n for n in cls.__dataclass_fields__ if n not in extra]
    return cls(**{n: _text(section, n, key, where) for n in names}, **extra)


def _section(cls, data: Mapping[str, object], key: str, where: str):
    """The section `key` of the manifest (absent or null: all its values null), its values strings or null."""
    return _texts(cls, _object(data.get(key) or {}, key, where), key, where)


def _names(data: Mapping[str, object], key: str, where: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ManifestError(f"{where}: {key!r} must be a list of names")
    return tuple(v.strip() for v in value)


def parse_manifest(data: object, where: str = "manifest") -> Manifest:
    """The Manifest of a decoded JSON document; ManifestError names the key that is wrong."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected a JSON object")
    schema = data.get("schema")
    if schema != SCHEMA:
        found = "has no schema" if schema is None else f"has schema {schema!r}"
        raise ManifestError(f"{where} {found}, this runtime reads schema {SCHEMA} only: use the runtime of the "
                            f"image that wrote it, or rebuild the image")
    archs = _names(data, "gpu_archs", where)
    if not archs:
        raise ManifestError(f"{where}: 'gpu_archs' must be a non-empty list of arch names")
    origin = data.get("origin", BASE_IMAGE)
    if origin not in ORIGINS:
        raise ManifestError(f"{where}: 'origin' must be one of {', '.join(ORIGINS)}")
    declared = data.get("declared", False)
    if not isinstance(declared, bool):
        raise ManifestError(f"{where}: 'declared' must be true or false")
    pytorch = _object(data.get("pytorch") or {}, "pytorch", where)
    wheels = {name: _texts(Wheel, _object(wheel, f"pytorch.wheels.{name}", where), f"pytorch.wheels.{name}", where)
              for name, wheel in _object(pytorch.get("wheels") or {}, "pytorch.wheels", where).items()}
    aiter = data.get("aiter")
    if aiter is not None:
        section = _object(aiter, "aiter", where)
        pinned = section.get("pinned", False)
        if not isinstance(pinned, bool):
            raise ManifestError(f"{where}: 'aiter.pinned' must be true or false")
        aiter = _texts(Aiter, section, "aiter", where, pinned=pinned)
    ray = data.get("ray")
    if ray is not None:
        ray = _texts(Ray, _object(ray, "ray", where), "ray", where)
    epoch = data.get("source_date_epoch")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
        raise ManifestError(f"{where}: 'source_date_epoch' must be an integer or null")
    return Manifest(
        gpu_archs=archs, origin=origin, declared=declared, rocm=_section(Rocm, data, "rocm", where),
        python=_section(PythonInfo, data, "python", where),
        pytorch=PyTorch(index_url=_text(pytorch, "index_url", "pytorch", where),
                        lock_sha256=_text(pytorch, "lock_sha256", "pytorch", where), wheels=wheels),
        aiter=aiter, prebuilt_modules=_names(data, "prebuilt_modules", where),
        vllm=_section(Vllm, data, "vllm", where), ray=ray, source_date_epoch=epoch,
        unresolved=_names(data, "unresolved", where))


def read_json(path: str | Path, what: str, fix: str) -> object:
    """The JSON value of the file at `path` (the manifest, --aiter-pins; files.read_json, MANIFEST_LIMIT
    bytes at most): ManifestError in one line naming `what` and `fix` when it cannot be read or is none."""
    where = f"{what} {path}"
    try:
        return files.read_json(path, where, MANIFEST_LIMIT)
    except files.DataError as exc:
        if exc.kind == "depth":
            raise ManifestError(f"{where} is nested too deeply to be one: {fix}") from None
        if exc.kind == "utf8" and exc.detail.startswith("not UTF-8"):
            raise ManifestError(f"{where} is {exc.detail}: {fix}") from None
        raise ManifestError(f"{exc}: {fix}") from None
    except OSError as exc:
        raise ManifestError(f"{what} not readable at {path} ({exc.strerror or exc}); {fix}") from None


def read_manifest(path: str | Path) -> Manifest:
    """Read and validate the manifest at `path`; ManifestError says what to fix."""
    data = read_json(path, "image manifest", f"rebuild the image, or set {MANIFEST_ENV} to the image's manifest")
    return parse_manifest(data, where=str(path))


def load_manifest(env: Mapping[str, str]) -> Manifest:
    """Read the manifest named by the environment; ManifestError says what to fix."""
    return read_manifest(manifest_path(env))


# ------------------------------------------------------------------------------------ writing

def dumps(manifest: Manifest) -> str:
    """The file's text; what the reader would refuse is never written."""
    data = manifest.to_json()
    parse_manifest(files.json_value(json.dumps(data), "the manifest being written"), where="the manifest being written")
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_manifest(manifest: Manifest, path: str | Path) -> None:
    """Atomically, through a symbolic link, LF line endings on every OS (files.write_text). A directory at
    path is refused (ManifestError, one line)."""
    text = dumps(manifest)
    if Path(path).is_dir():
        raise ManifestError(f"{path} is a directory: give the manifest a file path (--out)")
    write_text(path, text)


def _pin(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "")
    return None if value in ("", UNRESOLVED) else value


def _archs(env: Mapping[str, str]) -> tuple[str, ...]:
    archs = tuple(a.strip() for a in env.get("GPU_ARCHS", "").replace(",", ";").split(";") if a.strip())
    if not archs:
        raise ManifestError("GPU_ARCHS is empty: set the GPU_ARCHS build arg (e.g. gfx942;gfx950; "
                            "versions.json gpu_archs)")
    return archs


def torch_triton(requirements: Sequence[str]) -> str | None:
    """The Triton distribution among torch's Requires-Dist lines (its name changes between
    releases: pytorch-triton-rocm, triton-rocm, triton)."""
    for line in requirements:
        m = _NAME.match(line)
        if m and "triton" in m.group(1).lower():
            return m.group(1)
    return None


def aiter_pins_problem(pins: object) -> str:
    """'' when pins is what aiter_source.sh verify writes: an object of exactly AITER_PIN_KEYS,
    strings (or null) and pinned true or false; else what is wrong, naming the key."""
    if not isinstance(pins, dict):
        return f"a JSON object of {', '.join(AITER_PIN_KEYS)} is expected, not a {type(pins).__name__}"
    unknown = sorted(str(k) for k in pins if k not in AITER_PIN_KEYS)
    if unknown:
        return f"unknown key {unknown[0]!r} (known: {', '.join(AITER_PIN_KEYS)})"
    missing = [k for k in AITER_PIN_KEYS if k not in pins]
    if missing:
        return f"no {missing[0]!r}"
    bad = next((k for k in AITER_PIN_KEYS[:-1] if pins[k] is not None and not isinstance(pins[k], str)), None)
    if bad:
        return f"{bad!r} must be a string or null"
    if not isinstance(pins["pinned"], bool):
        return "'pinned' must be true or false"
    unverified = next((k for k in ("commit", "ck_commit") if not pins[k]), None)
    if pins["pinned"] and unverified:
        return f"'pinned' is true but {unverified!r} is {json.dumps(pins[unverified])}: pinned means both are verified"
    return ""


def base_part(env: Mapping[str, str], aiter_pins: Mapping[str, object], modules: Sequence[str], *,
              lookup: Lookup = installed, torch_requires: Callable[[str], list[str]] = requires) -> Manifest:
    """The base image's manifest: the build args (env), the verified AITER commits (the
    aiter-pins.json of the aiter-verified stage), the prebuilt modules, what is installed."""
    problem = aiter_pins_problem(aiter_pins)
    if problem:
        raise ManifestError(f"--aiter-pins: {problem}: pass the aiter-pins.json aiter_source.sh verify writes "
                            "(build the aiter-verified stage)")
    epoch = env.get("SOURCE_DATE_EPOCH", "")
    try:
        source_date_epoch = numeric.whole("SOURCE_DATE_EPOCH", epoch, *numeric.EPOCH_RANGE) if epoch else None
    except numeric.SettingError as exc:
        raise ManifestError(f"{exc}: set the build arg") from None
    wheels = {}
    for key in WHEELS:
        package = (torch_triton(torch_requires("torch")) if key == "triton" else None) or key
        found = lookup(package)
        wheels[key] = Wheel(package=package, version=None if key == "triton" else _pin(env, f"{key.upper()}_VERSION"),
                            installed=found.version if found else None)
    aiter = lookup(*AITER_DISTRIBUTIONS)

    def verified(key: str) -> str | None:
        value = aiter_pins.get(key)
        return value if isinstance(value, str) and value else None

    return Manifest(
        gpu_archs=_archs(env), origin=BASE_IMAGE,
        rocm=Rocm(version=_pin(env, "ROCM_VERSION"), image=_pin(env, "ROCM_IMAGE")),
        python=PythonInfo(version=_pin(env, "PYTHON_VERSION")),
        pytorch=PyTorch(index_url=_pin(env, "PYTORCH_INDEX_URL"), lock_sha256=_pin(env, "PYTORCH_LOCK_SHA256"),
                        wheels=wheels),
        aiter=Aiter(version=aiter.version if aiter else (_pin(env, "AITER_TAG") or "").lstrip("v") or None,
                    distribution=aiter.distribution if aiter else None,
                    tag=verified("tag"), repository=verified("repository"), commit=verified("commit"),
                    ck_commit=verified("ck_commit"), pinned=bool(aiter_pins.get("pinned")),
                    requirements_lock_sha256=_pin(env, "AITER_REQUIREMENTS_LOCK_SHA256")),
        prebuilt_modules=tuple(sorted(modules)),
        vllm=Vllm(track=_pin(env, "VLLM_TRACK"), version=_pin(env, "VLLM_VERSION"), tag=_pin(env, "VLLM_TAG"),
                  repository=_pin(env, "VLLM_REPOSITORY"), commit=_pin(env, "VLLM_COMMIT")),
        source_date_epoch=source_date_epoch,
        unresolved=tuple(sorted(k for k, v in env.items() if v == UNRESOLVED or v.endswith("@sha256:UNRESOLVED"))))


def release(version: str) -> str:
    """The release of a local version: 0.32.0+rocm723 -> 0.32.0."""
    return version.split("+", 1)[0]


def with_vllm(base: Manifest | None, env: Mapping[str, str], *, lookup: Lookup = installed) -> Manifest:
    """The vLLM image's manifest: the installed vLLM (release VLLM_VERSION, else ManifestError)
    added to the base part; without a base part (VLLM_IMAGE, a CPU image) a manifest of origin
    existing-image describing what is installed, the GPU archs declared by GPU_ARCHS."""
    want = env.get("VLLM_VERSION", "")
    track = env.get("VLLM_TRACK") or None
    image = env.get("VLLM_IMAGE", "")
    origin = f"VLLM_IMAGE={image}" if image else "the vllm stage"
    vllm = lookup(*VLLM_DISTRIBUTIONS)
    if vllm is None:
        raise ManifestError(f"no vLLM installed in {origin}: set VLLM_IMAGE to an image with vLLM {want}")
    if not vllm.version:
        raise ManifestError(f"vLLM in {origin} (distribution {vllm.distribution}) has no version in its package "
                            f"metadata, so it cannot be checked against vLLM {want or 'of the track'}: reinstall "
                            "vLLM there, or set VLLM_IMAGE to an image with a complete vLLM install")
    if want and release(vllm.version) != want:
        building = f"track {track} builds" if track else "this backend is for"
        raise ManifestError(f"{origin} has vLLM {vllm.version} but {building} vLLM {want} (VLLM_VERSION in "
                            f"versions.json): set VLLM_IMAGE to a vLLM {want} image, or TRACK to the track of "
                            f"vLLM {release(vllm.version)}")
    ray = Ray(version=env["RAY_VERSION"]) if env.get("RAY_VERSION") else None
    if base is not None:
        return replace(base, vllm=replace(base.vllm, track=base.vllm.track or track, image=image or base.vllm.image,
                                          distribution=vllm.distribution, installed=vllm.version), ray=ray)
    aiter = lookup(*AITER_DISTRIBUTIONS)
    return Manifest(
        gpu_archs=_archs(env), origin=EXISTING_IMAGE, declared=True,
        python=PythonInfo(version="{}.{}".format(*sys.version_info[:2])),
        aiter=None if aiter is None else Aiter(version=aiter.version, distribution=aiter.distribution),
        vllm=Vllm(track=track, version=release(vllm.version), image=image or None, distribution=vllm.distribution,
                  installed=vllm.version), ray=ray)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="python3 -m rocm_vllm_runtime.manifest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("base", help="write the base image's manifest")
    p.add_argument("--aiter-pins", type=Path, required=True)
    p.add_argument("--modules", type=Path, required=True)
    p.add_argument("--out", type=Path, default=Path(DEFAULT_MANIFEST))
    p = sub.add_parser("vllm", help="check the installed vLLM and write the vLLM image's manifest")
    p.add_argument("--base", type=Path, help="the base image's manifest; absent file: none")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("show", help="read, validate and print a manifest")
    p.add_argument("path", nargs="?", type=Path)
    ns = parser.parse_args(argv)
    try:
        if ns.cmd == "base":
            pins = read_json(ns.aiter_pins, "--aiter-pins", "build the aiter-verified stage")
            try:
                modules = ns.modules.read_text().split()
            except (OSError, ValueError) as exc:
                raise ManifestError(f"--modules not readable ({exc}): build the aiter-wheel stage") from None
            manifest = base_part(env, pins, modules)
            write_manifest(manifest, ns.out)
            print(dumps(manifest), end="")
        elif ns.cmd == "vllm":
            base = read_manifest(ns.base) if ns.base and ns.base.is_file() else None
            manifest = with_vllm(base, env)
            write_manifest(manifest, ns.out)
            print(f"manifest: OK vLLM {manifest.vllm.installed} ({manifest.origin}, "
                  f"GPU archs {';'.join(manifest.gpu_archs)}{', declared' if manifest.declared else ''})",
                  file=sys.stderr)
        else:
            manifest = read_manifest(ns.path) if ns.path else load_manifest(env)
            print(dumps(manifest), end="")
    except (ManifestError, MetadataError, OSError) as exc:
        print(f"manifest: ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
