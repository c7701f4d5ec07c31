"""ci/pipeline/propose-pins.sh in its CPU form: the real `python3 -m tools.pins resolve` against a
local vLLM repository with the pinned tag, real git pushes to a local remote, and a `gh`
that accepts only the exact commands the script may run."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.pins import locks, model
from vllm_sdist import cache_dir, sdist_archive, track_names

REPO = Path(__file__).resolve().parents[3]
# The folder of this test environment's python3: the scripts' python3 has the runtime package there, as
# in the tools' environment that uv makes (uv run --locked --project tools puts its bin first on PATH).
TOOLS_BIN = str(Path(sys.executable).parent)
NEWEST = model.load(REPO / "versions.json")["tracks"][model.track_names(model.load(REPO / "versions.json"))[0]][
    "vllm"]["version"]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main",
       "-c", "protocol.file.allow=always"]


def git(*args: str, cwd: Path) -> str:
    proc = subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


FAKE_GH = """#!/usr/bin/env python3
import json, os, re, sys
argv = sys.argv[1:]
body = None
heads = re.compile(r"pins/(resolve|vllm-[0-9]+[.][0-9]+[.][0-9]+)")
ok = len(argv) == 12 and argv[:3] == ["pr", "list", "--head"] and heads.fullmatch(argv[3]) and argv[4:] == [
    "--base", "main", "--state", "open", "--json", "number", "--jq", ".[0].number"]
if argv[:2] == ["pr", "create"] and len(argv) == 10:
    ok = (argv[2:5] == ["--base", "main", "--head"] and heads.fullmatch(argv[5]) and argv[6] == "--title"
          and argv[8] == "--body-file")
    body = open(argv[9]).read() if ok else None
if argv[:2] == ["pr", "edit"] and len(argv) == 5:
    ok = argv[2] == os.environ.get("FAKE_GH_OPEN_PR") and argv[3] == "--body-file"
    body = open(argv[4]).read() if ok else None
with open(os.environ["FAKE_GH_LOG"], "a") as log:
    log.write(json.dumps({"argv": argv, "body": body}) + "\\n")
if not ok:
    print("fake gh: unexpected argv " + " ".join(argv), file=sys.stderr)
    sys.exit(2)
if argv[:2] == ["pr", "list"]:
    print(os.environ.get("FAKE_GH_OPEN_PR", ""))
