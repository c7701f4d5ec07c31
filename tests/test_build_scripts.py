"""The build scripts of docker/ run here for real (no Docker): the shared helper lib.sh
(MAX_JOBS from CPUs and the cgroup memory limit, the CA bundle), the pinned-distribution guard
(pinned_dists.py), the source stages' HipKittens and triton_kernels fetches against local git
repositories, and the AMD SMI import check."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from venvs import make_venv

from build_script_env import install_script_requirements, wheelhouse
from git_repo import commit_all, git, new_repo
from test_vllm_source import stub_wheel

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
GIB = 1024 ** 3


def bash(script: str, env: dict, cwd=None):
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, cwd=cwd)


@pytest.fixture()
def cgroup(tmp_path):
    """A fake cgroup v2 directory and meminfo: 64 GiB available on the host, the cgroup limited
    to 10 GiB with 2 GiB in use, no CPU quota."""
    d = tmp_path / "cgroup"
    d.mkdir()
    (d / "memory.max").write_text(f"{10 * GIB}\n")
    (d / "memory.current").write_text(f"{2 * GIB}\n")
    (d / "cpu.max").write_text("max 100000\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {128 * 1024 * 1024} kB\nMemAvailable: {64 * 1024 * 1024} kB\n")
    return {"ROCM_VLLM_CGROUP_DIR": str(d), "ROCM_VLLM_MEMINFO": str(meminfo)}


def base_env(**extra):
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **extra}


def derive(env):
    return bash(f'source {DOCKER}/lib.sh && derive_max_jobs t PER && echo "jobs=$MAX_JOBS"', base_env(**env))


def test_max_jobs_honours_the_cgroup_memory_limit_and_cpu_quota(cgroup):
    """8 GiB usable (limit - usage), though the host has 64 GiB free: 8 GiB per job gives one
    job whatever the CPU count; a CPU quota of one CPU bounds it to one as well."""
    proc = derive({**cgroup, "PER": "8", "MAX_JOBS": ""})
    assert proc.returncode == 0, proc.stderr
    assert "jobs=1" in proc.stdout and "8 GiB usable" in proc.stdout, proc.stdout
    (Path(cgroup["ROCM_VLLM_CGROUP_DIR"]) / "memory.max").write_text("max\n")
    (Path(cgroup["ROCM_VLLM_CGROUP_DIR"]) / "cpu.max").write_text("100000 100000\n")
    proc = derive({**cgroup, "PER": "1"})
    assert "jobs=1" in proc.stdout and "1 CPUs, 64 GiB usable" in proc.stdout, proc.stdout
    proc = derive({**cgroup, "PER": "100"})
    assert proc.returncode == 1 and "PER" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = derive({**cgroup, "PER": "1", "MAX_JOBS": "x"})
    assert proc.returncode == 1 and "MAX_JOBS" in proc.stderr


@pytest.mark.parametrize("script,per_job", [("build_vllm.sh", "VLLM_MEM_PER_JOB_GIB"),
                                            ("build_aiter.sh", "AITER_MEM_PER_JOB_GIB")])
def test_both_builds_derive_max_jobs_from_the_cgroup_limit(script, per_job, cgroup, tmp_path):
    """Each build prints MAX_JOBS derived under the cgroup limit before it needs anything else,
    and stops at once, naming the setting, when one job does not fit."""
    kernels = tmp_path / "tk"
    kernels.mkdir()
    (kernels / "__init__.py").write_text("")
    args = {"build_vllm.sh": ["wheel", str(tmp_path), str(tmp_path / "out")],
            "build_aiter.sh": [str(tmp_path), str(tmp_path / "out")]}[script]
    env = base_env(**cgroup, GPU_ARCHS="gfx942", VLLM_VERSION="0.32.0", AITER_TAG="v0",

                   TRITON_KERNELS_SRC_DIR=str(kernels), **{per_job: "100"})
    proc = subprocess.run(["bash", str(DOCKER / script), *args], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "MAX_JOBS=0" in proc.stdout and "8 GiB usable" in proc.stdout, proc.stdout + proc.stderr
    assert per_job in proc.stderr


def test_aiter_flydsl_workers_bounded_by_max_jobs():
    text = (DOCKER / "build_aiter.sh").read_text()
    assert re.search(r"export AITER_FLYDSL_AOT_WORKERS=\$\{AITER_FLYDSL_AOT_WORKERS:-\$MAX_JOBS\}", text)
    assert text.index("derive_max_jobs") < text.index("AITER_FLYDSL_AOT_WORKERS=")


def test_scm_version_only_on_aiters_setup_command():
    text = (DOCKER / "build_aiter.sh").read_text()
    lines = [line for line in text.splitlines()
             if "SETUPTOOLS_SCM_PRETEND_VERSION" in line and not line.lstrip().startswith("#")]
    assert len(lines) == 1 and "setup.py bdist_wheel" in lines[0] and "export" not in lines[0], lines


def test_build_tools_are_hash_pinned_and_installed_from_our_file():
    """Every build tool, and packaging (which the build scripts import), is locked by version and
    sha256 (python3 -m tools.pins lock, tests/test_locks.py holds the locks current); packaging is
    pinned in requirements-scripts.in only, which requirements-build.in includes; install_torch.sh
    installs the scripts' lock first."""
    pins = {}
    for name in ("requirements-build.in", "requirements-scripts.in"):
        lines = (DOCKER / name).read_text().splitlines()
        for line in (x.strip() for x in lines if x.strip() and not x.startswith("#")):
            if line == "-r requirements-scripts.in" and name == "requirements-build.in":
                continue
            m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line)
            assert m, f"{name}: {line}"
            assert m.group(1).lower() not in pins, f"{m.group(1)} pinned twice"
            pins[m.group(1).lower()] = name
    assert {"setuptools", "setuptools-scm", "wheel", "ninja"} <= {n for n, f in pins.items()
                                                                  if f == "requirements-build.in"}
    assert [n for n, f in pins.items() if f == "requirements-scripts.in"] == ["packaging"]
    locked = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", (DOCKER / "requirements-build.txt").read_text(), re.M)
    assert {n.lower(): v for n, v in locked}.items() >= {"packaging": "26.2", "setuptools": "79.0.1"}.items()
    scm = next(line for line in (DOCKER / "requirements-build.txt").read_text().splitlines()
               if line.startswith("setuptools-scm=="))
    assert int(scm.split("==")[1].split(".")[0]) < 10  # AITER's release workflow: setuptools_scm<10
    for script in ("build_aiter.sh", "build_vllm.sh"):
        text = (DOCKER / script).read_text()
        assert 'pip install --require-hashes --no-deps -r "$here/requirements-build.txt"' in text, script
        assert not re.search(r"pip install (-U )?setuptools|grep -v", text), script
    torch = (DOCKER / "install_torch.sh").read_text()
    first = torch.index('pip install --require-hashes --no-deps -r "$here/requirements-scripts.txt"')
    assert first < torch.index("\"$here/pinned_dists.py\"")


