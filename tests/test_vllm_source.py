"""The vLLM build scripts (docker/) against the released source of every release track's vLLM:
its PyPI sdist, downloaded once (sha256 from versions.json tracks.<track>.vllm.sdist) and cached
between runs in VLLM_SDIST_CACHE (default ~/.cache/rocm-vllm-test). Every test taking `vllm_src`
runs once per track.

What runs here is everything of build_vllm.sh before the compile: the files it names exist, the
build tools satisfy vLLM's build requirements, and vLLM's ROCm runtime requirements resolve
(pip --dry-run --report, needs PyPI) in an environment that holds the base image's pinned
distributions, under the constraints the script writes, without touching any of them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from venvs import make_venv

from build_script_env import install_script_requirements, wheelhouse
from tools.build_scripts import load
from tools.pins import discover, model
from vllm_sdist import sdist_source, track_names

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
# Versions versions.json does not know yet (unresolved pins) get stand-ins, marked as such.
STAND_IN = {"triton": "3.8.0+stand.in", "amdsmi": "26.0.0+stand.in"}


@pytest.fixture(scope="module")
def versions():
    return model.load(ROOT / "versions.json")


@pytest.fixture(scope="module", params=track_names())
def track(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def own(versions, track) -> dict:
    """The track's own entry of versions.json."""
    return versions["tracks"][track]


@pytest.fixture(scope="module")
def vllm_src(track) -> Path:
    """The track's vLLM sdist, downloaded once, checked against versions.json, unpacked once."""
    return sdist_source(track)


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


# ------------------------------------------------------------------ files the scripts name

def named_vllm_paths() -> set[str]:
    """vLLM source paths (requirements/..., cmake/...) that the scripts of docker/ name."""
    found = set()
    for script in DOCKER.iterdir():
        if script.suffix in (".sh", ".py"):
            text = script.read_text()
            found |= set(re.findall(r"\b(requirements/[A-Za-z0-9_./-]+\.txt|cmake/[A-Za-z0-9_./-]+\.cmake)\b", text))
    return found


def _vr():
    return load("vllm_requirements")


def test_every_vllm_file_the_scripts_name_exists(vllm_src):
    named = named_vllm_paths()
    # the ROCm build requirements: rocm.txt up to 0.33 (0.33 has TheRock's rock.txt beside it), rock.txt in 0.34
    builds = set(_vr().BUILD_REQUIREMENTS)
    assert builds <= named and "requirements/rocm.txt" in named
    assert any((vllm_src / p).is_file() for p in builds)
    missing = sorted(p for p in named - builds if not (vllm_src / p).is_file())
    assert not missing, f"named by docker/ but not in {vllm_src.name}: {missing}"
    proc = run([sys.executable, DOCKER / "vllm_requirements.py", "files", vllm_src])
    assert proc.returncode == 0, proc.stderr


def test_requirement_includes_are_relative_to_their_folder(vllm_src, tmp_path):
    """requirements/build/rocm.txt includes ../common.txt: read in place it resolves, copied
    elsewhere it does not (the scripts keep the files where they are)."""
    vr = _vr()
    build = vr.build_requirements(vllm_src)
    names = {r.name for _, r in vr.read_requirements(build)}
    assert "xgrammar" in names and "cmake" in names  # xgrammar comes from ../common.txt
    copy = tmp_path / "rocm.txt"
    copy.write_text(build.read_text())
    with pytest.raises(FileNotFoundError):
        vr.read_requirements(copy)


def test_build_tools_satisfy_vllms_build_requirements(vllm_src):
    proc = run([sys.executable, DOCKER / "vllm_requirements.py", "build-tools", vllm_src,
                DOCKER / "requirements-build.txt"])
    assert proc.returncode == 0, proc.stderr
    # vLLM's build file pins its own torch/Triton/amdsmi builds: reported, never installed
    assert re.search(r"asks for torch==.*the base image's torch", proc.stdout), proc.stdout


def test_build_tools_check_can_fail(vllm_src, tmp_path):
    tools = tmp_path / "requirements-build.txt"
    tools.write_text("setuptools==80.9.0 --hash=sha256:" + "0" * 64 + "\n")
    proc = run([sys.executable, DOCKER / "vllm_requirements.py", "build-tools", vllm_src, tools])
    assert proc.returncode == 1 and "setuptools" in proc.stderr and "requirements-build.txt" in proc.stderr


def test_triton_kernels_pin_is_the_commit_vllm_names(vllm_src, own):
    commit = own["vllm"]["triton_kernels_commit"]
    proc = run([sys.executable, DOCKER / "vllm_requirements.py", "triton-kernels", vllm_src, commit])
    assert proc.returncode == 0, proc.stderr
    proc = run([sys.executable, DOCKER / "vllm_requirements.py", "triton-kernels", vllm_src, "0" * 40])
    assert proc.returncode == 1 and "vllm.triton_kernels.commit" in proc.stderr