"""


@pytest.fixture
def project(tmp_path: Path):
    # upstream vLLM: one commit, tagged with the tag versions.json pins
    data = json.loads((REPO / "versions.json").read_text())
    upstream = tmp_path / "vllm-upstream"
    upstream.mkdir()
    git("init", "-q", cwd=upstream)
    (upstream / "setup.py").write_text("# vllm\n")
    git("add", "setup.py", cwd=upstream)
    git("commit", "-q", "-m", "release", cwd=upstream)
    for own in data["tracks"].values():
        git("tag", "-a", own["vllm"]["tag"], "-m", "release", cwd=upstream)
    upstream_commit = git("rev-parse", "HEAD", cwd=upstream)

    # this repository, with vLLM pointed at that upstream and its commit unresolved
    root = tmp_path / "project"
    root.mkdir()
    for name in ("versions.json", "versions.schema.json", "Dockerfile.rocm_base", "Dockerfile.rocm", "docker-bake.hcl",
                 "docker-bake.pins.json"):
        shutil.copy(REPO / name, root / name)
    (root / model.BACKEND_INIT).parent.mkdir(parents=True)
    shutil.copy(REPO / model.BACKEND_INIT, root / model.BACKEND_INIT)
    for folder in ("ci", "docker", "tools"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
    data["vllm"]["repository"] = str(upstream)
    for own in data["tracks"].values():
        own["vllm"].update(commit=None, unresolved=["commit"])
        if "commit_prefix" in own["vllm"]:
            own["vllm"]["commit_prefix"] = upstream_commit[:9]
    (root / "versions.json").write_text(model.canonical(data))
    # the Dockerfiles' global ARG defaults follow, as `tools.pins resolve --write` writes them
    sync = subprocess.run([sys.executable, "-c", "from tools.pins import model; "
                           "model.write_files(model.global_arg_updates(model.load())[1])"],
                          cwd=root, capture_output=True, text=True)
    assert sync.returncode == 0, sync.stderr
    git("init", "-q", cwd=root)
    git("add", ".", cwd=root)
    git("commit", "-q", "-m", "initial", cwd=root)
    origin = tmp_path / "origin.git"
    git("init", "-q", "--bare", str(origin), cwd=tmp_path)
    git("remote", "add", "origin", str(origin), cwd=root)
    git("push", "-q", "origin", "main", cwd=root)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    gh_log = tmp_path / "gh.jsonl"

    class Project:
        path = root
        commit = upstream_commit
        remote = origin

        @staticmethod
        def run(**env: str) -> subprocess.CompletedProcess[str]:
            # releases after the newest track's are left out: what PyPI publishes later changes nothing here
            # python3 is this test environment's, as under uv it is the pin tool's (with the runtime package)
            full = {**os.environ, "PATH": f"{bin_dir}:{TOOLS_BIN}:{os.environ['PATH']}", "FAKE_GH_LOG": str(gh_log),
                    "PINS_WHAT": "vllm", "RESULTS_DIR": str(tmp_path / "pins-results"),
                    "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "PINS_UP_TO": NEWEST,
                    "PINS_SDIST_CACHE": str(cache_dir()), "PINS_TESTS": "python3 -m tools.pins verify",
                    "PINS_PYTHON": sys.executable, **env}
            for name in ("GH", "PINS_BRANCH", "PINS_BASE", "PINS_REMOTE"):
                if name not in env:
                    full.pop(name, None)
            return subprocess.run(["bash", str(root / "ci/pipeline/propose-pins.sh")], env=full, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=120)

        @staticmethod
        def gh_calls() -> list[dict]:
            return [json.loads(l) for l in gh_log.read_text().splitlines()] if gh_log.exists() else []

        @staticmethod
        def remote_file(ref: str, path: str) -> str:
            return git("show", f"{ref}:{path}", cwd=origin)

    Project.summary = tmp_path / "summary.md"
    return Project


def test_resolved_pins_go_to_a_branch_and_a_pull_request(project) -> None:
    main_before = git("rev-parse", "main", cwd=project.remote)
    proc = project.run()
    assert proc.returncode == 0, proc.stderr + proc.stdout
    # main untouched; the proposal branch holds the resolved commit, Dockerfile defaults synced
    assert git("rev-parse", "main", cwd=project.remote) == main_before
    proposed = json.loads(project.remote_file("pins/resolve", "versions.json"))
    for own in proposed["tracks"].values():  # every track's vLLM
        assert own["vllm"]["commit"] == project.commit and "commit" not in own["vllm"]["unresolved"]
    assert f"ARG VLLM_COMMIT={project.commit}\n" in project.remote_file("pins/resolve", "Dockerfile.rocm_base")
    assert f"ARG VLLM_COMMIT={model.build_args(proposed)['VLLM_COMMIT']}\n" in project.remote_file("pins/resolve",
                                                                                                   "Dockerfile.rocm")
    calls = project.gh_calls()
    assert [c["argv"][:2] for c in calls] == [["pr", "list"], ["pr", "create"]]
    assert calls[1]["argv"][7] == "pins: resolve vllm"
    body = calls[1]["body"]
    for track in proposed["tracks"]:
        assert f"tracks.{track}.vllm.commit: None -> {project.commit}" in body
    # other pins are still unresolved: verify --strict fails, and the body says so with its output
    assert "`python3 -m tools.pins verify --strict` (exit 1):" in body and "base_image.digest" in body
    assert body in project.summary.read_text()

    # nothing new upstream: no second proposal
    proc = project.run()
    assert proc.returncode == 0, proc.stderr
    assert "pins unchanged" in proc.stdout
    assert len(project.gh_calls()) == 2


def test_an_open_pull_request_is_updated(project) -> None:
    proc = project.run(FAKE_GH_OPEN_PR="7")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    calls = project.gh_calls()
    assert [c["argv"][:3] for c in calls] == [["pr", "list", "--head"], ["pr", "edit", "7"]]
    assert project.commit in calls[1]["body"]


def test_a_failed_resolve_proposes_nothing(project) -> None:
    data = json.loads((project.path / "versions.json").read_text())
    data["tracks"][data["default_track"]]["vllm"]["tag"] = "v9.9.9"
    (project.path / "versions.json").write_text(model.canonical(data))
    git("commit", "-q", "-am", "unknown tag", cwd=project.path)
    proc = project.run()
    assert proc.returncode == 1
    assert "has no tag 'v9.9.9'" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("error: python3 -m tools.pins resolve failed")
    assert project.gh_calls() == []
    assert "pins/resolve" not in git("branch", "--list", cwd=project.remote)


def test_the_base_branch_is_never_the_proposal_branch(project) -> None:
    proc = project.run(PINS_BRANCH="main")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: PINS_BRANCH is the base branch 'main': set PINS_BRANCH to a branch of its own"]
    assert project.gh_calls() == []


def test_a_new_vllm_release_gets_a_pull_request_of_its_own(project) -> None:
    """With the newest track taken out of the project, the job finds that release on PyPI, proposes
    it as a track on pins/vllm-<version> with what changed upstream, and main stays as it was."""
    for track in track_names():
        sdist_archive(track)  # the real sdists, from the tests' cache
    data = model.load(project.path / "versions.json")
    newest = model.track_names(data)[0]
    own = data["tracks"].pop(newest)
    data["default_track"] = model.track_names(data)[0]
    if all(t["aiter"] != own["aiter"] for t in data["tracks"].values()):
        data["aiter"]["pins"].pop(own["aiter"])
    aiter = project.path.parent / "aiter-upstream"  # AITER's tags, one newer than any track builds
    aiter.mkdir()
    git("init", "-q", cwd=aiter)
    git("commit", "-q", "--allow-empty", "-m", "x", cwd=aiter)
    for tag in (own["aiter"], "v9.0.0"):
        git("tag", "-a", tag, "-m", tag, cwd=aiter)
    data["aiter"]["repository"] = aiter.as_uri()
    (project.path / "versions.json").write_text(model.canonical(data))
    built = newest in model.built_track_names(model.load(REPO / "versions.json"))
    (project.path / f"docker/locks/vllm-{newest}-rocm.txt").unlink(missing_ok=not built)  # the job must make it
    sync = subprocess.run([sys.executable, "-c", "from tools.pins import model; d = model.load(); "
                           "model.write_files({**model.global_arg_updates(d)[1], **model.backend_range_update(d)})"],
                          cwd=project.path, capture_output=True, text=True)
    assert sync.returncode == 0, sync.stderr
    git("commit", "-q", "-am", "before the release", cwd=project.path)
    git("push", "-q", "origin", "main", cwd=project.path)
    main_before = git("rev-parse", "main", cwd=project.remote)

    proc = project.run(PINS_RELEASE_WHAT="vllm")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert git("rev-parse", "main", cwd=project.remote) == main_before
    branch = f"pins/vllm-{NEWEST}"
    proposed = json.loads(project.remote_file(branch, "versions.json"))
    # the new track; the default where its stack is built here (a therock track leaves it)
    assert (proposed["default_track"] == newest) == built and proposed["tracks"][newest]["aiter"] == own["aiter"]
    assert proposed["tracks"][newest]["vllm"]["sdist"]["sha256"] == own["vllm"]["sdist"]["sha256"]
    default_version = proposed["tracks"][proposed["default_track"]]["vllm"]["version"]
    assert f"ARG VLLM_VERSION={default_version}" in project.remote_file(branch, "Dockerfile.rocm")
    # the plugin's range is left as it was: the new release is not compared with the plugin yet
    assert f'SUPPORTED_VLLM = "{model.supported_vllm(data)}"' in project.remote_file(branch, str(model.BACKEND_INIT))
    calls = project.gh_calls()
    creates = [c for c in calls if c["argv"][:2] == ["pr", "create"]]
    assert creates[0]["argv"][5] == branch and creates[0]["argv"][7] == f"pins: vLLM {NEWEST} as release track {newest}"
    body = creates[0]["body"]
    assert f"### vLLM {NEWEST}: track {newest}" in body and "requirements/common.txt" in body
    # the local upstream's tag is not the release's commit: the prefix check says so, in the body
    assert f"does not start with tracks.{newest}.vllm.commit_prefix" in body
    assert "Tests (`python3 -m tools.pins verify`): exit 0" in body
    # the new track's lock, made by the job from the release's sdist, is the repository's own (none
    # for a track whose stack is not built here)
    assert f"`python3 -m tools.pins lock vllm-{newest}` (exit 0)" in body, body[body.find("tools.pins lock"):][:1500]
    lock = f"docker/locks/vllm-{newest}-rocm.txt"
    if built:
        # the lock the resolver makes of the release's requirements now, with nothing to keep (the
        # repository's own lock keeps its versions while the index gains releases: lock --check)
        repo_data = model.load(REPO / "versions.json")
        (track_lock,) = [lk for lk in locks.locks(REPO, repo_data) if lk.name == f"vllm-{newest}"]
        fresh = locks.compile_lock(track_lock, REPO, repo_data, locks.load(REPO), cache_dir())
        assert project.remote_file(branch, lock) == fresh.rstrip("\n")
    else:
        assert f"no lock: track {newest}'s ROCm stack is not built here yet" in body
    assert f"track {newest} builds AITER {own['aiter']}; AITER has v9.0.0" in body
