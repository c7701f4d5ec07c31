"""ci/pipeline/publish.py, what publish.sh and tag.sh decide, without a Docker engine: the plan made from
publish.sh's settings (PUBLISH, REGISTRY, GIT_SHA, the floating tag from GIT_REF, verify's mode), the
builder's driver read from buildx inspect, the commit tag and push settings read from a resolved graph,
and publish.sh's whole run with a docker that answers bake's --print with a graph of its own, records every
argv with the settings bake reads, and refuses any argv it does not know."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.pipeline import publish

REPO = Path(__file__).resolve().parents[3]
TOOLS_BIN = str(Path(sys.executable).parent)  # python3 with the runtime package, as under uv
SHA = "0123456789abcdef0123456789abcdef01234567"
PREFIX = "ghcr.io/team/rocm-vllm"
COMMIT_TAG = "vllm0.32.0-aiter0123456789ab-0123456789ab"


def graph(**targets: dict) -> dict:
    return {"group": {"default": {"targets": sorted(targets)}}, "target": targets}


def target(name: str, *tags: str) -> dict:
    return {"tags": [f"{PREFIX}/{name}:{t}" for t in (COMMIT_TAG, *tags)],
            "output": ["type=image,push=true", "compression=zstd"]}


def written(tmp_path: Path, value: object, name: str = "graph.json") -> str:
    path = tmp_path / name
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(path)


def test_the_commit_tag_is_the_one_every_target_carries_first(tmp_path: Path) -> None:
    path = written(tmp_path, graph(serve=target("serve", "v1.0"), ci=target("ci")))
    assert publish.commit_tag(publish.read_graph(path), path) == COMMIT_TAG
    other = graph(serve=target("serve"), ci={"tags": [f"{PREFIX}/ci:other"]})
    path = written(tmp_path, other)
    with pytest.raises(publish.PublishError) as err:
        publish.commit_tag(publish.read_graph(path), path)
    assert str(err.value) == f"the targets of {path} do not share one commit tag: ['other', '{COMMIT_TAG}']"


@pytest.mark.parametrize("text, why", [("not json", "not JSON"), ('{"target": {}, "target": {}}', "appears twice"),
                                       ('{"group": {}}', "no object of targets"),
                                       ('{"target": {"serve": {"tags": ["no-tag-here"]}}}', "image:tag names")])
def test_a_graph_of_another_shape_is_one_line(tmp_path: Path, text: str, why: str) -> None:
    path = written(tmp_path, text)
    proc = subprocess.run([sys.executable, "-m", "ci.pipeline", "commit-tag", path], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {path} is not the graph docker buildx bake --print writes (") and why in line, line
    assert line.endswith("): see the bake output above"), line


def test_push_settings_push_by_digest_or_under_a_scratch_tag(tmp_path: Path) -> None:
    targets = graph(serve=target("serve"), base=target("base"))["target"]
    assert publish.push_settings(targets, "docker-container", COMMIT_TAG, "g.json") == [
        f"--set={name}.output=type=image,push=true,compression=zstd,push-by-digest=true,name-canonical=true"
        for name in ("base", "serve")]
    assert publish.push_settings(targets, "docker", COMMIT_TAG, "g.json") == [
        f"--set={name}.tags={PREFIX}/{name}:unpublished-{COMMIT_TAG}" for name in ("base", "serve")]
    with pytest.raises(publish.PublishError) as err:
        publish.push_settings({"serve": {"tags": []}}, "docker-container", COMMIT_TAG, "g.json")
    assert str(err.value) == ("g.json: target serve has no output to push (PUSH=1 gives each one): see the bake "
                              "output above")


def test_only_the_default_groups_targets_are_tagged() -> None:
    """base is another target's context: built, never published, unless asked for."""
    g = {"group": {"default": {"targets": ["rocm"]}, "rocm": {"targets": ["serve", "ci"]}},
         "target": {"base": {}, "serve": {}, "ci": {}}}
    assert publish.asked(g) == {"serve", "ci"}
    assert publish.asked({"target": {"base": {}, "serve": {}}}) == {"base", "serve"}


