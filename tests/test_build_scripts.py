"""The build scripts of ci/docker run here for real (no Docker): the shared helper lib.sh
(MAX_JOBS from CPUs and the cgroup memory limit, the CA bundle), the pinned-distribution guard
(pinned_dists.py), the source stages' HipKittens and triton_kernels fetches against local git
repositories, and the AMD SMI import check."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from build_script_env import install_script_requirements, wheelhouse
from git_repo import commit_all, git, new_repo
from test_vllm_source import stub_wheel

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "ci" / "docker"
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
    env = base_env(**cgroup, GPU_ARCHS="gfx942", VLLM_VERSION="0.32.0", AITER_PINS='{"tag":"v0"}',

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
    sha256 (python3 -m ci.pins lock, tests/test_locks.py holds the locks current); packaging is
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
    env = tmp_path / "venv"
    assert subprocess.run([sys.executable, "-m", "venv", env], capture_output=True).returncode == 0
    py = env / "bin/python"
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
    def pins(commit):
        return json.dumps({"tag": "v0", "hipkittens_repository": (tmp_path / "hk").as_uri(),
                           "hipkittens_commit": commit})
    env = base_env(AITER_PINS=pins(hk),
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
                              env={**env, "AITER_PINS": pins(pin)}, capture_output=True, text=True)
        assert proc.returncode == 1 and "hipkittens_commit" in proc.stderr, proc.stderr
    # an AITER that names no HipKittens: pin "none", nothing fetched, an empty directory
    (aiter / "aiter/jit/core.py").write_text("# no third-party clones\n")
    empty = tmp_path / "empty"
    for mode in ("clone", "verify"):
        proc = subprocess.run(["bash", DOCKER / "aiter_source.sh", "hipkittens", mode, empty, aiter],
                              env={**env, "AITER_PINS": pins("none")}, capture_output=True, text=True)
        assert proc.returncode == 0 and "does not use HipKittens" in proc.stdout, proc.stderr
    assert list(empty.iterdir()) == []


def test_triton_kernels_fetched_at_the_pinned_commit(tmp_path):
    path = "python/triton_kernels/triton_kernels"
    commit = repo_with(tmp_path / "triton", {f"{path}/__init__.py": "", f"{path}/matmul.py": "x = 1\n",
                                             "README": "big tree\n"})
    def pins(kernels_commit):
        return json.dumps({"tag": "v0", "commit": None, "repository": "https://example.invalid/vllm.git",
                           "triton_kernels": {"repository": (tmp_path / "triton").as_uri(), "commit": kernels_commit,
                                              "path": path}})
    env = base_env(VLLM_PINS=pins(commit),
                   GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="protocol.file.allow", GIT_CONFIG_VALUE_0="always")
    dest = tmp_path / "dest"
    proc = subprocess.run(["bash", DOCKER / "vllm_source.sh", "triton-kernels", dest], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["__init__.py", "matmul.py"]
    proc = subprocess.run(["bash", DOCKER / "vllm_source.sh", "triton-kernels", tmp_path / "d2"],
                          env={**env, "VLLM_PINS": pins("2" * 40)}, capture_output=True, text=True)
    assert proc.returncode == 1 and "the track's vllm.triton_kernels_commit" in proc.stderr
    proc = subprocess.run(["bash", DOCKER / "vllm_source.sh", "triton-kernels", tmp_path / "d3"],
                          env={**env, "VLLM_PINS": pins(None)}, capture_output=True, text=True)
    assert proc.returncode == 1 and "triton_kernels_commit" in proc.stderr


def load_pins(name, value):
    """lib.sh load_pins NAME as a step runs it, then the variables it set."""
    env = base_env(**({name: value} if value is not None else {}))
    shown = f'set | grep "^{name[:-5]}_" | grep -v "^{name}=" || true'
    return bash(f"source {DOCKER}/lib.sh && load_pins {name} && {shown}", env)


def test_a_components_pins_become_shell_variables():
    """pins.py: the keys' path in upper case joined by _, null -> UNRESOLVED, a list -> its items
    joined by spaces (the JSON args python3 -m ci.pins args prints)."""
    value = json.dumps({"tag": "v1", "commit": None, "triton_kernels": {"path": "python/triton_kernels"}})
    proc = load_pins("VLLM_PINS", value)
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.splitlines()) == {"VLLM_TAG=v1", "VLLM_COMMIT=UNRESOLVED",
                                             "VLLM_TRITON_KERNELS_PATH=python/triton_kernels"}
    proc = load_pins("AITER_PINS", json.dumps({"required_modules": ["a", "b"], "hipkittens_commit": "none",
                                               "requirements_lock_sha256": "none"}))
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.splitlines()) == {"AITER_REQUIRED_MODULES='a b'", "AITER_HIPKITTENS_COMMIT=none",
                                             "AITER_REQUIREMENTS_LOCK_SHA256=none"}
    # "none" stands for nothing but itself: no other word, and no commit where a sha256 belongs
    for bad in ("None", "a" * 40):
        proc = load_pins("AITER_PINS", json.dumps({"requirements_lock_sha256": bad}))
        assert proc.returncode == 1 and "AITER_REQUIREMENTS_LOCK_SHA256" in proc.stderr, proc.stderr


def _pins_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_pins", DOCKER / "pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_args_schema_is_what_the_pin_tool_writes():
    """pins.py's schema has exactly the keys ci.pins components() writes for every track, and its
    patterns are the versions file's (ci/pins/model.py)."""
    from ci.pins import model

    pins = _pins_module()
    data = model.load(ROOT / "versions.json")

    def keys(node):
        return {k: keys(v) if isinstance(v, dict) else None for k, v in node.items()}

    unused = {model.THEROCK_STACK: "PYTORCH_PINS", model.ROCM_IMAGE_STACK: "THEROCK_PINS"}
    for track in model.track_names(data):
        for arg, value in model.components(data, track_name_=track).items():
            # a component the track's stack does not build from is passed empty
            if unused[model.track_stack(data, track)] == arg:
                assert value == {}, (track, arg)
                continue
            assert keys(value) == keys(pins.SCHEMA[arg]), (track, arg)
            pins.flatten(value, arg[:-5])  # the real pins pass
    assert {k: p.pattern for k, p in pins.PATTERNS.items()} == {
        "commit": model.COMMIT_RE.pattern, "sha256": model.SHA256_RE.pattern, "name": model.NAME_RE.pattern,
        "repository": model.REPOSITORY_RE.pattern, "url": model.HTTPS_URL_RE.pattern}


