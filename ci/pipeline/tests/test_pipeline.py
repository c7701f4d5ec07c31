"""The pipeline's scripts in their CPU form: publish.sh's image tags, build cache and
attestations (declared in docker-bake.hcl) through the real `docker buildx bake --print`, checked
against what versions.json says they are; publish.sh with a docker that records its argv, registry
login, the self-test summary table on a real self-test run."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.pins import model, render

REPO = Path(__file__).resolve().parents[3]
# The folder of this test environment's python3: the scripts' python3 has the runtime package there, as
# in the tools' environment that uv makes (uv run --locked --project tools puts its bin first on PATH).
TOOLS_BIN = str(Path(sys.executable).parent)
SHA = "0123456789abcdef0123456789abcdef01234567"
KNOWN_PIN = "v0.1.20.post1"  # the fully resolved AITER pin of versions.json


SYNC_DOCKERFILES = "from tools.pins import model; model.write_files(model.global_arg_updates(model.load())[1])"


def versions() -> dict:
    return json.loads((REPO / "versions.json").read_text())


def run(argv: list[str], cwd: Path = REPO, env: dict[str, str] | None = None,
        timeout: int = 120, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env if env is not None else dict(os.environ),
                          capture_output=True, text=True, timeout=timeout, **kw)


def pipeline(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "ci.pipeline", *args], cwd=cwd)


def copy_repo(dest: Path) -> Path:
    """The files the pin, tag and bake tools read, in a directory of their own."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("docker-bake.hcl", "docker-bake.pins.json", "versions.json", "versions.schema.json",
                 "Dockerfile.rocm_base", "Dockerfile.rocm"):
        shutil.copy(REPO / name, dest / name)
    for folder in ("ci", "docker", "tools"):
        shutil.copytree(REPO / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
    shutil.copytree(REPO / "runtime/src/rocm_vllm_runtime", dest / "runtime/src/rocm_vllm_runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))  # tools.pins reads numbers and URLs through it
    return dest


def fill_unresolved(node: object) -> None:
    """Give every unresolved pin a well-formed value (what `tools.pins resolve` would write)."""
    if isinstance(node, dict):
        for name in list(node.get("unresolved") or []):
            if "commit" in name:
                node[name] = "c" * 40
            elif name == "digest":
                node[name] = "sha256:" + "d" * 64
            elif name == "sha256" or name.endswith("_sha256"):  # an sdist's, a lock's
                node[name] = "e" * 64
            else:
                node[name] = f"resolved-{name}"
        if "unresolved" in node:
            node["unresolved"] = []
        for value in node.values():
            fill_unresolved(value)


def fake_lock(what: str) -> str:
    """A lock of the shape resolve writes (a pinned, hashed requirement): verify reads its body."""
    return f"# {what}\nexample-dist==1.0 \\\n    --hash=sha256:{'f' * 64}\n"


@pytest.fixture
def resolved_repo(tmp_path: Path) -> Path:
    root = copy_repo(tmp_path / "repo")
    data = json.loads((root / "versions.json").read_text())
    fill_unresolved(data)
    for own in data["tracks"].values():
        if own["vllm"].get("commit_prefix"):
            own["vllm"]["commit_prefix"] = own["vllm"]["commit"][:9]
    for track in model.therock_track_names(data):  # the TheRock lock resolve would write, and its sha256
        lock = fake_lock(f"the TheRock lock of track {track}, as resolve therock writes it")
        (root / model.LOCKS_DIR / model.therock_lock_name(track)).write_text(lock)
        data["tracks"][track]["therock"]["lock_sha256"] = hashlib.sha256(lock.encode()).hexdigest()
    for track in model.built_track_names(data):  # the PyTorch lock resolve wheels would write, and its sha256
        if model.pytorch_pins(data, track):
            lock = fake_lock("the PyTorch lock, as resolve wheels writes it")
            (root / model.LOCKS_DIR / model.pytorch_lock_name(data, track)).write_text(lock)
            model.section(data, "pytorch", track)["lock_sha256"] = hashlib.sha256(lock.encode()).hexdigest()
    for pin in data["aiter"]["pins"].values():  # the lock of AITER's requirements resolve aiter would write
        lock = fake_lock(f"the lock of AITER {pin['tag']}'s requirements, as resolve aiter writes it")
        (root / model.LOCKS_DIR / model.aiter_lock_name(pin["tag"])).write_text(lock)
        pin["requirements_lock_sha256"] = hashlib.sha256(lock.encode()).hexdigest()
    (root / "versions.json").write_text(model.canonical(data))
    # the Dockerfiles' global ARG defaults follow, as `tools.pins resolve --write` writes them
    sync = run([sys.executable, "-c", SYNC_DOCKERFILES], cwd=root)
    assert sync.returncode == 0, sync.stderr
    strict = run([sys.executable, "-m", "tools.pins", "verify", "--strict"], cwd=root)
    assert strict.returncode == 0, f"fixture could not resolve every pin: {strict.stderr}"
    return root


# ------------------------------------------------------------------ publish.sh

def _real_buildx() -> str:
    docker = shutil.which("docker")
    if docker is None or run([docker, "buildx", "version"]).returncode != 0:
        pytest.skip("docker buildx not found (bash ci/test-machine/docker-engine.sh start; "
                    "eval \"$(bash ci/test-machine/docker-engine.sh env)\")")
    if run([docker, "version", "--format", "{{.Server.Version}}"]).returncode != 0:
        pytest.skip("no Docker engine answers, which a buildx builder needs (bash ci/test-machine/docker-engine.sh "
                    "start; eval \"$(bash ci/test-machine/docker-engine.sh env)\")")
    return docker


def expected_graph(data: dict, track: str, aiter_commit: str, registry: str, sha: str, ref_name: str,
                   targets=("base", "serve", "ci")) -> dict[str, dict]:
    """What the pipeline pushes, from versions.json alone: per target its tags, cache refs, attestations."""
    version = data["tracks"][track]["vllm"]["version"]
    archs = "-".join(data["gpu_archs"])
    stack = model.track_stack(data, track)
    tag = f"vllm{version}-aiter{aiter_commit[:12]}-{sha[:12]}"
    floating = ref_name if track == data["default_track"] else f"{ref_name}-vllm{track}"
    out = {}
    for name in targets:
        key = f"base-{stack}-aiter{aiter_commit[:12]}-{archs}" if name == "base" else \
            f"{name}-vllm{version}-aiter{aiter_commit[:12]}-{archs}"
        ref = f"{registry}/buildcache:{key}"
        out[name] = {"tags": [f"{registry}/{name}:{tag}"] + ([f"{registry}/{name}:{floating}"] if ref_name else []),
                     "cache-from": [f"type=registry,ref={ref}"],
                     "cache-to": [f"type=registry,ref={ref},mode=max"],
                     "attest": ["type=sbom", "type=provenance,mode=max"]}
    return out


def pushed_settings(targets: dict) -> dict[str, dict]:
    return {name: {k: t.get(k) for k in ("tags", "cache-from", "cache-to", "attest")} for name, t in targets.items()}


def publish_print(tmp_path: Path, **settings: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    results = tmp_path / "results"
    # python3 with the runtime package first on PATH, as under uv run --locked --project tools
    env = {**os.environ, "PATH": f"{TOOLS_BIN}:{os.environ['PATH']}", "PUBLISH": "print",
           "REGISTRY": "registry.example/team", "GIT_SHA": SHA, "RESULTS_DIR": str(results), **settings}
    for name in ("DOCKER", "BUILDER", "CACHE_REPO", "GPU_ARCHS", "TAG", "PUSH", "ATTEST", "CACHE_FROM", "CACHE_TO"):
        if name not in settings:
            env.pop(name, None)
    return run(["bash", str(REPO / "ci/pipeline/amd-runner/publish.sh")], env=env, cwd=tmp_path), results


@pytest.mark.parametrize("track", model.built_track_names(versions()))
def test_publish_resolves_tags_cache_and_attestations_through_real_bake(tmp_path: Path, track: str) -> None:
    _real_buildx()
    data = versions()
    out = tmp_path / "github_output"
    # versions.json's other pins are unresolved: bake prints their graph under ALLOW_UNRESOLVED=1 only
    proc, results = publish_print(tmp_path, GIT_REF="refs/tags/v1.2.0", AITER_PIN=KNOWN_PIN, TRACK=track,
                                  GITHUB_OUTPUT=str(out), ALLOW_UNRESOLVED="1")
    assert proc.returncode == 0, proc.stderr
    targets = json.loads(proc.stdout)["target"]
    commit = data["aiter"]["pins"][KNOWN_PIN]["commit"]
    assert pushed_settings(targets) == expected_graph(data, track, commit, "registry.example/team", SHA, "v1.2.0")
    for target in targets.values():
        assert target["args"]["AITER_COMMIT"] == commit
        assert target["args"]["VLLM_VERSION"] == data["tracks"][track]["vllm"]["version"]
        assert target["output"] == ["type=image,rewrite-timestamp=true,push=true"]
        assert target["labels"]["org.opencontainers.image.revision"] == SHA
    tag = f"vllm{data['tracks'][track]['vllm']['version']}-aiter{commit[:12]}-{SHA[:12]}"
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag)  # a valid image tag
    assert out.read_text().splitlines() == [f"tag={tag}", "image-prefix=registry.example/team"]
    assert (results / "tag.env").read_text() == f"TAG={tag}\n"
    assert json.loads((results / "bake-print.json").read_text()) == json.loads(proc.stdout)


def test_publish_names_the_branch_as_a_tag_can_spell_it(tmp_path: Path) -> None:
    """A branch name becomes a tag (characters a tag cannot have: '-'); a ref that is neither a
    branch nor a git tag adds no floating tag; CACHE_REPO and GPU_ARCHS reach the cache refs."""
    _real_buildx()
    data = versions()
    commit = data["aiter"]["pins"][KNOWN_PIN]["commit"]
    proc, _ = publish_print(tmp_path, GIT_REF="refs/heads/.feature/Fix bug#2", AITER_PIN=KNOWN_PIN,
                            CACHE_REPO="cache.example/c/", GPU_ARCHS="gfx942", ALLOW_UNRESOLVED="1")
    assert proc.returncode == 0, proc.stderr
    serve = json.loads(proc.stdout)["target"]["serve"]
    version = data["tracks"][data["default_track"]]["vllm"]["version"]
    assert serve["tags"][1] == "registry.example/team/serve:branch-feature-Fix-bug-2"  # a branch's namespace
    key = f"serve-vllm{version}-aiter{commit[:12]}-gfx942"
    assert serve["cache-from"] == [f"type=registry,ref=cache.example/c:{key}"]
    assert serve["args"]["GPU_ARCHS"] == "gfx942"
    proc, _ = publish_print(tmp_path, GIT_REF="refs/pull/7/merge", AITER_PIN=KNOWN_PIN, TRACK="", GPU_ARCHS="",
                            ALLOW_UNRESOLVED="1")
    assert proc.returncode == 0, proc.stderr
    for name, target in json.loads(proc.stdout)["target"].items():
        assert target["tags"] == [f"registry.example/team/{name}:vllm{version}-aiter{commit[:12]}-{SHA[:12]}"]
        assert target["args"]["GPU_ARCHS"] == ";".join(data["gpu_archs"])  # empty: the versions file's


def _bake_graph(path: Path, tmp_path: Path, **env: str) -> dict:
    """bake --print as publish.sh runs it (PUSH=1), on the pins file of another versions file."""
    docker = _real_buildx()
    root = tmp_path / f"repo-{path.stem}"
    root.mkdir(exist_ok=True)
    shutil.copy(REPO / "docker-bake.hcl", root / "docker-bake.hcl")
    shutil.copy(path, root / "versions.json")
    (root / "docker-bake.pins.json").write_text(render.bake_text(model.load(path)))
    full = {**os.environ, "PUSH": "1", "REGISTRY": "registry.example/team", "TAG": "main", "VCS_REF": SHA,
            "AITER_PIN": KNOWN_PIN, "ALLOW_UNRESOLVED": "1", **env}  # the file's other pins are unresolved
    for name in ("CACHE_REPO", "GPU_ARCHS", "TRACK", "ATTEST", "CACHE_FROM", "CACHE_TO"):
        if name not in env:
            full.pop(name, None)
    proc = run([docker, "buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json", "--print",
                "base", "serve", "ci"], cwd=root, env=full)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["target"]


def test_vllm_bump_keeps_the_base_cache_ref_and_an_aiter_bump_does_not(tmp_path: Path) -> None:
    """The base image's cache ref (AITER layers) does not depend on the vLLM pin."""
    data = versions()
    before = _bake_graph(REPO / "versions.json", tmp_path)
    bumped = json.loads(json.dumps(data))
    own = bumped["tracks"][bumped["default_track"]]["vllm"]
    own["version"] = own["version"].rsplit(".", 1)[0] + ".99"
    (tmp_path / "vllm.json").write_text(json.dumps(bumped))
    after = _bake_graph(tmp_path / "vllm.json", tmp_path)
    assert after["base"]["cache-from"] == before["base"]["cache-from"]
    assert after["base"]["cache-to"] == before["base"]["cache-to"]
    for target in ("serve", "ci"):
        assert after[target]["cache-from"] != before[target]["cache-from"]
        assert f"vllm{own['version']}" in after[target]["cache-from"][0]
    assert after["base"]["tags"] != before["base"]["tags"]  # the tag names the vLLM version

    aiter = json.loads(json.dumps(data))
    aiter["aiter"]["pins"][KNOWN_PIN]["commit"] = "f" * 40
    (tmp_path / "aiter.json").write_text(json.dumps(aiter))
    changed = _bake_graph(tmp_path / "aiter.json", tmp_path)
    stack = model.track_stack(data, data["default_track"])
    archs = "-".join(data["gpu_archs"])
    assert changed["base"]["cache-from"] == [
        f"type=registry,ref=registry.example/team/buildcache:base-{stack}-aiter{'f' * 12}-{archs}"]
    # the ROCm stack is under the AITER layers: the same AITER commit on another stack, another cache ref
    other = json.loads(json.dumps(aiter))
    own_track = other["tracks"][other["default_track"]]
    own_track["stack"] = "rocm-image" if stack != "rocm-image" else "therock"
    (tmp_path / "stack.json").write_text(json.dumps(other))
    assert _bake_graph(tmp_path / "stack.json", tmp_path)["base"]["cache-from"] != changed["base"]["cache-from"]
    # the GPU archs are compiled into the AITER layers: another arch list, another cache ref
    assert _bake_graph(REPO / "versions.json", tmp_path, GPU_ARCHS="gfx942")["base"]["cache-from"] \
        != before["base"]["cache-from"]


@pytest.mark.parametrize("registry,says", [
    ("localhost/rocm-vllm", "error: REGISTRY 'localhost/rocm-vllm' is not a registry to push to: "
                            "set REGISTRY (e.g. ghcr.io/org/rocm-vllm)"),
    ("ghcr.io/Org/rocm-vllm", "error: REGISTRY 'ghcr.io/Org/rocm-vllm' has upper-case letters, which image names "
                              "cannot have: set REGISTRY in lower case")])
def test_publish_refuses_a_registry_it_cannot_push_to(fake_docker, tmp_path: Path, registry: str, says: str) -> None:
    env = {**fake_docker.env, "REGISTRY": registry, "GIT_SHA": SHA, "RESULTS_DIR": str(tmp_path / "results")}
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/publish.sh")], env=env, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [says]
    assert fake_docker.calls() == []


def test_publish_refuses_a_short_commit_id(fake_docker, tmp_path: Path) -> None:
    env = {**fake_docker.env, "REGISTRY": "ghcr.io/team/rocm-vllm", "GIT_SHA": "abc123",
           "RESULTS_DIR": str(tmp_path / "results")}
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/publish.sh")], env=env, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: GIT_SHA 'abc123' is not a full 40-hex commit id: set GIT_SHA to the commit being built"]
    assert fake_docker.calls() == []


FAKE_DOCKER = """#!/usr/bin/env python3
import json, os, sys
argv = sys.argv[1:]
names = ("PUSH", "REGISTRY", "TAG", "VCS_REF", "BUILDX_BUILDER", "REGISTRY_PASSWORD")
record = {"argv": argv, "env": {k: os.environ.get(k) for k in names}}
if argv[:1] == ["login"]:
    record["stdin"] = sys.stdin.read()
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
if argv[:2] == ["buildx", "bake"] and "--print" in argv:
    # resolving the graph changes nothing: the real bake does it
    os.execv(os.environ["REAL_DOCKER"], ["docker", *argv])
if argv[:2] == ["buildx", "inspect"]:
    if os.environ.get("FAKE_INSPECT_RC", "0") == "0":
        print("Name: " + (argv[2] if len(argv) > 2 else "default"))
        print("Driver: " + os.environ.get("FAKE_DRIVER", "docker-container"))
    sys.exit(int(os.environ.get("FAKE_INSPECT_RC", "0")))
if argv[:1] == ["login"]:
    print("Login Succeeded")
if argv[:2] == ["buildx", "bake"] and "--metadata-file" in argv:
    # the build pushed each target by digest: bake's metadata file says which
    targets = [a for a in argv[argv.index("--metadata-file") + 2:] if not a.startswith("-")]
    digests = {t: {"containerimage.digest": "sha256:" + format(i + 1, "064x")} for i, t in enumerate(targets)}
    open(argv[argv.index("--metadata-file") + 1], "w").write(json.dumps(digests))
if argv[:3] == ["buildx", "imagetools", "inspect"]:
    # FAKE_TAGS: the registry's tags ({tag: digest}); FAKE_INSPECT_STDERR: what docker also says
    sys.stderr.write(os.environ.get("FAKE_INSPECT_STDERR", ""))
    tags = json.loads(os.environ.get("FAKE_TAGS", "{}"))
    if argv[-1] not in tags:
        sys.exit("ERROR: " + argv[-1] + ": not found")
    print(os.environ.get("FAKE_INSPECT_STDOUT") or json.dumps(
        {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": tags[argv[-1]], "size": 1}))
"""


@pytest.fixture
def fake_docker(tmp_path: Path):
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    log = tmp_path / "docker.jsonl"

    class Fake:
        # python3 is this test environment's, as under uv it is the pin tool's (with the runtime package)
        env = {"PATH": f"{bin_dir}:{TOOLS_BIN}:{os.environ['PATH']}", "HOME": str(tmp_path),
               "FAKE_DOCKER_LOG": str(log), "REAL_DOCKER": shutil.which("docker") or "/nonexistent/docker",
               **{k: os.environ[k] for k in ("DOCKER_CONFIG", "DOCKER_HOST") if k in os.environ}}

        @staticmethod
        def calls() -> list[dict]:
            return [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []

    return Fake


def test_publish_pushes_with_a_docker_container_builder(resolved_repo: Path, fake_docker, tmp_path: Path) -> None:
    """Pushed by digest, then tagged. The branch is named v1.0, as a release is: its tag is branch-v1.0
    (moved from its earlier digest), and the release tag v1.0, on another digest, is not touched."""
    _real_buildx()
    results = tmp_path / "results"
    earlier = {f"ghcr.io/team/rocm-vllm/{name}:{t}": OTHER for name in ("base", "serve", "ci")
               for t in ("v1.0", "branch-v1.0")}
    env = {**fake_docker.env, "REGISTRY": "ghcr.io/team/rocm-vllm/", "GIT_SHA": SHA, "GIT_REF": "refs/heads/v1.0",
           "BUILDER": "rocm-vllm", "RESULTS_DIR": str(results), "FAKE_INSPECT_RC": "1", "TRACK": "",
           "FAKE_TAGS": json.dumps(earlier)}
    proc = run(["bash", str(resolved_repo / "ci/pipeline/amd-runner/publish.sh")], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(f"from {OTHER} to sha256:") == 3 and ":branch-v1.0 from" in proc.stderr, proc.stderr
    assert not [c for c in fake_docker.calls() if c["argv"][-1].endswith(":v1.0")]
    data = json.loads((resolved_repo / "versions.json").read_text())
    default = data["tracks"][data["default_track"]]
    commit = data["aiter"]["pins"][default["aiter"]]["commit"]
    tag = f"vllm{default['vllm']['version']}-aiter{commit[:12]}-{SHA[:12]}"
    calls = fake_docker.calls()
    graph = json.loads((results / "bake-print.json").read_text())["target"]
    # pushed by digest only, each with the output the graph declares; then every tag checked and set
    by_digest = [f"--set={name}.output={','.join(graph[name]['output'])},push-by-digest=true,name-canonical=true"
                 for name in sorted(graph)]
    tags = [(name, t) for name in sorted(graph) for t in graph[name]["tags"]]
    digest = {name: "sha256:" + format(i + 1, "064x") for i, name in enumerate(("base", "serve", "ci"))}
    assert [c["argv"] for c in calls] == [
        ["buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json", "--print", "base", "serve", "ci"],
        ["buildx", "inspect", "rocm-vllm"],
        ["buildx", "create", "--name", "rocm-vllm", "--driver", "docker-container"],
        ["buildx", "inspect", "rocm-vllm"],  # its driver: docker-container pushes by digest
        ["buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json",
         "--metadata-file", str(results / "bake-metadata.json"), *by_digest, "base", "serve", "ci"],
        *[["buildx", "imagetools", "inspect", "--format", "{{json .Manifest}}", t] for _, t in tags],
        *[["buildx", "imagetools", "create", "--tag", t, f"{t.rsplit(':', 1)[0]}@{digest[name]}"] for name, t in tags],
    ]
    # real bake takes the build's argv: each output pushed by digest, the graph otherwise unchanged
    settings = {**os.environ, **{k: v for k, v in calls[4]["env"].items() if v is not None}}
    real = run([shutil.which("docker"), *calls[4]["argv"][:calls[4]["argv"].index("--metadata-file")], "--print",
                *by_digest, "base", "serve", "ci"], cwd=resolved_repo, env=settings)
    assert real.returncode == 0, real.stderr
    resolved = json.loads(real.stdout)["target"]
    for name in graph:
        assert resolved[name]["output"] == [f"{graph[name]['output'][0]},push-by-digest=true,name-canonical=true"]
        assert {k: v for k, v in resolved[name].items() if k != "output"} == \
            {k: v for k, v in graph[name].items() if k != "output"}, name
    assert calls[4]["env"] == {"PUSH": "1", "REGISTRY": "ghcr.io/team/rocm-vllm", "TAG": "branch-v1.0", "VCS_REF": SHA,
                               "BUILDX_BUILDER": "rocm-vllm", "REGISTRY_PASSWORD": None}
    graph = json.loads((results / "bake-print.json").read_text())["target"]
    assert pushed_settings(graph) == expected_graph(data, data["default_track"], commit, "ghcr.io/team/rocm-vllm",
                                                    SHA, "branch-v1.0")
    assert (results / "tag.env").read_text() == f"TAG={tag}\n"

    # an existing builder is used as it is
    (tmp_path / "docker.jsonl").unlink()
    proc = run(["bash", str(resolved_repo / "ci/pipeline/amd-runner/publish.sh"), "base"],
               env={**env, "FAKE_INSPECT_RC": "0"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [c["argv"][:2] for c in fake_docker.calls()] == [["buildx", "bake"], ["buildx", "inspect"],
                                                            ["buildx", "inspect"],
                                                            ["buildx", "bake"], ["buildx", "imagetools"],
                                                            ["buildx", "imagetools"], ["buildx", "imagetools"],
                                                            ["buildx", "imagetools"]]
    assert fake_docker.calls()[3]["argv"][-1] == "base"


def test_publish_with_the_engines_own_builder_pushes_under_a_scratch_tag(resolved_repo: Path, fake_docker,
                                                                        tmp_path: Path) -> None:
    """The docker driver cannot push by digest: each image goes under <name>:unpublished-<commit tag>,
    then tag.sh sets the graph's tags on the pushed digest."""
    _real_buildx()
    results = tmp_path / "results"
    env = {**fake_docker.env, "REGISTRY": "ghcr.io/team/rocm-vllm", "GIT_SHA": SHA, "GIT_REF": "refs/tags/v1.0",
           "RESULTS_DIR": str(results), "FAKE_DRIVER": "docker", "TRACK": ""}
    proc = run(["bash", str(resolved_repo / "ci/pipeline/amd-runner/publish.sh"), "serve"], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    tag = (results / "tag.env").read_text().strip().removeprefix("TAG=")
    calls = [c["argv"] for c in fake_docker.calls()]
    assert calls[1] == ["buildx", "inspect"]
    assert calls[2][-2:] == [f"--set=serve.tags=ghcr.io/team/rocm-vllm/serve:unpublished-{tag}", "serve"], calls[2]
    created = [c[-3:] for c in calls if c[:3] == ["buildx", "imagetools", "create"]]
    digest = "sha256:" + format(1, "064x")
    assert created == [["--tag", f"ghcr.io/team/rocm-vllm/serve:{t}", f"ghcr.io/team/rocm-vllm/serve@{digest}"]
                       for t in (tag, "v1.0")], created


def test_a_git_tag_in_the_branch_namespace_is_refused(fake_docker, tmp_path: Path) -> None:
    env = {**fake_docker.env, "REGISTRY": "ghcr.io/team/rocm-vllm", "GIT_SHA": SHA, "GIT_REF": "refs/tags/branch-main",
           "RESULTS_DIR": str(tmp_path / "results")}
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/publish.sh")], env=env, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "error: the git tag branch-main would tag the images branch-main, in the namespace of branch tags "
        "(branch-<branch>, moved by every push to that branch): name the release without the branch- prefix"]
    assert fake_docker.calls() == []


def test_builder_commands_are_accepted_by_real_buildx(tmp_path: Path) -> None:
    """The builder argv publish.sh runs, through the real buildx client (a private client
    config: the builder is recorded there and never started)."""
    docker = _real_buildx()
    plugins = [Path(os.environ[v]) / "cli-plugins" for v in ("DOCKER_CONFIG",) if os.environ.get(v)]
    plugins += [Path.home() / ".docker" / "cli-plugins"]
    config = tmp_path / "config"
    config.mkdir()
    source = next((p for p in plugins if (p / "docker-buildx").exists()), None)
    if source is not None:
        (config / "cli-plugins").symlink_to(source)
    env = {**os.environ, "DOCKER_CONFIG": str(config)}
    env.pop("BUILDX_BUILDER", None)
    assert run([docker, "buildx", "version"], env=env).returncode == 0
    missing = run([docker, "buildx", "inspect", "rocm-vllm"], env=env)
    assert missing.returncode != 0 and "rocm-vllm" in missing.stderr, missing.stderr
    create = run([docker, "buildx", "create", "--name", "rocm-vllm", "--driver", "docker-container"], env=env)
    assert create.returncode == 0, create.stderr
    found = run([docker, "buildx", "inspect", "rocm-vllm"], env=env)
    assert found.returncode == 0 and "docker-container" in found.stdout, found.stdout + found.stderr
    run([docker, "buildx", "rm", "rocm-vllm"], env=env)


# ------------------------------------------------------------------ tag.sh on its own

PUSHED, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64
IMAGE = "ghcr.io/team/rocm-vllm/serve"


def tag_sh(fake_docker, tmp_path: Path, tags: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """tag.sh on a graph of one target (serve, with these tags) pushed as PUSHED."""
    graph = {"group": {"default": {"targets": ["serve"]}}, "target": {"serve": {"tags": tags}}}
    (tmp_path / "graph.json").write_text(json.dumps(graph))
    (tmp_path / "metadata.json").write_text(json.dumps({"serve": {"containerimage.digest": PUSHED}}))
    return run(["bash", str(REPO / "ci/pipeline/amd-runner/tag.sh"), str(tmp_path / "graph.json"),
                str(tmp_path / "metadata.json")], env={**fake_docker.env, **env}, cwd=tmp_path)


def created(fake_docker) -> list[str]:
    return [c["argv"][4] for c in fake_docker.calls() if c["argv"][:3] == ["buildx", "imagetools", "create"]]


def test_tag_reads_the_registrys_answer_apart_from_dockers_messages(fake_docker, tmp_path: Path) -> None:
    """docker's stderr (a warning, a registry's JSON error body) is never read as the manifest's JSON:
    the tag that already points to the pushed digest is kept, the other refused naming both digests."""
    noise = 'WARNING: a buildx warning\n{"errors": [{"code": "DENIED"}]}\n'
    proc = tag_sh(fake_docker, tmp_path, [f"{IMAGE}:c1"], FAKE_TAGS=json.dumps({f"{IMAGE}:c1": PUSHED}),
                  FAKE_INSPECT_STDERR=noise)
    assert proc.returncode == 0 and created(fake_docker) == [f"{IMAGE}:c1"], proc.stderr
    proc = tag_sh(fake_docker, tmp_path, [f"{IMAGE}:c1"], FAKE_TAGS=json.dumps({f"{IMAGE}:c1": OTHER}),
                  FAKE_INSPECT_STDERR=noise)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: {IMAGE}:c1 points to {OTHER}, not {PUSHED}: nothing tagged; set PUBLISH_FORCE=1 to move them"]


@pytest.mark.parametrize("answer", ["not json", '{"digest": ' + "1" * 5000 + "}"])
def test_tag_refuses_an_answer_that_is_no_manifest_in_one_line(answer, fake_docker, tmp_path: Path) -> None:
    proc = tag_sh(fake_docker, tmp_path, [f"{IMAGE}:c1"], FAKE_TAGS=json.dumps({f"{IMAGE}:c1": OTHER}),
                  FAKE_INSPECT_STDOUT=answer)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"error: cannot read tag {IMAGE}:c1 "), \
        proc.stderr
    assert created(fake_docker) == []


@pytest.mark.parametrize("movable", ["v1.0", "main", "branch-"])
def test_tag_moves_only_a_branchs_tag_without_force(movable, fake_docker, tmp_path: Path) -> None:
    """MOVABLE_TAGS that names a release's tag (or anything outside branch-<name>) is refused: the
    release tag v1.0 on another digest stays where it is."""
    proc = tag_sh(fake_docker, tmp_path, [f"{IMAGE}:c1", f"{IMAGE}:{movable}"], MOVABLE_TAGS=movable,
                  FAKE_TAGS=json.dumps({f"{IMAGE}:{movable}": OTHER}))
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: MOVABLE_TAGS names {movable}, which is no branch's tag (branch-<name>): only a branch's tag moves "
        "without PUBLISH_FORCE=1"]
    assert created(fake_docker) == []


def test_publish_refuses_unresolved_pins_before_building(resolved_repo: Path, fake_docker, tmp_path: Path) -> None:
    data = json.loads((resolved_repo / "versions.json").read_text())
    own = data["tracks"][data["default_track"]]["vllm"]
    own["commit"] = None
    own["unresolved"] = ["commit"]
    (resolved_repo / "versions.json").write_text(model.canonical(data))
    env = {**fake_docker.env, "REGISTRY": "ghcr.io/team/rocm-vllm", "GIT_SHA": SHA,
           "RESULTS_DIR": str(tmp_path / "results")}
    proc = run(["bash", str(resolved_repo / "ci/pipeline/amd-runner/publish.sh")], env=env, cwd=tmp_path)
    assert proc.returncode != 0
    assert f"tracks.{data['default_track']}.vllm.commit" in proc.stderr
    assert fake_docker.calls() == []


def test_publish_needs_a_registry(fake_docker, tmp_path: Path) -> None:
    env = {**fake_docker.env, "GIT_SHA": SHA, "RESULTS_DIR": str(tmp_path / "results")}
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/publish.sh")], env=env, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: REGISTRY is not set: set REGISTRY to the repository prefix to push to (e.g. ghcr.io/org/rocm-vllm)"]
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/publish.sh")], env={**env, "PUBLISH": "upload"},
               cwd=tmp_path)
    assert proc.returncode == 1 and "PUBLISH" in proc.stderr
    assert fake_docker.calls() == []


# ------------------------------------------------------------------ login.sh

SECRET = "s3cr3t-t0ken-value"


def test_login_hands_the_password_on_stdin_and_never_prints_it(fake_docker, tmp_path: Path) -> None:
    env = {**fake_docker.env, "REGISTRY": "ghcr.io/team/rocm-vllm", "REGISTRY_USERNAME": "bot",
           "REGISTRY_PASSWORD": SECRET}
    command = ["sh", "-c", 'echo "password in command env: ${REGISTRY_PASSWORD:-none}"; exit 3']
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/login.sh"), *command], env=env, cwd=REPO)
    assert proc.returncode == 3  # the command's status
    assert "password in command env: none" in proc.stdout
    assert SECRET not in proc.stdout + proc.stderr
    calls = fake_docker.calls()
    assert [c["argv"] for c in calls] == [["login", "--username", "bot", "--password-stdin", "ghcr.io"],
                                          ["logout", "ghcr.io"]]
    assert calls[0]["stdin"] == SECRET
    assert all(c["env"]["REGISTRY_PASSWORD"] is None for c in calls)


def test_login_host_and_settings(fake_docker, tmp_path: Path) -> None:
    base = {**fake_docker.env, "REGISTRY_USERNAME": "bot", "REGISTRY_PASSWORD": SECRET}
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/login.sh"), "true"],
               env={**base, "REGISTRY": "team/rocm-vllm"})
    assert proc.returncode == 0, proc.stderr
    assert fake_docker.calls()[0]["argv"][-1] == "docker.io"
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/login.sh"), "true"],
               env={**base, "REGISTRY": "registry.example:5000/x", "REGISTRY_HOST": "other.example"})
    assert fake_docker.calls()[2]["argv"][-1] == "other.example"
    n = len(fake_docker.calls())
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/login.sh"), "true"],
               env={**fake_docker.env, "REGISTRY": "ghcr.io/t/r", "REGISTRY_PASSWORD": SECRET})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: REGISTRY_PASSWORD is set but REGISTRY_USERNAME is not: set REGISTRY_USERNAME"]
    proc = run(["bash", str(REPO / "ci/pipeline/amd-runner/login.sh"), "echo", "ran"],
               env={**fake_docker.env, "REGISTRY": "ghcr.io/t/r"})
    assert proc.returncode == 0 and proc.stdout == "ran\n" and "existing credentials for ghcr.io" in proc.stderr
    assert len(fake_docker.calls()) == n