def test_ca_bundle_exported_in_one_place_only(tmp_path):
    """Every script and Dockerfile step gets the CA bundle from lib.sh's use_ca_bundle."""
    offenders = []
    for path in [*DOCKER.glob("*.sh"), ROOT / "Dockerfile.rocm", ROOT / "Dockerfile.rocm_base"]:
        if path.name == "lib.sh":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"export\s+\w*(CERT|CAINFO|CA_BUNDLE)\w*=", line):
                offenders.append(f"{path.name}:{number}")
    assert not offenders, offenders
    bundle = tmp_path / "ca.pem"
    bundle.write_text("x")
    proc = bash(f"source {DOCKER}/lib.sh && use_ca_bundle && echo $PIP_CERT $GIT_SSL_CAINFO",
                base_env(ROCM_VLLM_CA_BUNDLE=str(bundle)))
    assert proc.stdout.split() == [str(bundle), str(bundle)]


# ------------------------------------------------------------------ pinned distributions

@pytest.fixture()
def venv(tmp_path, tmp_path_factory):
    """A fresh environment as the base image's torch stage has it before torch: Python, pip and
    the build scripts' requirements; `install` adds metadata-only wheels."""
    py = make_venv(tmp_path / "venv")
    install_script_requirements(py, wheelhouse(tmp_path_factory))

    def install(*specs):
        wheels = [stub_wheel(tmp_path, n, v, r) for n, v, r in specs]
        proc = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheels],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    return py, install


