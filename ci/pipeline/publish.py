"""What publishing decides (ci/pipeline/amd-runner/publish.sh and tag.sh run the commands around it).

From the run's settings, before anything runs (the plan): PUBLISH, REGISTRY and GIT_SHA checked, the
images' floating tag named from GIT_REF (a branch's branch-<name>, a git tag's name) and whether
`tools.pins verify` runs with --strict. From the output of `docker buildx inspect`: the builder's
driver. From the resolved graph (`docker buildx bake --print`, publish.sh's bake-print.json): the commit tag
the targets share, and each target's push settings (pushed by digest only; with the engine's own
builder, which cannot, under the scratch tag <name>:unpublished-<commit tag>). Then the tagging of
what was pushed: each target asked for (the graph's default group) with its pushed digest from the
build's metadata, every tag read from the registry before any is set. A tag already on another
digest is refused, nothing tagged, unless PUBLISH_FORCE=1 or the tag is one of MOVABLE_TAGS (a
branch's tag, branch-<name>, follows its newest commit).

JSON is read by rocm_vllm_runtime.files, docker is run by rocm_vllm_runtime.children, and docker's
messages are shown with every URL's credentials masked (rocm_vllm_runtime.secret_values). Each error is
one line; the program prints it as `error: ...` and exits 1.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rocm_vllm_runtime import children, files, secret_values

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# What docker buildx imagetools says of a tag the registry does not have.
ABSENT = re.compile(r"(?i)not found|manifest unknown|name unknown")
# How long one registry question (a tag's manifest) and one tag's creation may take.
INSPECT_TIMEOUT_S = 300.0
CREATE_TIMEOUT_S = 600.0
BRANCH_TAG = re.compile(r"branch-.+")


class PublishError(Exception):
    """One line: what is wrong and what to do."""


@dataclass(frozen=True)
class Step:
    """One tag to set: the target, its pushed image (<image>@<digest>) and the tag."""
    target: str
    ref: str
    tag: str

    @property
    def digest(self) -> str:
        return self.ref.rsplit("@", 1)[1]


# ------------------------------------------------------------------ the run's settings (publish.sh)

COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
# The characters an image tag may hold; any other in a branch or git tag name becomes '-'.
NOT_IN_TAG = re.compile(r"[^A-Za-z0-9_.-]")
TAG_MAX = 128
# The CPU images (docker-bake.hcl: serve-cpu, ci-cpu, group cpu) build from the CPU vLLM image and none of
# the ROCm pins.
CPU_TARGETS = frozenset({"serve-cpu", "ci-cpu", "cpu"})
VERIFY = "python3 -m tools.pins verify"


@dataclass(frozen=True)
class Plan:
    """What publish.sh runs with, one value per line (lines()), in this order."""
    mode: str       # push | print
    registry: str   # REGISTRY without its trailing slash
    sha: str        # GIT_SHA, 40 hex
    tag: str        # the floating tag: branch-<name>, the git tag's name, or "" (another ref)
    movable: str    # the branch's tag, which moves to each new commit (tag.sh's MOVABLE_TAGS), or ""
    strict: bool    # tools.pins verify --strict
    verify: str     # what the verify step says it runs, and why not --strict

    def lines(self) -> list[str]:
        return [self.mode, self.registry, self.sha, self.tag, self.movable, "1" if self.strict else "0", self.verify]


def _shown(value: str) -> str:
    """A setting's value inside a one-line message: as it is, or escaped where it is not printable."""
    return value if value.isprintable() else repr(value)[1:-1]


def publish_mode(environ: Mapping[str, str]) -> str:
    """PUBLISH: push (the default, also when empty) or print."""
    mode = environ.get("PUBLISH", "") or "push"
    if mode not in ("push", "print"):
        raise PublishError(f"PUBLISH={_shown(mode)}: set PUBLISH to push or print")
    return mode


