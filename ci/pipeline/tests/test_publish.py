"""ci/pipeline/publish.py, what publish.sh and tag.sh decide, without a Docker engine: the commit tag and
push settings read from a resolved graph, and publish.sh's whole run with a docker that answers bake's
--print with a graph of its own and records every argv."""
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
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\\n")
if argv[:2] == ["buildx", "bake"] and "--print" in argv:
    print(open(os.environ["FAKE_GRAPH"]).read())
elif argv[:2] == ["buildx", "inspect"]:
    print("Name: default\\nDriver: docker-container")
elif argv[:2] == ["buildx", "bake"] and "--metadata-file" in argv:
    targets = [a for a in argv[argv.index("--metadata-file") + 2:] if not a.startswith("-")]
    json.dump({t: {"containerimage.digest": "sha256:" + format(i + 1, "064x")} for i, t in enumerate(targets)},
              open(argv[argv.index("--metadata-file") + 1], "w"))
elif argv[:3] == ["buildx", "imagetools", "inspect"]:
    sys.exit("ERROR: " + argv[-1] + ": not found")
"""


def test_publish_runs_the_commands_the_graph_decides(tmp_path: Path) -> None:
    """PUBLISH=push of the CPU serve image (verify without --strict): bake --print, the builder's driver,
    the build pushing by digest, each tag read and then set: every argv whole."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    results, log = tmp_path / "results", tmp_path / "docker.jsonl"
    resolved = graph(**{"serve-cpu": target("serve-cpu", "branch-main")})
    env = {"PATH": f"{bin_dir}:{TOOLS_BIN}:{os.environ['PATH']}", "HOME": str(tmp_path), "FAKE_DOCKER_LOG": str(log),
           "FAKE_GRAPH": written(tmp_path, resolved), "REGISTRY": PREFIX, "GIT_SHA": SHA,
           "GIT_REF": "refs/heads/main", "RESULTS_DIR": str(results)}
    proc = subprocess.run(["bash", str(REPO / "ci/pipeline/amd-runner/publish.sh"), "serve-cpu"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    bake = ["buildx", "bake", "-f", "docker-bake.hcl", "-f", "docker-bake.pins.json"]
    assert calls[0] == [*bake, "--print", "serve-cpu"], calls[0]
    digest = "sha256:" + format(1, "064x")
    tags = resolved["target"]["serve-cpu"]["tags"]
    assert calls[1:] == [
        ["buildx", "inspect"],
        [*bake, "--metadata-file", str(results / "bake-metadata.json"),
         "--set=serve-cpu.output=type=image,push=true,compression=zstd,push-by-digest=true,name-canonical=true",
         "serve-cpu"],
        *[["buildx", "imagetools", "inspect", "--format", "{{json .Manifest}}", t] for t in tags],
        *[["buildx", "imagetools", "create", "--tag", t, f"{PREFIX}/serve-cpu@{digest}"] for t in tags]]
    assert (results / "tag.env").read_text() == f"TAG={COMMIT_TAG}\n"
    assert [line for line in proc.stderr.splitlines() if line.startswith("== tagged")] == [
        f"== tagged {t} -> {digest}" for t in tags]


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
