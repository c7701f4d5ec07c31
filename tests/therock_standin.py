"""Stand-ins for TheRock's release index: PEP 503 indexes (one folder per project, an index.html
linking each wheel with its sha256) of small wheels with TheRock's names, versions, extras and
requirements as vLLM 0.34's base installs them. The wheels work as far as a CPU allows: the SDK's
`rocm-sdk` command (init unpacks a devel tree; path --root prints it), the SDK core's amd_smi
package source, torch reporting its ROCm (torch.version.hip), torch requiring a Triton of its own.

A "PyPI" index holds what a careless second index would offer: the same names with other bytes,
and a project the release index lacks."""
from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

SDK = "10.0.0"
TORCH = {"torch": "2.13.0+rocm10.0.0", "torchvision": "0.28.0+rocm10.0.0", "torchaudio": "2.11.0+rocm10.0.0"}
# Triton TheRock's torch names (the image builds another from source and makes torch require that)
TORCH_TRITON = "3.7.1+rocm10.0.0"
ARCHS = ("gfx90a", "gfx942", "gfx950")

ROCM_SDK_CLI = '''\
import sys
import sysconfig
from pathlib import Path

DEVEL = Path(sysconfig.get_paths()["purelib"]) / "_rocm_sdk_devel"


def main():
    cmd = sys.argv[1:]
    if cmd == ["init"]:
        (DEVEL / "lib").mkdir(parents=True, exist_ok=True)
        (DEVEL / "bin").mkdir(parents=True, exist_ok=True)
        (DEVEL / "lib" / "libamdhip64.so.7").write_text("devel")  # the devel tree's copy of the HIP runtime
        print("rocm-sdk: devel tree at", DEVEL)
    elif cmd == ["path", "--root"]:
        print(DEVEL)
    else:
        sys.exit("usage: rocm-sdk init | path --root")
'''
ROCM_SDK_INIT = "def preload_libraries(*names, rtld_global: bool = True):\n    return names\n"
AMD_SMI_SETUP = "from setuptools import setup\nsetup(name='amdsmi', version='26.0.0', packages=['amdsmi'])\n"


def dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name)


def wheel(folder: Path, name: str, version: str, origin: str, requires: list[str] = (),
          extras: list[str] = (), files: dict[str, str] | None = None, scripts: dict[str, str] | None = None) -> Path:
    """A wheel of NAME VERSION with these requirements, extras, files and console scripts, and a
    file <dist>_origin.txt saying which index it came from."""
    dist = dist_name(name)
    info = f"{dist}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Provides-Extra: {extra}" for extra in extras] + [f"Requires-Dist: {req}" for req in requires]
    members = {f"{info}/METADATA": "\n".join(meta) + "\n",
               f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: stand-in\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
               f"{dist}_origin.txt": origin, **(files or {})}
    if scripts:
        lines = "".join(f"{k} = {v}\n" for k, v in scripts.items())
        members[f"{info}/entry_points.txt"] = "[console_scripts]\n" + lines
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in members.items():
            zf.writestr(member, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{m},,\n" for m in [*members, f"{info}/RECORD"]))
    return path


def release_wheels() -> list[dict]:
    """TheRock's wheels: the SDK meta package with its extras, its parts, the device wheels of three
    archs, the PyTorch wheels (torch requiring TheRock's Triton and a dependency from this index)."""
    out = [
        dict(name="rocm", version=SDK, requires=[f"rocm-sdk-core=={SDK}",
                                               f'rocm-sdk-libraries=={SDK} ; extra == "libraries"',
                                               f'rocm-sdk-devel=={SDK} ; extra == "devel"',
                                               *(f'rocm-sdk-device-{a}=={SDK} ; extra == "device-{a}"' for a in ARCHS)],
             extras=["libraries", "devel", *(f"device-{a}" for a in ARCHS)],
             files={"rocm_sdk/__init__.py": ROCM_SDK_INIT, "rocm_sdk/cli.py": ROCM_SDK_CLI},
             scripts={"rocm-sdk": "rocm_sdk.cli:main"}),
        dict(name="rocm-sdk-core", version=SDK, files={
            "_rocm_sdk_core/lib/libamdhip64.so.7": "core", "_rocm_sdk_core/lib/librocm_smi64.so.1": "smi",
            "_rocm_sdk_core/share/amd_smi/setup.py": AMD_SMI_SETUP,
            "_rocm_sdk_core/share/amd_smi/amdsmi/__init__.py": "AMDSMI_STANDIN = True\n"}),
        dict(name="rocm-sdk-libraries", version=SDK),
        dict(name="rocm-sdk-devel", version=SDK),
        *(dict(name=f"rocm-sdk-device-{a}", version=SDK) for a in ARCHS),
        dict(name="torch", version=TORCH["torch"],
             requires=[f"triton=={TORCH_TRITON} ; platform_system == \"Linux\"", "filelock",
                       *(f'torch-device-{a}=={TORCH["torch"]} ; extra == "device-{a}"' for a in ARCHS)],
             extras=[f"device-{a}" for a in ARCHS],
             files={"torch/__init__.py": f"__version__ = {TORCH['torch']!r}\n\n\nclass version:\n    hip = '{SDK}'\n"}),
        *(dict(name=f"torch-device-{a}", version=TORCH["torch"]) for a in ARCHS),
        dict(name="torchvision", version=TORCH["torchvision"], requires=[f"torch=={TORCH['torch']}"],
             extras=[f"device-{a}" for a in ARCHS]),
        dict(name="torchaudio", version=TORCH["torchaudio"], requires=[f"torch=={TORCH['torch']}"]),
        dict(name="filelock", version="3.20.0"),
        dict(name="triton", version=TORCH_TRITON, files={"triton/__init__.py": f"__version__ = {TORCH_TRITON!r}\n"}),
    ]
    return out


def index(root: Path, origin: str, wheels: list[dict]) -> Path:
    """A PEP 503 simple index of these wheels at root/simple; returns that folder."""
    simple = root / "simple"
    for spec in wheels:
        project = simple / spec["name"]
        project.mkdir(parents=True, exist_ok=True)
        path = wheel(project, origin=origin, **spec)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        with open(project / "index.html", "a") as page:
            page.write(f'<a href="{path.name}#sha256={digest}">{path.name}</a>\n')
    return simple


def pypi_wheels() -> list[dict]:
    """PyPI's same-named placeholders: the SDK core at the release's version (other bytes) and a
    project the release index lacks."""
    return [dict(name="rocm-sdk-core", version=SDK), dict(name="extra-only-on-pypi", version="1.0")]


def sha256_of(simple: Path, name: str, version: str) -> str:
    path = simple / name / f"{dist_name(name)}-{version}-py3-none-any.whl"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lock_requirements(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256s) of the requirements of a lock tools.pins.locks made."""
    from tools.pins import locks

    out = {}
    for block in re.split(r"\n(?=[a-z0-9])", locks.split_lock(text)[1]):
        m = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
        if m:
            out[m.group(1)] = (m.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return out