def test_track_follows_the_rocm_base_its_vllm_names(vllm_src, own, versions, track):
    """The track's AITER pin and ROCm base image are the ones in the upstream base Dockerfile the
    track names (vLLM 0.33 keeps the ROCm 7.2 stack as docker/Dockerfile.rocm_72_base)."""
    path = vllm_src / own["upstream_base_dockerfile"]
    assert path.is_file(), f"tracks.{track}.upstream_base_dockerfile: {path.name} is not in {vllm_src.name}"
    upstream = discover.dockerfile_args(path.read_text())
    aiter_tag = versions["aiter"]["pins"][own["aiter"]]["tag"]
    assert upstream["AITER_BRANCH"] == aiter_tag, (
        f"{vllm_src.name}/{own['upstream_base_dockerfile']} builds AITER {upstream['AITER_BRANCH']}, "
        f"tracks.{track}.aiter gives {aiter_tag}")
    base = model.section(versions, "base_image", track)
    assert discover.same_image(upstream["BASE_IMAGE"], base), (upstream["BASE_IMAGE"], base)
    rocm = model.section(versions, "rocm", track)["version"]
    if model.track_stack(versions, track) == model.THEROCK_STACK:  # ROCm as wheels: the SDK version
        assert upstream["ROCM_SDK_VERSION"] == rocm
    else:  # a ROCm image: its tag starts with the ROCm version
        assert discover.image_parts(upstream["BASE_IMAGE"])[1].startswith(rocm)


# ------------------------------------------------------------------ dependency resolution

def stub_wheel(directory: Path, name: str, version: str, requires=()) -> Path:
    """A wheel holding only the metadata of NAME VERSION (no code): stands for a pinned build."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    files = {
        f"{info}/METADATA": "Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                            + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    records = [f"{n},sha256=,{len(t)}" for n, t in files.items()] + [f"{info}/RECORD,,"]
    with zipfile.ZipFile(path, "w") as zf:
        for n, t in files.items():
            zf.writestr(n, t)
        zf.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return path


@pytest.fixture(scope="module")
def pinned_env(versions, track, tmp_path_factory):
    """A virtual environment holding the track's base image's pinned distributions as
    metadata-only wheels (torch and its Triton, torchvision, torchaudio, amdsmi, amd-aiter)."""
    torch = model.section(versions, "pytorch", track)["torch"]
    # the Triton torch requires is in the track's PyTorch lock, not in versions.json: a stand-in
    triton_pkg, triton_ver = "pytorch-triton-rocm", STAND_IN["triton"]
    torch_ver = torch["torch"]
    pins = {
        "torch": (torch_ver, [f"{triton_pkg}=={triton_ver}"]),
        triton_pkg: (triton_ver, []),
        "torchvision": (torch["torchvision"], [f"torch=={torch_ver}"]),
        "torchaudio": (torch["torchaudio"], [f"torch=={torch_ver}"]),
        "amdsmi": (STAND_IN["amdsmi"], []),
        "amd-aiter": (versions["aiter"]["pins"][versions["tracks"][track]["aiter"]]["tag"].lstrip("v"), []),
    }
    base = tmp_path_factory.mktemp("pinned-env")
    env = base / "venv"
    make_venv(env)
    install_script_requirements(env / "bin/python", wheelhouse(tmp_path_factory))
    stubs = base / "stubs"
    stubs.mkdir()
    paths = [stub_wheel(stubs, n, v, r) for n, (v, r) in pins.items()]
    proc = run([env / "bin/python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", *paths])
    assert proc.returncode == 0, proc.stderr
    return {"python": env / "bin/python", "bin": env / "bin", "pins": {n: v for n, (v, _) in pins.items()},
            "triton": triton_pkg}


def test_check_takes_the_tracks_lock_of_the_runtime_requirements(vllm_src, pinned_env, versions, track, tmp_path):
    """build_vllm.sh check, as the vllm-wheel stage runs it: the track's lock of vLLM's runtime
    requirements is accepted for this source and handed on; another release's lock is refused."""
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{pinned_env['bin']}:{os.environ['PATH']}",
           "TRITON_KERNELS_COMMIT": model.build_args(versions, track_name_=track)["TRITON_KERNELS_COMMIT"],
           "VLLM_LOCK": str(ROOT / f"docker/locks/vllm-{track}-rocm.txt")}
    if track not in model.built_track_names(versions):
        # a track on a stack not built here (therock): no lock, and the check stops on that in one line
        assert not (ROOT / f"docker/locks/vllm-{track}-rocm.txt").exists()
        proc = run(["bash", DOCKER / "build_vllm.sh", "check", vllm_src, out], env=env, timeout=900)
        assert proc.returncode == 1 and "python3 -m tools.pins lock vllm" in proc.stderr, proc.stderr[-2000:]
        return
    proc = run(["bash", DOCKER / "build_vllm.sh", "check", vllm_src, out], env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "requirements-lock.txt").read_text() == (ROOT / f"docker/locks/vllm-{track}-rocm.txt").read_text()
    other = [p for p in (ROOT / "docker/locks").glob("vllm-*-rocm.txt") if p.name != f"vllm-{track}-rocm.txt"]
    for lock in other:
        inputs = [re.findall(r"^# input .*$", f.read_text(), re.M) for f in (lock, out / "requirements-lock.txt")]
        differs = inputs[0] != inputs[1]
        proc = run(["bash", DOCKER / "build_vllm.sh", "check", vllm_src, tmp_path / "other"],
                   env={**env, "VLLM_LOCK": str(lock)}, timeout=900)
        assert (proc.returncode == 1) == differs, proc.stderr[-2000:]
    proc = run(["bash", DOCKER / "build_vllm.sh", "check", vllm_src, tmp_path / "none"],
               env={**env, "VLLM_LOCK": str(tmp_path / "missing.txt")}, timeout=900)
    assert proc.returncode == 1 and "python3 -m tools.pins lock vllm" in proc.stderr
    # the lock cut to its header, or inside its first entry (before any hash), is refused
    lines = (ROOT / f"docker/locks/vllm-{track}-rocm.txt").read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    for name, kept in (("header", lines[:first]), ("cut", lines[:first + 1])):
        cut = tmp_path / f"{name}.txt"
        cut.write_text("".join(kept))
        proc = run(["bash", DOCKER / "build_vllm.sh", "check", vllm_src, tmp_path / name],
                   env={**env, "VLLM_LOCK": str(cut)}, timeout=900)
        assert proc.returncode == 1 and "python3 -m tools.pins lock vllm" in proc.stderr, (name, proc.stderr[-1500:])
        assert "Traceback" not in proc.stderr