FAKE_DOCKER = """#!/usr/bin/env python3
import json, os, sys
argv = sys.argv[1:]
names = ("PUSH", "REGISTRY", "TAG", "VCS_REF", "CACHE_REPO", "MOVABLE_TAGS", "BUILDX_BUILDER")
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"argv": argv, "env": {k: os.environ.get(k) for k in names}}) + "\\n")
bake = ["buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json"]
if argv[:7] == [*bake, "--print"]:
    print(open(os.environ["FAKE_GRAPH"]).read())
elif argv == ["buildx", "inspect"]:
    print("Name: default\\nDriver: " + os.environ.get("FAKE_DRIVER", "docker-container"))
elif argv[:7] == [*bake, "--metadata-file"]:
    if os.environ.get("FAKE_BUILD_RC"):
        sys.exit("ERROR: failed to push: connection refused")
    targets = [a for a in argv[8:] if not a.startswith("-")]
    json.dump({t: {"containerimage.digest": "sha256:" + format(i + 1, "064x")} for i, t in enumerate(targets)},
              open(argv[7], "w"))
elif argv[:5] == ["buildx", "imagetools", "inspect", "--format", "{{json .Manifest}}"] and len(argv) == 6:
    sys.exit("ERROR: " + argv[-1] + ": not found")
elif argv[:4] == ["buildx", "imagetools", "create", "--tag"] and len(argv) == 6:
    pass
else:
    sys.exit("fake docker: unexpected argv " + json.dumps(argv))
"""
BAKE = ["buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json"]