def registry_prefix(environ: Mapping[str, str]) -> str:
    """REGISTRY, the images' repository prefix, without one trailing slash."""
    registry = environ.get("REGISTRY", "")
    if not registry:
        raise PublishError("REGISTRY is not set: set REGISTRY to the repository prefix to push to "
                           "(e.g. ghcr.io/org/rocm-vllm)")
    if registry.startswith("localhost/"):
        raise PublishError(f"REGISTRY '{_shown(registry)}' is not a registry to push to: set REGISTRY "
                           "(e.g. ghcr.io/org/rocm-vllm)")
    if any("A" <= c <= "Z" for c in registry):
        raise PublishError(f"REGISTRY '{_shown(registry)}' has upper-case letters, which image names cannot have: "
                           "set REGISTRY in lower case")
    if any(c.isspace() or not c.isprintable() for c in registry):
        raise PublishError(f"REGISTRY '{_shown(registry)}' has a space or a control character, which image names "
                           "cannot have: set REGISTRY to the repository prefix (e.g. ghcr.io/org/rocm-vllm)")
    return registry.removesuffix("/")


def commit_sha(environ: Mapping[str, str]) -> str:
    """GIT_SHA, the commit being built: 40 lower-case hex (publish.sh fills it from git rev-parse HEAD)."""
    sha = environ.get("GIT_SHA", "")
    if not COMMIT_SHA.fullmatch(sha):
        raise PublishError(f"GIT_SHA '{_shown(sha)}' is not a full 40-hex commit id: set GIT_SHA to the commit "
                           "being built")
    return sha


def floating_tag(ref: str) -> tuple[str, bool]:
    """The images' tag for the git ref and whether it is a branch's: refs/heads/<name> tags
    branch-<name> (it moves to each new commit), refs/tags/<name> tags <name> (it never moves without
    PUBLISH_FORCE=1), any other ref (refs/pull/1/merge) none (""). Characters a tag cannot have become
    '-', leading '.' and '-' go, and the tag is cut at 128 characters. A git tag whose name would fall
    in the branches' namespace (branch-...) is refused: a branch named v1.0 tags branch-v1.0, never the
    release v1.0."""
    kind, _, name = ref.removeprefix("refs/").partition("/") if ref.startswith("refs/") else ("", "", "")
    if kind not in ("heads", "tags"):
        return "", False
    name = NOT_IN_TAG.sub("-", name).lstrip(".-")
    branch = kind == "heads"
    if branch and name:
        name = f"branch-{name}"
    elif name.startswith("branch-"):
        raise PublishError(f"the git tag {_shown(ref.removeprefix('refs/tags/'))} would tag the images {name}, in the "
                           "namespace of branch tags (branch-<branch>, moved by every push to that branch): name "
                           "the release without the branch- prefix")
    return name[:TAG_MAX], branch


def verify_mode(mode: str, targets: Sequence[str]) -> tuple[bool, str]:
    """Whether `tools.pins verify` runs with --strict (every pin resolved: a pushed image), and what the
    verify step says: not for PUBLISH=print, which pushes nothing, nor for CPU images only."""
    if mode == "print":
        return False, f"{VERIFY}; not --strict: PUBLISH=print pushes nothing"
    if all(t in CPU_TARGETS for t in targets):
        return False, f"{VERIFY}; not --strict: the CPU images {' '.join(targets)} build from none of the ROCm pins"
    return True, f"{VERIFY} --strict"


def run_plan(environ: Mapping[str, str], targets: Sequence[str]) -> Plan:
    """publish.sh's settings checked in its order (PUBLISH, REGISTRY, GIT_SHA, GIT_REF or GITHUB_REF,
    the targets), each refusal one line naming the setting."""
    mode = publish_mode(environ)
    registry = registry_prefix(environ)
    sha = commit_sha(environ)
    tag, branch = floating_tag(environ.get("GIT_REF", "") or environ.get("GITHUB_REF", ""))
    if not targets:
        raise PublishError("no target to publish: name bake's targets or groups (e.g. base serve ci)")
    for target in targets:
        if not target or any(c.isspace() or not c.isprintable() for c in target):
            raise PublishError(f"target '{_shown(target)}' is no name of docker-bake.hcl: name bake's targets or "
                               "groups (e.g. base serve ci)")
    strict, verify = verify_mode(mode, targets)
    return Plan(mode, registry, sha, tag, tag if branch and tag else "", strict, verify)


def builder_driver(inspect_output: str) -> str:
    """The driver `docker buildx inspect` names on its first line starting with "Driver:" (the spaces
    after the colon dropped), or "" where it names none (no such builder, or docker failed)."""
    for line in inspect_output.splitlines():
        if line.startswith("Driver:"):
            return line.removeprefix("Driver:").lstrip(" ")
    return ""