def test_constraints_missing_a_pinned_distribution_fail(tmp_path_factory):
    env = tmp_path_factory.mktemp("empty-env") / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", env]).returncode == 0
    install_script_requirements(env / "bin/python", wheelhouse(tmp_path_factory))
    proc = run([env / "bin/python", DOCKER / "pinned_dists.py", "constraints", env / "c.txt"])
    assert proc.returncode == 1 and "torch is not installed" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ runtime environment

# The runtime settings of vLLM's own ROCm serving image (each track's) that a serving image of ours
# needs (the others upstream sets: UCX_* and KINETO_CONFIG configure components this image does
# not carry; PYTORCH_NVML_BASED_CUDA_CHECK is set by vLLM itself at import, vllm/env_override.py;
# TOKENIZERS_PARALLELISM only silences a warning).
SERVING_ENV = ("HSA_NO_SCRATCH_RECLAIM", "HIP_FORCE_DEV_KERNARG", "SAFETENSORS_FAST_GPU", "HSA_ENABLE_IPC_MODE_LEGACY")


def env_of(text: str) -> dict[str, str]:
    found = {}
    for m in re.finditer(r"^ENV\s+(.*?)(?<!\\)$", re.sub(r"\\\n\s*", " ", text), re.M):
        for token in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)', m.group(1)):
            found[token[0]] = token[1].strip('"')
    return found


def test_the_guard_accepts_the_aiter_switch_values_vllm_reads(vllm_src):
    """The runtime guard accepts 1/true/0/false (any case) for each AITER switch it checks and refuses
    the rest: each track's vLLM reads those switches as on exactly for "true"/"1", lower-cased."""
    from rocm_vllm_runtime.guard import AITER_SWITCHES, AITER_VALUES

    envs = (vllm_src / "vllm/envs.py").read_text()
    for name in AITER_SWITCHES:
        m = re.search(rf'"{name}": lambda: \(\s*os\.getenv\("{name}", "(\w+)"\)\.lower\(\) in \("true", "1"\)', envs)
        assert m, f"{vllm_src.name}'s vllm/envs.py no longer reads {name} as .lower() in ('true', '1')"
        assert {v for v, on in AITER_VALUES.items() if on} == {"true", "1"}