def publish_sh(tmp_path: Path, resolved: dict, *targets: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """publish.sh with the fake docker first on PATH; settings replace the defaults, None drops one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{TOOLS_BIN}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "FAKE_DOCKER_LOG": str(tmp_path / "docker.jsonl"), "FAKE_GRAPH": written(tmp_path, resolved),
           "REGISTRY": PREFIX, "GIT_SHA": SHA, "GIT_REF": "refs/heads/main", "RESULTS_DIR": str(tmp_path / "results"),
           **settings}
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run(["bash", str(REPO / "ci/pipeline/amd-runner/publish.sh"), *targets], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def docker_calls(tmp_path: Path) -> list[dict]:
    log = tmp_path / "docker.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_publish_runs_the_commands_the_graph_decides(tmp_path: Path) -> None:
    """PUBLISH=push of the CPU serve image (verify without --strict): bake --print, the builder's driver,
    the build pushing by digest, each tag read and then set: every argv whole."""
    results = tmp_path / "results"
    resolved = graph(**{"serve-cpu": target("serve-cpu", "branch-main")})
    proc = publish_sh(tmp_path, resolved, "serve-cpu")
    assert proc.returncode == 0, proc.stderr
    calls = [c["argv"] for c in docker_calls(tmp_path)]
    assert calls[0] == [*BAKE, "--print", "serve-cpu"], calls[0]
    digest = "sha256:" + format(1, "064x")
    tags = resolved["target"]["serve-cpu"]["tags"]
    assert calls[1:] == [
        ["buildx", "inspect"],
        [*BAKE, "--metadata-file", str(results / "bake-metadata.json"),
         "--set=serve-cpu.output=type=image,push=true,compression=zstd,push-by-digest=true,name-canonical=true",
         "serve-cpu"],
        *[["buildx", "imagetools", "inspect", "--format", "{{json .Manifest}}", t] for t in tags],
        *[["buildx", "imagetools", "create", "--tag", t, f"{PREFIX}/serve-cpu@{digest}"] for t in tags]]
    assert (results / "tag.env").read_text() == f"TAG={COMMIT_TAG}\n"
    assert [line for line in proc.stderr.splitlines() if line.startswith("== tagged")] == [
        f"== tagged {t} -> {digest}" for t in tags]
    assert f"== verify pins ({CPU_NOTE.format('serve-cpu')})" in proc.stderr.splitlines()
    env = docker_calls(tmp_path)[0]["env"]
    assert env == {"PUSH": "1", "REGISTRY": PREFIX, "TAG": "branch-main", "VCS_REF": SHA, "CACHE_REPO": None,
                   "MOVABLE_TAGS": None, "BUILDX_BUILDER": None}
    # tag.sh moves the branch's own tag only
    assert {c["env"]["MOVABLE_TAGS"] for c in docker_calls(tmp_path) if c["argv"][1] == "imagetools"} \
        == {"branch-main"}


def test_publish_of_a_git_tag_with_the_engines_builder(tmp_path: Path) -> None:
    """A git tag's name tags the images and never moves; the docker driver pushes under the scratch tag;
    the trailing slashes of REGISTRY and CACHE_REPO go."""
    results = tmp_path / "results"
    resolved = graph(**{"serve-cpu": target("serve-cpu", "v1.0")})
    proc = publish_sh(tmp_path, resolved, "serve-cpu", GIT_REF="refs/tags/v1.0", REGISTRY=f"{PREFIX}/",
                      CACHE_REPO="cache.example/c/", FAKE_DRIVER="docker", GITHUB_OUTPUT=str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    calls = docker_calls(tmp_path)
    assert calls[0]["env"] == {"PUSH": "1", "REGISTRY": PREFIX, "TAG": "v1.0", "VCS_REF": SHA,
                               "CACHE_REPO": "cache.example/c", "MOVABLE_TAGS": None, "BUILDX_BUILDER": None}
    assert calls[2]["argv"] == [*BAKE, "--metadata-file", str(results / "bake-metadata.json"),
                                f"--set=serve-cpu.tags={PREFIX}/serve-cpu:unpublished-{COMMIT_TAG}", "serve-cpu"]
    assert {c["env"]["MOVABLE_TAGS"] for c in calls if c["argv"][1] == "imagetools"} == {""}
    assert (tmp_path / "out").read_text() == f"tag={COMMIT_TAG}\nimage-prefix={PREFIX}\n"


def test_publish_without_git_sha_takes_the_checkouts_commit(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=60)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    proc = publish_sh(tmp_path, graph(**{"serve-cpu": target("serve-cpu")}), "serve-cpu", GIT_SHA=None,
                      PUBLISH="print", GIT_REF="refs/pull/1/merge")
    assert proc.returncode == 0, proc.stderr
    (call,) = docker_calls(tmp_path)
    assert call["argv"] == [*BAKE, "--print", "serve-cpu"]
    assert call["env"]["VCS_REF"] == head.stdout.strip() and call["env"]["TAG"] == ""
    assert json.loads(proc.stdout) == graph(**{"serve-cpu": target("serve-cpu")})
    assert f"== verify pins ({PRINT_NOTE})" in proc.stderr.splitlines()


@pytest.mark.parametrize("setting, says", [
    ({"PUBLISH": "Push"}, "error: PUBLISH=Push: set PUBLISH to push or print"),
    ({"REGISTRY": None}, "error: REGISTRY is not set: set REGISTRY to the repository prefix to push to "
                         "(e.g. ghcr.io/org/rocm-vllm)"),
    ({"REGISTRY": "ghcr.io/Team/x"}, "error: REGISTRY 'ghcr.io/Team/x' has upper-case letters, which image names "
                                     "cannot have: set REGISTRY in lower case"),
    ({"GIT_SHA": SHA[:39]}, f"error: GIT_SHA '{SHA[:39]}' is not a full 40-hex commit id: set GIT_SHA to the "
                            "commit being built"),
    ({"GIT_SHA": SHA.upper()}, f"error: GIT_SHA '{SHA.upper()}' is not a full 40-hex commit id: set GIT_SHA to the "
                               "commit being built"),
    ({"GIT_REF": "refs/tags/branch-v1"}, "error: the git tag branch-v1 would tag the images branch-v1, in the "
                                         "namespace of branch tags (branch-<branch>, moved by every push to that "
                                         "branch): name the release without the branch- prefix")])
def test_publish_stops_on_a_refused_setting_in_one_line_before_anything_runs(tmp_path: Path, setting: dict,
                                                                             says: str) -> None:
    proc = publish_sh(tmp_path, graph(**{"serve-cpu": target("serve-cpu")}), "serve-cpu", **setting)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [says]
    assert docker_calls(tmp_path) == [] and not (tmp_path / "results").exists()


def test_publish_verifies_every_pin_before_pushing_rocm_images(tmp_path: Path) -> None:
    """serve with PUBLISH=push: verify --strict, which this checkout's unresolved pins fail: nothing runs."""
    strict = subprocess.run([sys.executable, "-m", "tools.pins", "verify", "--strict"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    if strict.returncode == 0:
        pytest.skip("every pin of this checkout is resolved: verify --strict passes")
    proc = publish_sh(tmp_path, graph(serve=target("serve")), "serve")
    assert proc.returncode != 0
    assert proc.stderr.splitlines()[0] == f"== verify pins ({STRICT})"
    assert docker_calls(tmp_path) == []


def test_publish_stops_when_the_build_or_push_fails_nothing_tagged(tmp_path: Path) -> None:
    proc = publish_sh(tmp_path, graph(**{"serve-cpu": target("serve-cpu")}), "serve-cpu", FAKE_BUILD_RC="1")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (f"error: the build or its push to {PREFIX} failed (exit 1; registry down "
                                            "or refusing, see above): nothing tagged")
    assert [c["argv"][:3] for c in docker_calls(tmp_path)] == [BAKE[:3], ["buildx", "inspect"], BAKE[:3]]


def test_tag_sh_takes_the_files_as_named_from_where_it_runs(tmp_path: Path) -> None:
    """tag.sh runs the module from the repository root; GRAPH and METADATA relative to the caller's folder."""
    written(tmp_path, graph(serve=target("serve")))
    written(tmp_path, {"serve": {}}, "metadata.json")
    proc = subprocess.run(["bash", str(REPO / "ci/pipeline/amd-runner/tag.sh"), "graph.json", "metadata.json"],
                          env={**os.environ, "PATH": f"{TOOLS_BIN}:{os.environ['PATH']}"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        f"error: serve has no pushed digest in {tmp_path / 'metadata.json'} (its build or push failed): nothing tagged"]
    usage = subprocess.run(["bash", str(REPO / "ci/pipeline/amd-runner/tag.sh"), "graph.json"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: ") and usage.stderr.endswith(" GRAPH METADATA\n")


# ------------------------------------------------------------------ the plan: publish.sh's settings

def settings(**env: str) -> dict[str, str]:
    return {"REGISTRY": PREFIX, "GIT_SHA": SHA, **env}


def refused(environ: dict[str, str], targets: tuple[str, ...] = ("serve",)) -> str:
    with pytest.raises(publish.PublishError) as err:
        publish.run_plan(environ, targets)
    message = str(err.value)
    assert "\n" not in message and "\r" not in message, message
    return message


@pytest.mark.parametrize("value", ["", None])
def test_publish_mode_is_push_by_default(value: str | None) -> None:
    env = settings() if value is None else settings(PUBLISH=value)
    assert publish.run_plan(env, ["serve"]).mode == "push"
    assert publish.run_plan(settings(PUBLISH="print"), ["serve"]).mode == "print"


@pytest.mark.parametrize("value", ["Push", "push ", " print", "upload", "pushprint", "push\nprint"])
def test_publish_mode_other_than_push_or_print_is_refused(value: str) -> None:
    shown = value.replace("\n", "\\n")
    assert refused(settings(PUBLISH=value)) == f"PUBLISH={shown}: set PUBLISH to push or print"


@pytest.mark.parametrize("registry, kept", [
    (PREFIX, PREFIX), (f"{PREFIX}/", PREFIX),
    (f"{PREFIX}//", f"{PREFIX}/"),  # one slash dropped, as ${REGISTRY%/} did
    ("localhost:5000/rocm-vllm", "localhost:5000/rocm-vllm"),  # a registry on this machine's port: pushed to
    ("localhostx/rocm-vllm", "localhostx/rocm-vllm"), ("127.0.0.1:5000/rocm-vllm", "127.0.0.1:5000/rocm-vllm"),
    ("registry", "registry")])
def test_registry_taken_without_its_trailing_slash(registry: str, kept: str) -> None:
    assert publish.run_plan(settings(REGISTRY=registry), ["serve"]).registry == kept


@pytest.mark.parametrize("registry, says", [
    ("", "REGISTRY is not set: set REGISTRY to the repository prefix to push to (e.g. ghcr.io/org/rocm-vllm)"),
    ("localhost/rocm-vllm", "REGISTRY 'localhost/rocm-vllm' is not a registry to push to: set REGISTRY "
                            "(e.g. ghcr.io/org/rocm-vllm)"),
    ("localhost/", "REGISTRY 'localhost/' is not a registry to push to: set REGISTRY (e.g. ghcr.io/org/rocm-vllm)"),
    ("ghcr.io/Org/rocm-vllm", "REGISTRY 'ghcr.io/Org/rocm-vllm' has upper-case letters, which image names cannot "
                              "have: set REGISTRY in lower case"),
    ("ghcr.io/org/rocm-vllZ", "REGISTRY 'ghcr.io/org/rocm-vllZ' has upper-case letters, which image names cannot "
                              "have: set REGISTRY in lower case"),
    ("ghcr.io/org/rocm vllm", "REGISTRY 'ghcr.io/org/rocm vllm' has a space or a control character, which image "
                              "names cannot have: set REGISTRY to the repository prefix (e.g. ghcr.io/org/rocm-vllm)"),
    ("ghcr.io/org\n", "REGISTRY 'ghcr.io/org\\n' has a space or a control character, which image names cannot "
                      "have: set REGISTRY to the repository prefix (e.g. ghcr.io/org/rocm-vllm)")])
def test_registry_it_cannot_push_to_is_refused(registry: str, says: str) -> None:
    assert refused(settings(REGISTRY=registry)) == says
    if not registry:
        assert refused({"GIT_SHA": SHA}) == says  # unset as empty


@pytest.mark.parametrize("sha", ["", SHA[:39], SHA + "0", SHA.upper(), SHA[:39] + "A", SHA[:39] + "g",
                                 SHA[:39] + "\n", " " + SHA[:39], "abc123"])
def test_commit_id_other_than_40_lower_case_hex_is_refused(sha: str) -> None:
    shown = sha.replace("\n", "\\n")
    assert refused(settings(GIT_SHA=sha)) == (f"GIT_SHA '{shown}' is not a full 40-hex commit id: set GIT_SHA to "
                                              "the commit being built")
    assert publish.run_plan(settings(GIT_SHA="f" * 40), ["serve"]).sha == "f" * 40


def test_settings_are_checked_in_publish_shs_order() -> None:
    """The first refused setting is the one named: PUBLISH, REGISTRY, GIT_SHA, then the git ref."""
    assert refused({"PUBLISH": "x", "GIT_REF": "refs/tags/branch-x"}).startswith("PUBLISH=x:")
    assert refused({"GIT_SHA": "x", "GIT_REF": "refs/tags/branch-x"}).startswith("REGISTRY is not set:")
    assert refused(settings(GIT_SHA="x", GIT_REF="refs/tags/branch-x")).startswith("GIT_SHA 'x'")
    assert refused(settings(GIT_REF="refs/tags/branch-x")).startswith("the git tag branch-x ")


@pytest.mark.parametrize("ref, tag, movable", [
    ("refs/heads/main", "branch-main", "branch-main"),
    ("refs/tags/v1.0", "v1.0", ""),
    ("refs/heads/v1.0", "branch-v1.0", "branch-v1.0"),  # a branch named as a release: its own namespace
    ("refs/heads/branch-x", "branch-branch-x", "branch-branch-x"),
    ("refs/heads/.feature/Fix bug#2", "branch-feature-Fix-bug-2", "branch-feature-Fix-bug-2"),
    ("refs/tags/release/1.0", "release-1.0", ""),  # a slash, as a tag cannot have it
    ("refs/tags/v1:0", "v1-0", ""),  # a colon, which would end the image name
    ("refs/tags/-.v1", "v1", ""), ("refs/tags/._-v1", "_-v1", ""),  # a tag starts with [A-Za-z0-9_]
    ("refs/tags/vé", "v-", ""),  # one '-' per character, not per byte
    ("refs/tags/" + "v" * 128, "v" * 128, ""), ("refs/tags/" + "v" * 129, "v" * 128, ""),
    ("refs/heads/" + "x" * 121, "branch-" + "x" * 121, "branch-" + "x" * 121),
    ("refs/heads/" + "x" * 122, "branch-" + "x" * 121, "branch-" + "x" * 121),
    ("refs/heads/.-.", "", ""), ("refs/heads/", "", ""), ("refs/tags/", "", ""), ("refs/heads", "", ""),
    ("refs/pull/7/merge", "", ""), ("refs/remotes/origin/main", "", ""), ("heads/main", "", ""),
    ("main", "", ""), ("", "", ""), (" refs/heads/main", "", "")])
def test_the_floating_tag_is_the_refs_name_as_a_tag_can_spell_it(ref: str, tag: str, movable: str) -> None:
    plan = publish.run_plan(settings(GIT_REF=ref), ["serve"])
    assert (plan.tag, plan.movable) == (tag, movable)


def test_git_ref_comes_first_then_github_ref() -> None:
    assert publish.run_plan(settings(GITHUB_REF="refs/tags/v2"), ["serve"]).tag == "v2"
    assert publish.run_plan(settings(GIT_REF="", GITHUB_REF="refs/tags/v2"), ["serve"]).tag == "v2"
    assert publish.run_plan(settings(GIT_REF="refs/heads/dev", GITHUB_REF="refs/tags/v2"), ["serve"]).tag \
        == "branch-dev"


@pytest.mark.parametrize("ref, name, tag", [
    ("refs/tags/branch-main", "branch-main", "branch-main"),
    ("refs/tags/branch-", "branch-", "branch-"),
    ("refs/tags/.branch-x", ".branch-x", "branch-x"),  # named as given, the tag as it would be spelt
    ("refs/tags/branch-a/b", "branch-a/b", "branch-a-b")])
def test_a_git_tag_in_the_branch_namespace_is_refused(ref: str, name: str, tag: str) -> None:
    assert refused(settings(GIT_REF=ref)) == (
        f"the git tag {name} would tag the images {tag}, in the namespace of branch tags (branch-<branch>, moved "
        "by every push to that branch): name the release without the branch- prefix")
    assert publish.run_plan(settings(GIT_REF="refs/tags/branch"), ["serve"]).tag == "branch"
    assert publish.run_plan(settings(GIT_REF="refs/tags/Branch-x"), ["serve"]).tag == "Branch-x"


STRICT = "python3 -m tools.pins verify --strict"
CPU_NOTE = "python3 -m tools.pins verify; not --strict: the CPU images {} build from none of the ROCm pins"
PRINT_NOTE = "python3 -m tools.pins verify; not --strict: PUBLISH=print pushes nothing"


@pytest.mark.parametrize("mode, targets, strict, note", [
    ("push", ("base", "serve", "ci"), True, STRICT),
    ("push", ("serve-cpu",), False, CPU_NOTE.format("serve-cpu")),
    ("push", ("serve-cpu", "ci-cpu", "cpu"), False, CPU_NOTE.format("serve-cpu ci-cpu cpu")),
    ("push", ("serve-cpu", "serve"), True, STRICT), ("push", ("serve", "cpu"), True, STRICT),
    ("push", ("rocm",), True, STRICT), ("push", ("serve-cpu2",), True, STRICT), ("push", ("CPU",), True, STRICT),
    ("print", ("base", "serve", "ci"), False, PRINT_NOTE), ("print", ("serve-cpu",), False, PRINT_NOTE)])
def test_verify_is_strict_for_a_push_of_rocm_images(mode: str, targets: tuple[str, ...], strict: bool,
                                                    note: str) -> None:
    plan = publish.run_plan(settings(PUBLISH=mode), targets)
    assert (plan.strict, plan.verify) == (strict, note)


@pytest.mark.parametrize("targets, shown", [((), None), (("serve", ""), ""), (("serve cpu",), "serve cpu"),
                                            (("serve\nci",), "serve\\nci")])
def test_targets_that_bake_has_no_name_for_are_refused(targets: tuple[str, ...], shown: str | None) -> None:
    message = refused(settings(), targets)
    if shown is None:
        assert message == "no target to publish: name bake's targets or groups (e.g. base serve ci)"
    else:
        assert message == f"target '{shown}' is no name of docker-bake.hcl: name bake's targets or groups " \
                          "(e.g. base serve ci)"


def plan_cli(env: dict[str, str], *targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ci.pipeline", "plan", *targets], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_plan_is_one_value_a_line_in_publish_shs_order() -> None:
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    proc = plan_cli({**base, "REGISTRY": f"{PREFIX}/", "GIT_SHA": SHA, "GIT_REF": "refs/heads/main"}, "serve-cpu")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == "\n".join(["push", PREFIX, SHA, "branch-main", "branch-main", "0",
                                     CPU_NOTE.format("serve-cpu")]) + "\n"
    # empty values keep their lines: publish.sh reads seven
    proc = plan_cli({**base, "REGISTRY": PREFIX, "GIT_SHA": SHA, "PUBLISH": "push"}, "base", "serve")
    assert proc.stdout.split("\n") == ["push", PREFIX, SHA, "", "", "1", STRICT, ""], proc.stdout
    proc = plan_cli({**base, "REGISTRY": "localhost/x", "GIT_SHA": SHA}, "serve")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: REGISTRY 'localhost/x' is not a registry to push to: set REGISTRY (e.g. ghcr.io/org/rocm-vllm)"]


@pytest.mark.parametrize("answer, driver", [
    ("Name:   rocm-vllm\nDriver:   docker-container\nLast Activity: x\n", "docker-container"),
    ("Name: default\nDriver: docker\n", "docker"), ("Driver:docker", "docker"),
    ("Driver: docker\nNodes:\nDriver: remote\n", "docker"),  # the first
    ("Name: x\n  Driver: docker\n", ""), ("driver: docker\n", ""), ("", ""),
    ("Driver:\tdocker\n", "\tdocker"),  # spaces only are dropped (sed 's/^Driver: *//'): not the docker driver
])
def test_the_builders_driver_is_read_from_buildx_inspect(answer: str, driver: str) -> None:
    assert publish.builder_driver(answer) == driver
    proc = subprocess.run([sys.executable, "-m", "ci.pipeline", "driver"], cwd=REPO, input=answer,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == (f"{driver}\n" if driver else ""), proc.stderr
