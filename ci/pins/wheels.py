"""The wheel pins: the PyTorch ROCm wheels (pytorch.wheels, from a PEP 503 index; Ray and the
other PyPI sets are locks: ci.pins.locks). Wheel filenames, tags, versions and requirement lines are
read with `packaging` (22 or newer), the one module of ci.pins that needs more than the standard
library."""
from __future__ import annotations

import hashlib
import html.parser
import urllib.parse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import model, resolve
from .model import PinError


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append(dict(attrs))


def wheel_links(index_url: str, package: str) -> list[tuple[str, str, dict]]:
    """(filename, absolute url, attributes) of every wheel on a PEP 503 simple-index page."""
    page = f"{index_url.rstrip('/')}/{canonicalize_name(package)}/"
    parser = _Links()
    parser.feed(resolve._http(page).body.decode(errors="replace"))
    out = []
    for attrs in parser.links:
        href = attrs.get("href", "")
        url = urllib.parse.urljoin(page, href)
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        if filename.endswith(".whl"):
            out.append((filename, url, attrs))
    return out


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def platform_tags(platform: dict) -> list[str]:
    """Platform tags a glibc system (versions.json platform) accepts, most specific first, as pip
    orders them: manylinux_2_N down to 2_5 with the legacy aliases beside their glibc, then
    linux_<machine> (the PyTorch index's tag)."""
    machine = platform["machine"]
    newest = int(platform["glibc"].split(".")[1])
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for minor in range(newest, 4, -1):
        tags.append(f"manylinux_2_{minor}_{machine}")
        if minor in legacy:
            tags.append(f"{legacy[minor]}_{machine}")
    return tags + [f"linux_{machine}"]


def supported_tags(python: str, platform: dict) -> list[Tag]:
    """The wheel tags CPython `python` (e.g. "3.12") accepts on `platform`, preferred first."""
    version = tuple(int(x) for x in python.split("."))
    platforms = platform_tags(platform)
    return [*cpython_tags(version, platforms=platforms), *compatible_tags(version, platforms=platforms)]


def pick_wheel(links, package: str, version: str, python: str, platform: dict):
    """The link of the wheel of package==version that pip would install on CPython `python` on
    `platform`: filenames parsed with packaging (build tags, compressed tag sets, normalised
    names and versions); among several, the one with the most preferred tag."""
    accepted = {tag: rank for rank, tag in enumerate(supported_tags(python, platform))}
    best = None
    for link in links:
        try:
            name, found, build, tags = parse_wheel_filename(link[0])
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if name != canonicalize_name(package) or not _same_version(str(found), version):
            continue
        ranks = [accepted[t] for t in tags if t in accepted]
        if ranks and (best is None or (min(ranks), _build_order(build)) < best[0]):
            best = ((min(ranks), _build_order(build)), link)
    if best is None:
        where = f"CPython {python}, glibc {platform['glibc']} {platform['machine']}"
        raise PinError(f"no {package}=={version} wheel for {where} (cp{python.replace('.', '')}) on the index: "
                       "check the version, python.version and platform in versions.json")
    return best[1]


def _build_order(build) -> tuple:
    """Higher build numbers first, as pip prefers them."""
    return (-build[0], build[1]) if build else (0, "")


def wheel_sha256(url: str) -> str:
    fragment = urllib.parse.urlsplit(url).fragment
    if fragment.startswith("sha256="):
        return fragment.split("=", 1)[1]
    digest = hashlib.sha256()
    resolve._http(url, sink=digest.update)
    return digest.hexdigest()


def _exact_requirements(metadata: str):
    """(name, version) of each Requires-Dist with an exact == version in a wheel's METADATA."""
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if len(pins) == 1:
            yield canonicalize_name(req.name), pins[0]


def required_version(metadata: str, package: str) -> str | None:
    return next((v for name, v in _exact_requirements(metadata) if name == canonicalize_name(package)), None)


def triton_requirement(metadata: str) -> tuple[str, str] | None:
    """(distribution, version) of the Triton a torch wheel's metadata requires with ==
    (pytorch-triton-rocm, triton-rocm, triton, ... by release)."""
    return next(((name, v) for name, v in _exact_requirements(metadata) if "triton" in name), None)


def resolve_wheels(data: dict, force: bool = False, track: str | None = None) -> list[str]:
    """torch first; Triton's distribution name and version from torch's own metadata (PEP 658
    .metadata file beside the wheel); then every wheel's sha256. The wheel set the track uses
    (its own pytorch, else the shared one)."""
    torch = model.section(data, "pytorch", track)
    where = f"tracks.{track}.pytorch" if track and "pytorch" in data["tracks"][track] else "pytorch"
    python = data["python"]["version"]
    changes: list[str] = []
    torch_url = None
    for key in model.WHEEL_KEYS:
        wheel = torch["wheels"][key]
        if key == "triton":
            metadata_url = torch_url.split("#")[0] + ".metadata"
            found = triton_requirement(resolve._http(metadata_url).body.decode(errors="replace"))
            if found is None:
                raise PinError(f"{metadata_url}: torch requires no Triton with ==: set {where}.wheels.triton "
                               "package and version by hand")
            changes += resolve._set(wheel, f"{where}.wheels.triton", {"package": found[0], "version": found[1]}, force)
        if wheel["package"] is None or wheel["version"] is None:
            raise PinError(f"{where}.wheels.{key}: package and version must be set to resolve its sha256")
        filename, url, _ = pick_wheel(wheel_links(torch["index_url"], wheel["package"]), wheel["package"],
                                      wheel["version"], python, data["platform"])
        if key == "torch":
            torch_url = url
        changes += resolve._set(wheel, f"{where}.wheels.{key}", {"sha256": wheel_sha256(url)}, force)
    return changes