def test_login_argv_is_accepted_by_the_real_docker_client(tmp_path: Path) -> None:
    """The same `docker login` argv, against a port nothing listens on: the real client takes
    every flag and fails only at the connection."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client in PATH (bash ci/test-machine/docker-engine.sh start installs one)")
    env = {**os.environ, "DOCKER_CONFIG": str(tmp_path / "config")}
    proc = run([docker, "login", "--username", "bot", "--password-stdin", "127.0.0.1:9"], env=env,
               input=SECRET, timeout=60)
    assert proc.returncode != 0
    assert "unknown flag" not in proc.stderr and "127.0.0.1:9" in proc.stderr, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr


# ------------------------------------------------------------------ summary table

SELECTOR_SUITE = """
def test_rule_one():
    pass

def test_rule_two():
    pass
"""

SMOKE_SUITE = """
import os

def test_kernels():
    pass

def test_serves_tiny_model():
    print("backends selected: ['ROCM_AITER_MLA']; usage: {'completion_tokens': 8}")
    assert os.environ.get("SMOKE_FAIL") != "1", "expected ROCM_AITER_MLA only, log shows ['TRITON_MLA']"
"""

BENCH_SUITE = """
import json, os
from pathlib import Path

import pytest
from rocm_vllm_runtime.selection import selection