# ------------------------------------------------------------------ the resolved graph

def _graph_targets(graph: object) -> dict[str, dict]:
    """The graph's targets; ValueError where it has none of bake's shape."""
    targets = graph.get("target") if isinstance(graph, dict) else None
    if not isinstance(targets, dict) or not all(isinstance(t, dict) for t in targets.values()):
        raise ValueError("no object of targets under 'target'")
    return targets


def _tags(name: str, target: dict) -> list[str]:
    tags = target.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) and ":" in t for t in tags):
        raise ValueError(f"target {name}: tags are not a list of image:tag names")
    return tags


def read_graph(path: str) -> dict[str, dict]:
    """The targets of the graph at path, or PublishError naming it."""
    try:
        targets = _graph_targets(files.read_json(path))
        for name, target in targets.items():
            _tags(name, target)
        return targets
    except (OSError, ValueError) as exc:  # files.DataError is a ValueError
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PublishError(f"{path} is not the graph docker buildx bake --print writes ({why}): see the bake "
                           "output above") from None


def commit_tag(targets: Mapping[str, dict], path: str) -> str:
    """The tag every target's first tag carries (docker-bake.hcl, pushed_tags)."""
    tags = {_tags(name, t)[0].rsplit(":", 1)[1] for name, t in targets.items() if _tags(name, t)}
    if len(tags) != 1:
        raise PublishError(f"the targets of {path} do not share one commit tag: {sorted(tags)}")
    return tags.pop()


def push_settings(targets: Mapping[str, dict], driver: str, tag: str, path: str) -> list[str]:
    """bake's --set arguments that push each target by digest only; with the docker driver (the engine's
    own builder), under the scratch tag <name>:unpublished-<tag> instead."""
    out = []
    for name, target in sorted(targets.items()):
        if driver == "docker":
            tags = _tags(name, target)
            if not tags:
                raise PublishError(f"{path}: target {name} has no tag to push it under: see the bake output above")
            out.append(f"--set={name}.tags={tags[0].rsplit(':', 1)[0]}:unpublished-{tag}")
            continue
        output = target.get("output")
        if not isinstance(output, list) or not output or not all(isinstance(o, str) for o in output):
            raise PublishError(f"{path}: target {name} has no output to push (PUSH=1 gives each one): see the bake "
                               "output above")
        out.append(f"--set={name}.output={','.join(output)},push-by-digest=true,name-canonical=true")
    return out


# ------------------------------------------------------------------ tagging

def asked(graph: dict) -> set[str]:
    """The targets asked for: the graph's default group, its groups expanded (a target that is only
    another's context, base for serve, is built, not published)."""
    targets = graph["target"]
    groups = {name: list(group.get("targets") or []) for name, group in (graph.get("group") or {}).items()
              if isinstance(group, dict)}
    found: set[str] = set()
    todo = list(groups.get("default", sorted(targets)))
    while todo:
        name = todo.pop()
        if name in groups and name not in targets:
            todo += groups.pop(name)
        else:
            found.add(name)
    return found