def test_serving_image_sets_upstreams_rocm_runtime_environment(vllm_src):
    upstream = {**env_of((vllm_src / "docker/Dockerfile.rocm_base").read_text()),
                **env_of((vllm_src / "docker/Dockerfile.rocm").read_text())}
    text = (ROOT / "Dockerfile.rocm").read_text()
    serve_base = text[text.index("FROM vllm AS serve-base"):text.index("FROM serve-base AS serve\n")]
    ours = env_of(serve_base)
    for name in SERVING_ENV:
        assert name in upstream, f"{vllm_src.name}'s ROCm Dockerfiles no longer set {name}"
        assert ours.get(name) == upstream[name], f"serve-base: ENV {name}={upstream[name]} (as upstream) missing"
    lines = serve_base.splitlines()
    for i, line in enumerate(lines):  # one comment each
        if re.match(rf"^ENV ({'|'.join(SERVING_ENV)})=", line):
            assert lines[i - 1].startswith("#"), line


# vLLM's setup.py (0.32 and later) also builds Rust artifacts with setuptools-rust: the `vllm-rs` frontend
# binary (used only with VLLM_USE_RUST_FRONTEND=1 or VLLM_USE_RUST_BENCH=1). The base image has
# no Rust toolchain, so the compile relies on that extension being optional; the next two tests
# hold vLLM's source and the pinned setuptools-rust to that.
RUST_PROBE = '''\
import importlib.util, sys
from setuptools import setup
spec = importlib.util.spec_from_file_location("vllm_build_rust", sys.argv[1])
build_rust = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_rust)
optional = sys.argv[2] == "optional"
names = [ext.name for ext in build_rust.rust_extensions(optional=optional)]
print("rust extensions:", names, "optional" if optional else "required", flush=True)
setup(name="vllm-rust-probe", version="0", rust_extensions=build_rust.rust_extensions(optional=optional),
      script_args=["build_rust"])
'''


def setup_py_rust_optional(src: Path, env: dict[str, str]) -> bool:
    """What vLLM's setup.py passes as `optional=` to its Rust extensions, evaluated under `env`:
    the expression and the function it calls are taken from setup.py itself."""
    import ast

    tree = ast.parse((src / "setup.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "rust_extensions"]
    assert len(calls) == 1, "vLLM's setup.py: expected one rust_build.rust_extensions(...) call"
    (optional,) = [k.value for k in calls[0].keywords if k.arg == "optional"]
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "should_require_rust_frontend"]
    module = ast.Module(body=[ast.Import(names=[ast.alias(name="os")]), *functions], type_ignores=[])
    scope: dict = {}
    exec(compile(ast.fix_missing_locations(module), "setup.py", "exec"), scope)
    saved = os.environ.copy()
    try:
        os.environ.clear()
        os.environ.update(env)
        return bool(eval(compile(ast.Expression(optional), "setup.py", "eval"), scope))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_vllm_rust_frontend_is_optional_unless_required(vllm_src):
    assert setup_py_rust_optional(vllm_src, {}) is True
    assert setup_py_rust_optional(vllm_src, {"VLLM_REQUIRE_RUST_FRONTEND": "1"}) is False
    # build_vllm.sh never asks for it, whatever the build environment holds
    script = (DOCKER / "build_vllm.sh").read_text()
    assert "unset VLLM_REQUIRE_RUST_FRONTEND" in script
    assert "VLLM_REQUIRE_RUST_FRONTEND=" not in script


@pytest.fixture(scope="module")
def build_tools(tmp_path_factory) -> Path:
    """The hash-pinned build tools (docker/requirements-build.txt) installed into a folder."""
    target = tmp_path_factory.mktemp("build-tools")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--require-hashes", "--no-compile", "--target", target,
                           "-r", DOCKER / "requirements-build.txt"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"cannot install docker/requirements-build.txt (needs PyPI): {proc.stderr[-2000:]}")
    return target


@pytest.mark.parametrize("mode", ["optional", "required"])
def test_vllm_compile_without_a_rust_toolchain(vllm_src, build_tools, tmp_path, mode):
    """setuptools-rust at our pin, with no cargo/rustc on PATH, on vLLM's own Rust extension list:
    optional (what setup.py passes by default) goes on without it; required stops."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    for tool in ("cargo", "rustc"):
        assert not (bin_dir / tool).exists()
    env = {"PATH": str(bin_dir), "PYTHONPATH": str(build_tools), "HOME": str(tmp_path)}
    (tmp_path / "probe.py").write_text(RUST_PROBE)
    proc = subprocess.run([sys.executable, "probe.py", str(vllm_src / "tools/build_rust.py"), mode],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert "rust extensions: ['vllm.vllm-rs']" in out, out
    assert "can't find Rust compiler" in out, out
    if mode == "optional":
        assert proc.returncode == 0, out
    else:
        assert proc.returncode != 0, out