def dists(py, *args, env=None):
    return subprocess.run([py, DOCKER / "pinned_dists.py", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_triton_name_read_from_torch_and_alias_recorded(venv, tmp_path):
    py, install = venv
    install(("torch", "2.13.0+rocm7.2", ["triton-rocm==3.8.0+rocm7.2"]), ("triton-rocm", "3.8.0+rocm7.2", []),
            ("amdsmi", "26.0.0", []))
    assert dists(py, "torch-triton").stdout.strip() == "triton-rocm==3.8.0+rocm7.2"
    # the Triton the PyTorch lock holds is another one (name or version): refused in one line
    for other in ("pytorch-triton-rocm==3.8.0+rocm7.2", "triton-rocm==3.8.1+rocm7.2"):
        proc = dists(py, "torch-triton", "--expect", other)
        assert proc.returncode == 1 and f"not {other}" in proc.stderr and "resolve wheels --force" in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert dists(py, "triton-alias").returncode == 0
    out = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('triton'), m.requires('triton'))"],
                         capture_output=True, text=True).stdout
    assert out.startswith("3.8.0+rocm7.2") and "triton-rocm==3.8.0+rocm7.2" in out
    assert dists(py, "constraints", tmp_path / "c.txt").returncode == 0
    assert "triton==3.8.0+rocm7.2" in (tmp_path / "c.txt").read_text()


def test_torchs_triton_is_read_from_requirements_that_apply(venv):
    """torch's Requires-Dist read as pip reads them: a Triton behind an extra torch is not
    installed with, or behind a marker false here, is not torch's Triton."""
    py, install = venv
    install(("torch", "2.13.0+rocm7.2", ['triton-cuda==9.9; extra == "cuda"',
                                         'triton-win==9.9; sys_platform == "win32"',
                                         "triton-rocm (==3.8.0+rocm7.2)"]),
            ("triton-rocm", "3.8.0+rocm7.2", []))
    proc = dists(py, "torch-triton", "--expect", "Triton_ROCm==3.8.0+rocm7.2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "triton-rocm==3.8.0+rocm7.2"


def test_compare_names_every_changed_pinned_distribution(venv, tmp_path):
    py, install = venv
    install(("torch", "2.13.0+rocm7.2", ["pytorch-triton-rocm==3.8.0"]), ("pytorch-triton-rocm", "3.8.0", []),
            ("amdsmi", "26.0.0", []))
    assert dists(py, "snapshot", tmp_path / "before.json").returncode == 0
    install(("triton", "3.8.0", []), ("amd-aiter", "0.1.24", []))  # e.g. PyPI's CUDA triton pulled in
    proc = dists(py, "compare", tmp_path / "before.json", "--step", "s")
    assert proc.returncode == 1
    assert "installed triton 3.8.0" in proc.stderr and "installed amd-aiter" in proc.stderr
    proc = dists(py, "compare", tmp_path / "before.json", "--step", "s", "--allow", "amd-aiter")
    assert proc.returncode == 1 and "amd-aiter" not in proc.stderr


@pytest.mark.parametrize("script, args", [("pinned_dists.py", ["snapshot", "out.json"]),
                                          ("vllm_requirements.py", ["files", "."])])
def test_scripts_in_a_python_without_packaging_stop_naming_the_file(tmp_path, script, args):
    env = tmp_path / "bare"
    assert subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], capture_output=True).returncode == 0
    proc = subprocess.run([env / "bin/python", DOCKER / script, *args], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1 and "requirements-scripts.txt" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ------------------------------------------------------------------ AMD SMI

def test_amdsmi_check_needs_the_package_to_import(tmp_path):
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, DOCKER / "check_amdsmi.py"], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 1 and "import amdsmi failed" in proc.stderr and "install_amdsmi.sh" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    (tmp_path / "amdsmi").mkdir()
    (tmp_path / "amdsmi" / "__init__.py").write_text("")
    proc = subprocess.run([sys.executable, DOCKER / "check_amdsmi.py"], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr


def test_amdsmi_installed_in_the_torch_stage_and_checked():
    text = (ROOT / "Dockerfile.rocm_base").read_text()
    torch_stage = text[text.index("FROM base AS torch"):text.index("FROM torch AS aiter-wheel")]
    assert "install_amdsmi.sh" in torch_stage
    check_stage = text[text.index("FROM aiter-installed AS aiter-check"):text.index("FROM aiter-installed AS final")]
    assert "check_amdsmi.py" in check_stage
    script = (DOCKER / "install_amdsmi.sh").read_text()
    assert "share/amd_smi" in script and "check_amdsmi.py\"" in script


# ------------------------------------------------------------------ source stages

def repo_with(path: Path, files: dict) -> str:
    new_repo(path)
    git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=path)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return commit_all(path, "c")