def plan(graph_path: str, metadata_path: str) -> list[Step]:
    """Every tag of every target asked for, with the digest the build pushed."""
    try:
        graph = files.read_json(graph_path)
        targets = _graph_targets(graph)
        metadata = files.read_json(metadata_path)
        wanted = asked(graph)
        steps = []
        for name, target in sorted(targets.items()):
            if name not in wanted:
                continue
            built = metadata.get(name) if isinstance(metadata, dict) else None
            digest = built.get("containerimage.digest", "") if isinstance(built, dict) else ""
            if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
                raise PublishError(f"{name} has no pushed digest in {metadata_path} (its build or push failed): "
                                   "nothing tagged")
            for tag in _tags(name, target):
                image = tag.rsplit(":", 1)[0] if ":" in tag.rsplit("/", 1)[-1] else tag
                steps.append(Step(name, f"{image}@{digest}", tag))
        return steps
    except (OSError, ValueError, TypeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PublishError(f"cannot read the graph {graph_path} or the build metadata {metadata_path} ({why}): "
                           "nothing tagged") from None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return secret_values.masked_url(lines[-1]) if lines else ""


def _failure(out: children.Output, limit_s: float) -> str:
    if out.error:
        return f"cannot run docker: {out.error}"
    if out.timed_out:
        return f"no answer within {limit_s:g} s"
    return _last_line(out.stderr) or _last_line(out.stdout) or f"exit code {out.returncode}"


def current_digest(docker: str, tag: str) -> str | None:
    """The digest tag points to in its registry; None where the registry has no such tag. docker's answer
    (stdout, the manifest's JSON) is read apart from its messages (stderr): a warning or a registry's
    JSON error body is never read as the manifest."""
    out = children.output([docker, "buildx", "imagetools", "inspect", "--format", "{{json .Manifest}}", tag],
                          INSPECT_TIMEOUT_S)
    if out.returncode == 0 and not out.timed_out:
        try:
            manifest = files.json_value(out.stdout, "the answer")
            digest = manifest.get("digest") if isinstance(manifest, dict) else manifest
        except files.DataError as exc:
            digest = exc.detail
        if isinstance(digest, str) and DIGEST.fullmatch(digest):
            return digest
        raise PublishError(f"cannot read tag {tag} from its registry (the answer of docker buildx imagetools "
                           f"inspect is not a manifest with a sha256 digest: {str(digest)[:80]!r}): nothing tagged")
    if not out.error and not out.timed_out and ABSENT.search(out.stderr):
        return None
    raise PublishError(f"cannot read tag {tag} from its registry ({_failure(out, INSPECT_TIMEOUT_S)}): nothing tagged")


def tag_settings(environ: Mapping[str, str]) -> tuple[bool, list[str]]:
    """PUBLISH_FORCE (0 or 1) and MOVABLE_TAGS (branch tags only), or PublishError naming the setting."""
    force = environ.get("PUBLISH_FORCE", "") or "0"
    if force not in ("0", "1"):
        raise PublishError(f"PUBLISH_FORCE={force}: set 0 or 1")
    movable = environ.get("MOVABLE_TAGS", "").split()
    for name in movable:
        if not BRANCH_TAG.fullmatch(name):
            raise PublishError(f"MOVABLE_TAGS names {name}, which is no branch's tag (branch-<name>): only a branch's "
                               "tag moves without PUBLISH_FORCE=1")
    return force == "1", movable


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def checked(steps: Sequence[Step], docker: str, force: bool, movable: Sequence[str]) -> list[Step]:
    """The steps to take once every tag was read: a tag that is new or already on the pushed digest, or
    moved (PUBLISH_FORCE=1, or a movable branch tag). A tag on another digest otherwise: PublishError
    naming every such tag, before anything is tagged."""
    to_set, refused = [], []
    for step in steps:
        have = current_digest(docker, step.tag)
        if have is None or have == step.digest:
            to_set.append(step)
            continue
        is_movable = step.tag.rsplit(":", 1)[-1] in movable
        if force or is_movable:
            why = "a branch's tag" if is_movable else "PUBLISH_FORCE=1"
            _say(f"== moving {step.tag} from {have} to {step.digest} ({why})")
            to_set.append(step)
        else:
            refused.append(f"{step.tag} points to {have}, not {step.digest}")
    if refused:
        raise PublishError(f"{'; '.join(refused)}: nothing tagged; set PUBLISH_FORCE=1 to move them")
    return to_set


def set_tags(steps: Sequence[Step], docker: str) -> None:
    for step in steps:
        out = children.output([docker, "buildx", "imagetools", "create", "--tag", step.tag, step.ref],
                              CREATE_TIMEOUT_S)
        if out.error or out.timed_out or out.returncode != 0:
            raise PublishError(f"tagging {step.tag} failed ({_failure(out, CREATE_TIMEOUT_S)})")
        _say(f"== tagged {step.tag} -> {step.digest}")


def tag(graph_path: str, metadata_path: str, environ: Mapping[str, str] = os.environ) -> None:
    """tag.sh: every tag of the graph checked against the registry, then set."""
    force, movable = tag_settings(environ)
    docker = environ.get("DOCKER", "") or "docker"
    set_tags(checked(plan(graph_path, metadata_path), docker, force, movable), docker)