# name: (seconds the 8 requests took, lines the server logged)
RUNS = __RUNS__

def test_serving_benchmark():
    if os.environ.get("BENCH_SKIP") == "1":
        pytest.skip("no /dev/kfd: no AMD GPU in this container")
    out = Path(os.environ["SELFTEST_RESULTS_DIR"])
    runs = {}
    for name, (seconds, line) in RUNS.items():
        log = "INFO starting\\n" + line + "\\nINFO ready\\n"
        (out / f"server-{name}.log").write_text(log)
        selected = selection(log)  # as the benchmark records what its server selected
        # as vLLM's bench serve reports 8 requests of 1024 input and 128 output tokens
        runs[name] = {"metrics": {"completed": 8, "failed": 0, "duration": seconds,
                                  "total_token_throughput": 8 * (1024 + 128) / seconds},
                      "selected": {"attention_backends": list(selected.attention_backends),
                                   "implementation": selected.implementation},
                      "errors": [], "server_log": f"/results/server-{name}.log"}
    (out / "bench.json").write_text(json.dumps({"runs": runs}))
"""

BENCH_RUNS = {
    "plugin": (10.0, "INFO [cuda.py:1] Using ROCM_AITER_MLA backend out of potential backends: "
                     "['ROCM_AITER_MLA', 'TRITON_MLA']\nINFO [backend.py:144] ROCM_AITER_MLA (vllm-aiter-mla 0.1.0): "
                     "decode=aiter mla_decode_fwd persistent, 16 heads per GPU run as 16"),
    "vllm-aiter": (12.5, "INFO [cuda.py:1] Using ROCM_AITER_MLA backend out of potential backends: "
                         "['ROCM_AITER_MLA', 'TRITON_MLA']"),
    "triton": (13.0, "INFO [cuda.py:1] Using TRITON_MLA backend (selected via --attention-backend)."),
}


_SELFTEST_RUNS: dict[tuple[tuple[str, str], ...], tuple[Path, subprocess.CompletedProcess[str]]] = {}


def run_selftest(tmp_path: Path, **env: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The results folder of a self-test run with these settings, a copy of its own for each test (the
    tests change what they read); one run per distinct setting serves every test that asks for it."""
    key = tuple(sorted(env.items()))
    if key not in _SELFTEST_RUNS:
        _SELFTEST_RUNS[key] = _run_selftest(tmp_path / "run", **env)
    results, proc = _SELFTEST_RUNS[key]
    return Path(shutil.copytree(results, tmp_path / "results")), proc