HOSTILE = ["v1\nALLOW_UNRESOLVED=1", "--upload-pack=touch /tmp/x", "x y/$(z)", "a'b", "v1\n", " v1"]


def _leaf_paths(node, path=()):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaf_paths(value, (*path, key))
        else:
            yield (*path, key), value


def test_every_value_of_every_build_arg_refuses_hostile_strings():
    """For each arg and each of its keys (the real pins of the default track), a line break, a
    leading '-', a space, a quote or a trailing newline stops the step in one line naming the
    key; so do an unknown key (e.g. "locks" beside VLLM_PINS's keys) and an object where a value
    belongs."""
    import copy

    from ci.pins import model

    data = model.load(ROOT / "versions.json")
    # each arg as the first track that builds from it passes it (a track passes the component of a
    # stack it is not on empty)
    components: dict = {}
    for track in model.track_names(data):
        for arg, value in model.components(data, track_name_=track).items():
            components.setdefault(arg, value) if value else None
    assert set(components) == set(_pins_module().SCHEMA)
    for arg, value in components.items():
        for path, real in _leaf_paths(value):
            var = "_".join((arg[:-5], *(p.upper() for p in path)))
            for bad in ([*HOSTILE, {"nested": "x"}] if not isinstance(real, list) else [["a b"], ["-x"], "a"]):
                changed = copy.deepcopy(value)
                node = changed
                for p in path[:-1]:
                    node = node[p]
                node[path[-1]] = bad
                proc = load_pins(arg, json.dumps(changed))
                assert proc.returncode == 1 and var in proc.stderr, (arg, path, bad, proc.stderr)
                assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
        for extra in ({"locks": "x"}, {"torch": {"torch": "2.13.0", "torchcodec": "x"}}):
            proc = load_pins(arg, json.dumps({**value, **extra}))
            assert proc.returncode == 1 and "unknown key" in proc.stderr, (arg, extra, proc.stderr)
    proc = load_pins("AITER_PINS", "[" * 20000 + "]" * 20000)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "AITER_PINS" in proc.stderr, proc.stderr


@pytest.mark.parametrize("value,message", [
    (None, "the build arg AITER_PINS is not set: pass it"),
    ("{", "the build arg AITER_PINS is not JSON"),
    ("[1]", "the build arg AITER_PINS is not a JSON object"),
    ('{"Tag":"v1"}', "is not a lower-case name"),
    ('{"a":"x"}', "AITER_A: unknown key 'a'"),
    ('{"tag":true}', "AITER_TAG: a string or null is expected"),
])
def test_pins_that_are_no_json_object_stop_the_step_in_one_line(value, message):
    proc = load_pins("AITER_PINS", value)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and proc.stdout == ""