def test_hipkittens_fetched_at_the_commit_aiter_names(tmp_path):
    hk = repo_with(tmp_path / "hk", {"include/kittens.hpp": "//\n"})
    aiter = tmp_path / "aiter"
    aiter.mkdir()
    (aiter / "aiter" / "jit").mkdir(parents=True)
    (aiter / "aiter/jit/core.py").write_text(
        f'x = {{\n    "url": "https://github.com/HazyResearch/HipKittens.git",\n    "commit": "{hk}",\n}}\n')
    env = base_env(AITER_TAG="v0", HIPKITTENS_REPOSITORY=(tmp_path / "hk").as_uri(), HIPKITTENS_COMMIT=hk,
                   GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="protocol.file.allow", GIT_CONFIG_VALUE_0="always")
    dest = tmp_path / "dest"
    proc = subprocess.run(["bash", DOCKER / "aiter_source.sh", "hipkittens", "clone", dest, aiter], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (dest / "include/kittens.hpp").is_file()
    proc = subprocess.run(["bash", DOCKER / "aiter_source.sh", "hipkittens", "verify", dest, aiter], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # a pin that is not what AITER names stops with one line naming the setting
    for pin in ("1" * 40, "none"):
        proc = subprocess.run(["bash", DOCKER / "aiter_source.sh", "hipkittens", "verify", dest, aiter],
                              env={**env, "HIPKITTENS_COMMIT": pin}, capture_output=True, text=True)
        assert proc.returncode == 1 and "hipkittens_commit" in proc.stderr, proc.stderr
    # an AITER that names no HipKittens: pin "none", nothing fetched, an empty directory
    (aiter / "aiter/jit/core.py").write_text("# no third-party clones\n")
    empty = tmp_path / "empty"
    for mode in ("clone", "verify"):
        proc = subprocess.run(["bash", DOCKER / "aiter_source.sh", "hipkittens", mode, empty, aiter],
                              env={**env, "HIPKITTENS_COMMIT": "none"}, capture_output=True, text=True)
        assert proc.returncode == 0 and "does not use HipKittens" in proc.stdout, proc.stderr
    assert list(empty.iterdir()) == []


def test_triton_kernels_fetched_at_the_pinned_commit(tmp_path):
    path = "python/triton_kernels/triton_kernels"
    commit = repo_with(tmp_path / "triton", {f"{path}/__init__.py": "", f"{path}/matmul.py": "x = 1\n",
                                             "README": "big tree\n"})
    env = base_env(TRITON_KERNELS_REPOSITORY=(tmp_path / "triton").as_uri(), TRITON_KERNELS_COMMIT=commit,
                   TRITON_KERNELS_PATH=path,
                   GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="protocol.file.allow", GIT_CONFIG_VALUE_0="always")
    dest = tmp_path / "dest"
    proc = subprocess.run(["bash", DOCKER / "vllm_source.sh", "triton-kernels", dest], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["__init__.py", "matmul.py"]
    proc = subprocess.run(["bash", DOCKER / "vllm_source.sh", "triton-kernels", tmp_path / "d2"],
                          env={**env, "TRITON_KERNELS_COMMIT": "2" * 40}, capture_output=True, text=True)
    assert proc.returncode == 1 and "the track's vllm.triton_kernels_commit" in proc.stderr
    proc = subprocess.run(["bash", DOCKER / "vllm_source.sh", "triton-kernels", tmp_path / "d3"],
                          env={**env, "TRITON_KERNELS_COMMIT": "UNRESOLVED"}, capture_output=True, text=True)
    assert proc.returncode == 1 and "triton_kernels_commit" in proc.stderr


# ------------------------------------------------------------------ pins as build args

def test_every_build_arg_a_script_needs_is_one_the_pin_tool_prints():
    """The pins the build scripts require (: "${NAME:?set the NAME build arg}") are build args
    python3 -m tools.pins args prints, and each is declared in a Dockerfile (with its default)."""
    from tools.pins import model

    needed = {m for p in DOCKER.iterdir() if p.suffix == ".sh"
              for m in re.findall(r'\$\{(\w+):\?set the \1 build arg', p.read_text())}
    pins = needed - {"GPU_ARCHS", "VLLM_VERSION", "SOURCE_DATE_EPOCH"}
    assert {"AITER_COMMIT", "CK_COMMIT", "VLLM_COMMIT", "TRITON_COMMIT", "THEROCK_LOCK"} <= pins
    assert pins <= set(model.build_args(model.load(ROOT / "versions.json"))), pins
    declared = {n for f in model.DOCKERFILES for n in model.global_arg_defaults((ROOT / f).read_text())}
    assert needed <= declared, needed - declared


@pytest.mark.parametrize("script,args,env,pin", [
    ("aiter_source.sh", ["clone", "DEST"],
     {"AITER_REPOSITORY": "/nonexistent/aiter.git", "AITER_TAG": "v1", "AITER_COMMIT": "UNRESOLVED",
      "CK_COMMIT": "c" * 40}, "aiter.pins.v1.commit"),
    ("vllm_source.sh", ["clone", "DEST"],
     {"VLLM_REPOSITORY": "/nonexistent/vllm.git", "VLLM_TAG": "v1", "VLLM_COMMIT": "UNRESOLVED"},
     "the vLLM commit (tag v1)"),
    ("build_triton.sh", ["DEST"],
     {"TRITON_REPOSITORY": "/nonexistent/triton.git", "TRITON_VERSION": "3.0", "TRITON_COMMIT": "UNRESOLVED"},
     "the Triton commit"),
])
def test_an_unresolved_pin_stops_the_step_in_one_line(tmp_path, script, args, env, pin):
    """An UNRESOLVED pin stops before anything is fetched, in one line naming it and the command that
    resolves it; ALLOW_UNRESOLVED=1 turns it into a warning (a development image)."""
    argv = ["bash", DOCKER / script, *[str(tmp_path / a) if a == "DEST" else a for a in args]]
    proc = subprocess.run(argv, env=base_env(**env), capture_output=True, text=True)
    assert proc.returncode == 1 and f"{pin} is UNRESOLVED in versions.json" in proc.stderr, proc.stderr
    assert "python3 -m tools.pins resolve" in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    proc = subprocess.run(argv, env=base_env(**env, ALLOW_UNRESOLVED="1"), capture_output=True, text=True)
    assert f"WARNING: {pin} is UNRESOLVED" in proc.stderr, proc.stderr
    assert "cannot clone" in proc.stderr  # it went on, to the (unreachable) repository


@pytest.mark.parametrize("unset", ["AITER_TAG", "AITER_COMMIT", "CK_COMMIT", "AITER_REPOSITORY"])
def test_a_missing_pin_build_arg_is_named(tmp_path, unset):
    env = {"AITER_REPOSITORY": "/nonexistent/aiter.git", "AITER_TAG": "v1", "AITER_COMMIT": "a" * 40,
           "CK_COMMIT": "c" * 40}
    del env[unset]
    proc = subprocess.run(["bash", DOCKER / "aiter_source.sh", "clone", tmp_path / "d"], env=base_env(**env),
                          capture_output=True, text=True)
    assert proc.returncode == 1 and f"set the {unset} build arg" in proc.stderr, proc.stderr