def _run_selftest(tmp_path: Path, **env: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The real self-test CLI (report.to_json, JUnit merge) on small suites, as selftest.sh runs it."""
    tmp_path.mkdir()
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "test_selector.py").write_text(SELECTOR_SUITE)
    (suites / "test_smoke.py").write_text(SMOKE_SUITE)
    (suites / "test_bench.py").write_text(BENCH_SUITE.replace("__RUNS__", repr(BENCH_RUNS)))
    results = tmp_path / "results"
    results.mkdir()
    full_env = {**os.environ, "SELFTEST_SUITES": str(suites),
                "SELFTEST_RESULTS_DIR": str(results), **env}
    # the pytest option the workflow passes (PYTEST_ADDOPTS, forwarded by selftest.sh)
    full_env["PYTEST_ADDOPTS"] = "-o junit_logging=system-out"
    proc = run([sys.executable, "-m", "rocm_vllm_runtime", "all", "--json", str(results / "selftest.json"),
                "--junit", str(results / "selftest.xml")], env=full_env, cwd=tmp_path, timeout=300)
    return results, proc


def table_rows(markdown: str) -> dict[str, list[str]]:
    rows = [l for l in markdown.splitlines() if l.startswith("| ") and not l.startswith("| suite ")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in r.strip("|").split("|")] for r in rows)}


def test_summary_of_a_passing_run(tmp_path: Path) -> None:
    results, proc = run_selftest(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = pipeline("summary", str(results), "--title", "Self-test of img")
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.startswith("### Self-test of img: PASSED (exit 0)\n")
    rows = table_rows(summary.stdout)
    assert list(rows) == ["selector", "smoke", "bench"]
    assert rows["selector"] == ["passed", "2 passed", "—", "—"]
    assert rows["smoke"] == ["passed", "2 passed", "ROCM_AITER_MLA", "—"]
    # same tokens in each run: the throughput ratio is the inverse ratio of the durations
    plugin, vllm_aiter, triton = (BENCH_RUNS[n][0] for n in ("plugin", "vllm-aiter", "triton"))
    assert rows["bench"] == [
        "passed", "1 passed",
        "plugin: ROCM_AITER_MLA (vllm-aiter-mla) · vllm-aiter: ROCM_AITER_MLA (vllm) · triton: TRITON_MLA (vllm)",
        f"plugin {triton / plugin:.2f}x · vllm-aiter {triton / vllm_aiter:.2f}x"]
    assert rows["bench"][3] == "plugin 1.30x · vllm-aiter 1.04x"


def test_summary_of_a_failed_and_a_not_run_suite(tmp_path: Path) -> None:
    results, proc = run_selftest(tmp_path, SMOKE_FAIL="1", BENCH_SKIP="1")
    assert proc.returncode == 1
    summary = pipeline("summary", str(results))
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.startswith("### Self-test: FAILED (exit 1)\n")
    rows = table_rows(summary.stdout)
    assert rows["smoke"][:2] == ["failed", "1 failed, 1 passed"]
    assert rows["smoke"][2] == "ROCM_AITER_MLA"  # what the suite printed before its check failed
    assert rows["bench"] == ["not run", "1 skipped", "—", "—"]
    notes = [l for l in summary.stdout.splitlines() if l.startswith("- **")]
    assert len(notes) == 2
    assert notes[0].startswith("- **smoke**: 1 check(s) failed: ") and "test_serves_tiny_model" in notes[0]
    assert notes[1].startswith("- **bench**: could not run: ") and "no /dev/kfd" in notes[1]


def test_summary_names_a_run_without_a_recorded_selection(tmp_path: Path) -> None:
    results, proc = run_selftest(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = json.loads((results / "selftest.json").read_text())  # the report carries bench.json
    del report["bench"]["runs"]["triton"]["selected"]
    (results / "selftest.json").write_text(json.dumps(report))
    rows = table_rows(pipeline("summary", str(results)).stdout)
    assert rows["bench"][2].endswith("triton: (not recorded)")


def test_summary_without_a_report_fails_in_one_line(tmp_path: Path) -> None:
    proc = pipeline("summary", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'selftest.json'} not found: the self-test did not write its report "
        "(see selftest.log; set RESULTS_DIR to the self-test's results directory)"]


def _report_with(results: Path, mutate) -> None:
    report = json.loads((results / "selftest.json").read_text())
    mutate(report)
    (results / "selftest.json").write_text(json.dumps(report))


@pytest.mark.parametrize("value,says", [
    (float("nan"), "Triton: total_token_throughput is nan"), (float("inf"), "Triton: total_token_throughput is inf"),
    (-5.0, "Triton: total_token_throughput is negative"), (0, "Triton: total_token_throughput is 0 tok/s"),
    ("fast", "Triton: total_token_throughput 'fast' is not a number"), (None, "Triton: total_token_throughput None"),
    (True, "is not a number")])
def test_summary_names_what_is_wrong_with_a_metric(tmp_path: Path, value, says: str) -> None:
    """A NaN, infinite, negative, missing or non-numeric throughput is named, never shown as 0 tok/s."""
    results, proc = run_selftest(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]

    def mutate(report):
        report["bench"]["runs"]["triton"]["metrics"]["total_token_throughput"] = value
    _report_with(results, mutate)
    summary = pipeline("summary", str(results))
    assert summary.returncode == 0 and "Traceback" not in summary.stderr, summary.stderr
    ratio = table_rows(summary.stdout)["bench"][3]
    assert ratio.startswith("plugin n/a (") and says in ratio, ratio
    if value != 0:
        assert "0 tok/s" not in ratio


@pytest.mark.parametrize("case", ["truncated json", "json list", "suites of numbers", "truncated xml", "not utf-8",
                                  "report is a directory", "truncated bench.json", "runs a list", "no metrics"])
def test_summary_of_odd_inputs_is_one_line_or_a_table_never_a_traceback(tmp_path: Path, case: str) -> None:
    results, proc = run_selftest(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = results / "selftest.json"
    if case == "truncated json":
        report.write_text(report.read_text()[:200])
    elif case == "json list":
        report.write_text("[]")
    elif case == "suites of numbers":
        _report_with(results, lambda r: r.update(suites=[1, 2]))
    elif case == "truncated xml":
        (results / "selftest.xml").write_text((results / "selftest.xml").read_text()[:300])
    elif case == "not utf-8":
        report.write_bytes(b"\xff\xfe{}")
    elif case == "report is a directory":
        report.unlink()
        report.mkdir()
    elif case == "truncated bench.json":
        _report_with(results, lambda r: r.pop("bench"))
        (results / "bench.json").write_text('{"runs": {"triton": {"metr')
    elif case == "runs a list":
        _report_with(results, lambda r: r["bench"].update(runs=[1]))
    elif case == "no metrics":
        _report_with(results, lambda r: r["bench"]["runs"]["triton"].pop("metrics"))
    summary = pipeline("summary", str(results))
    assert "Traceback" not in summary.stderr, summary.stderr
    if summary.returncode == 0:
        assert "| bench |" in summary.stdout
    else:
        assert summary.returncode == 1 and len(summary.stderr.strip().splitlines()) == 1, summary.stderr
        assert str(results) in summary.stderr
