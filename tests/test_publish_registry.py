"""The CI-pipeline path for real, through a real registry (marker `docker`): the CPU serve image
published by the pipeline's scripts, then taken by a consumer as a user's CI would.

Machines (ci/test-machine, started by .ci/run): the reference registry (Debian's docker-registry on
127.0.0.1, basic auth, TEST_REGISTRY and TEST_REGISTRY_AUTH), cosign, and two engines: the tests'
engine (DOCKER_HOST, the classic image store: the consumer) and a publishing engine with the
containerd image store (PUBLISH_DOCKER_HOST), whose own builder pushes provenance attestations and
registry build cache without a builder image from a registry.

1. The CPU vLLM image (the integration test's) is pushed once: the serve image's big base layers,
   moved into the publishing engine and pushed from there uncompressed (no gzip of 3 GB).
2. publish.sh resolves the graph of serve-cpu with PUSH=1 (PUBLISH=print: its tags, registry cache
   refs and attestations); the publishing engine builds it with those settings (plus --network host,
   which bake 0.13 cannot give), pushes it by digest with the registry build cache and a provenance
   attestation (mode=max), and publish.sh's tagging step (amd-runner/tag.sh) sets the tags.
   SBOM_NOT_MADE says which attestation is not made here and why.
3. The consumer: the image absent from its engine, pulled by digest; its provenance names this
   commit (docker buildx imagetools inspect); its cosign signature (a key made here) verifies, and a
   key of another does not; compose serves it from that digest.
4. A second build of the same commit, in a second copy of the sources made at another time, with
   the publishing engine's build cache emptied: every step comes from the registry cache and the
   image's own layers are the same blobs; its new index (its provenance records other build times)
   is refused the commit tag until PUBLISH_FORCE=1.
5. Failures a user meets: a wrong credential (one line, the password never printed); a registry
   that does not answer (one line from publish.sh, nothing tagged).

Figures go to the terminal summary."""
from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import test_engine_integration as integration
from test_engine_integration import (COMPOSE_FILES, ROOT, build_command, copy_context, free_port,
                                     steps_of)
from vllm_sdist import cpu_track

# The integration test's fixtures (pytest collects fixtures among a module's globals).
h, cpu_vllm_image, context_dir = integration.h, integration.cpu_vllm_image, integration.context_dir

pytestmark = pytest.mark.docker
ENGINE_LOG_SUFFIX = "registry"
PROJECT = "rocm-vllm-registry"
TARGET = "serve-cpu"
SBOM_NOT_MADE = ("SBOM attestation not made on this machine: BuildKit's SBOM generator is an image "
                 "(docker/buildkit-syft-scanner) pulled from Docker Hub, which CI machines do not reach; "
                 "the graph keeps type=sbom for AMD runners")
SCRIPTS = ROOT / "ci/pipeline/amd-runner"


def git_commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0 or len(proc.stdout.strip()) != 40:
        pytest.skip("not a git checkout: the published image is tagged with this commit")
    return proc.stdout.strip()


class Client:
    """A docker client of one engine with its own client config (its own registry login)."""

    def __init__(self, h, host: str, config: Path):
        self.h, self.host, self.config = h, host, config
        config.mkdir(parents=True, exist_ok=True)
        plugins = config / "cli-plugins"
        plugins.mkdir(exist_ok=True)
        source = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "cli-plugins"
        for name in ("docker-buildx", "docker-compose"):
            if (source / name).exists() and not (plugins / name).exists():
                (plugins / name).symlink_to((source / name).resolve())
        (config / "config.json").write_text("{}")

    @property
    def env(self) -> dict[str, str]:
        """The scripts' python3 is this test environment's (the runtime package installed), as under
        uv run --locked --project tools it is the tools' environment's."""
        keep = ("HOME", "LANG", "TMPDIR", "CA_BUNDLE")
        return {**{k: v for k, v in os.environ.items() if k in keep},
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
                "DOCKER_HOST": self.host, "DOCKER_CONFIG": str(self.config)}

    def run(self, cmd, **kw):
        return self.h.run(cmd, env={**self.env, **kw.pop("env", {})}, **kw)

    def login(self, registry: str, user: str, password: str) -> None:
        proc = subprocess.run(["docker", "login", "--username", user, "--password-stdin", registry],
                              input=password, capture_output=True, text=True, env=self.env, timeout=60)
        assert proc.returncode == 0, proc.stderr[-1000:]


@pytest.fixture(scope="module")
def registry(h):
    address, auth, publisher = (os.environ.get(k, "") for k in ("TEST_REGISTRY", "TEST_REGISTRY_AUTH",
                                                                 "PUBLISH_DOCKER_HOST"))
    # each session publishes under its own namespace: a registry kept between runs holds this
    # commit's tags from an earlier one (which tag.sh would rightly refuse to move)
    if not address or not auth or not publisher:
        pytest.skip("no test registry or publishing engine (bash ci/test-machine/registry.sh start; eval \"$(bash "
                    "ci/test-machine/registry.sh env)\"; DOCKER_ENGINE_ROOT=/var/lib/rocm-vllm-publish-engine "
                    "DOCKER_ENGINE_CONTAINERD_STORE=1 bash ci/test-machine/docker-engine.sh start, its `host` as "
                    "PUBLISH_DOCKER_HOST: .ci/run does it)")
    for tool in ("cosign",):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (bash ci/test-machine/registry.sh start installs it)")
    user, password = Path(auth).read_text().splitlines()[:2]
    return {"address": address, "user": user, "password": password, "publisher": publisher,
            "prefix": f"{address}/run-{secrets.token_hex(4)}/rocm-vllm"}


@pytest.fixture(scope="module")
def clients(h, registry, tmp_path_factory):
    folder = tmp_path_factory.mktemp("clients")
    publisher = Client(h, registry["publisher"], folder / "publisher")
    consumer = Client(h, os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"), folder / "consumer")
    for client in (publisher, consumer):
        client.login(registry["address"], registry["user"], registry["password"])
    info = publisher.run(["docker", "info", "--format", "{{json .DriverStatus}}"], what="publishing engine store")
    assert "io.containerd.snapshotter" in info.stdout, \
        f"the publishing engine has no containerd image store: {info.stdout}"
    return {"publisher": publisher, "consumer": consumer}


def index_of(client: Client, ref: str) -> dict:
    """The registry's manifest of ref (an image index) and its digest, as imagetools reads them."""
    proc = client.run(["docker", "buildx", "imagetools", "inspect", "--format", "{{json .Manifest}}", ref],
                      what=f"imagetools inspect {ref}")
    return json.loads(proc.stdout)


def graph_of(h, registry, sha: str, base: str, results: Path, env: dict) -> dict:
    """publish.sh's resolved graph (PUBLISH=print) of serve-cpu for the test registry."""
    settings = {"PUBLISH": "print", "REGISTRY": registry["prefix"], "GIT_SHA": sha,
                "GIT_REF": "refs/heads/main", "TRACK": cpu_track(), "VLLM_CPU_IMAGE": base,
                "RESULTS_DIR": str(results), "PYTHON": "python3"}
    h.run(["bash", SCRIPTS / "publish.sh", TARGET], env={**env, **settings}, what="publish.sh (PUBLISH=print)")
    return json.loads((results / "bake-print.json").read_text())


def push_command(target: dict, metadata: Path) -> tuple[list[str], list[str]]:
    """The graph's target as `docker buildx build --network host` on the publishing engine, as
    publish.sh has bake push it there (the engine's own builder cannot push by digest): under the
    scratch tag <name>:unpublished-<commit tag> only (tag.sh sets its tags afterwards), with its
    registry cache and attestations. Returns the command and the attestations left out."""
    (output,) = target["output"]
    assert "push=true" in output.split(","), target["output"]
    image = target["tags"][0].rsplit(":", 1)[0]
    made, not_made = [], []
    for attest in target.get("attest", []):
        (not_made if attest.split(",")[0] == "type=sbom" else made).append(attest)
    extra = [arg for a in made for arg in ("--attest", a)]
    extra += [arg for c in target.get("cache-from", []) for arg in ("--cache-from", c)]
    extra += [arg for c in target.get("cache-to", []) for arg in ("--cache-to", c)]
    extra += ["--metadata-file", str(metadata)]
    out = f"{output},name={image}:unpublished-{target['tags'][0].rsplit(':', 1)[1]}"
    # build_command gives the graph's args, labels, named contexts and the CA secret
    cmd = build_command({**target, "contexts": {}}, None, extra, output=out)
    base = target["contexts"]["base"]
    return cmd[:-1] + ["--build-context", f"base={base}", "."], not_made


@pytest.fixture(scope="module")
def base_pushed(h, registry, clients, cpu_vllm_image):
    """1. The base layers, once: the CPU vLLM image from the tests' engine, moved into the publishing
    engine as it is (docker save | docker load) and pushed from there with its layers as loaded
    (uncompressed OCI layers): the tests' engine would gzip 3 GB on the way (minutes of CPU on 2 cores).
    The publishing engine keeps it under its ref until the end (its build finds the base's layers
    there); the consumer already holds the same image (the same config)."""
    publisher, consumer = clients["publisher"], clients["consumer"]
    ref = f"{registry['prefix']}/vllm-cpu:{cpu_vllm_image.rsplit(':', 1)[1]}"
    move = publisher.run(["bash", "-o", "pipefail", "-c", 'docker --host "$1" save "$2" | docker load --quiet',
                          "move", consumer.host, cpu_vllm_image], timeout=1800,
                         what="move the CPU vLLM image into the publishing engine")
    publisher.run(["docker", "tag", cpu_vllm_image, ref], what="tag the CPU vLLM image")
    publisher.run(["docker", "image", "rm", cpu_vllm_image], what="untag its local name")
    push = publisher.run(["docker", "push", "--quiet", ref], timeout=1800, what="push the CPU vLLM image")
    size = int(integration.inspect(cpu_vllm_image, "{{.Size}}")) / 1e9
    h.note(f"registry 1: CPU vLLM image ({size:.2f} GB) moved into the publishing engine {move.seconds:.1f}s, "
           f"pushed to {registry['address']} (layers as loaded, uncompressed) {push.seconds:.1f}s")
    yield {"ref": ref, "pinned": f"{ref}@{index_of(consumer, ref)['digest']}"}
    # what this session named in the two engines (the registry's storage goes with the registry);
    # layers shared with other images stay
    for client in (publisher, consumer):
        fmt = "{{.Repository}} {{.Tag}} {{.Digest}}"
        listed = subprocess.run(["docker", "image", "ls", "--digests", "--format", fmt],
                                capture_output=True, text=True, env=client.env)
        names = sorted({f"{name}:{tag}" if tag != "<none>" else f"{name}@{digest}"
                        for name, tag, digest in (line.split() for line in listed.stdout.splitlines() if line.strip())
                        if name.startswith(f"{registry['prefix']}/")})
        if names:
            subprocess.run(["docker", "image", "rm", *names], capture_output=True, env=client.env)


def image_manifest(client: Client, ref: str) -> dict:
    """The registry's image manifest of ref (of its linux/amd64 entry when ref is an index)."""
    raw = json.loads(client.run(["docker", "buildx", "imagetools", "inspect", "--raw", ref],
                                what=f"manifest of {ref}").stdout)
    if "manifests" not in raw:
        return raw
    (entry,) = [m for m in raw["manifests"] if m.get("platform", {}).get("architecture") == "amd64"]
    return image_manifest(client, f"{ref.split('@', 1)[0]}@{entry['digest']}")


def test_the_base_is_pushed_once_uncompressed_as_the_consumer_holds_it(h, clients, cpu_vllm_image, base_pushed):
    """The serve image's base in the registry is the consumer's CPU vLLM image itself (the same config,
    so the consumer's pull later fetches none of its 3 GB), its layers uncompressed as loaded."""
    manifest = image_manifest(clients["consumer"], base_pushed["pinned"])
    assert manifest["config"]["digest"] == integration.inspect(cpu_vllm_image, "{{.Id}}"), manifest["config"]
    kinds = {layer["mediaType"] for layer in manifest["layers"]}
    assert kinds <= {"application/vnd.oci.image.layer.v1.tar", "application/vnd.docker.image.rootfs.diff.tar"}, kinds
    assert len(manifest["layers"]) == len(json.loads(integration.inspect(cpu_vllm_image, "{{json .RootFS.Layers}}")))


@pytest.fixture(scope="module")
def published(h, registry, clients, base_pushed, context_dir, tmp_path_factory):
    publisher = clients["publisher"]
    sha = git_commit()
    repo = registry["prefix"]
    base = base_pushed["pinned"]

    # 2. publish.sh's graph, built and pushed by the publishing engine, tagged by tag.sh
    results = tmp_path_factory.mktemp("publish")
    graph = graph_of(h, registry, sha, base, results, publisher.env)
    target = graph["target"][TARGET]
    assert target["args"]["VCS_REF"] == sha and target["contexts"] == {"base": f"docker-image://{base}"}
    metadata = results / "build-metadata.json"
    cmd, not_made = push_command(target, metadata)
    assert not_made == ["type=sbom"], not_made
    build = publisher.run(cmd, cwd=context_dir, timeout=1800, what="serve-cpu build and push (publishing engine)")
    executed, cached = steps_of(build.stderr)
    built = json.loads(metadata.read_text())
    (results / "bake-metadata.json").write_text(json.dumps({TARGET: built}))
    tag = publisher.run(["bash", SCRIPTS / "tag.sh", results / "bake-print.json", results / "bake-metadata.json"],
                        env={"MOVABLE_TAGS": "branch-main"}, what="tag.sh")
    digest = built["containerimage.digest"]
    h.note(f"registry 2: serve-cpu built and pushed by digest with registry cache and provenance "
           f"(publishing engine, containerd image store): {build.seconds:.1f}s, {len(executed)} steps run, "
           f"{len(cached)} cached; tagged {len(target['tags'])} tags: {tag.seconds:.1f}s; digest {digest[:19]}")
    h.note(f"  {SBOM_NOT_MADE}")
    yield {"sha": sha, "repo": repo, "base": base, "graph": graph, "target": target, "digest": digest,
           "ref": f"{repo}/{TARGET}@{digest}", "results": results, "build_s": build.seconds}


def test_pushed_with_its_tags_cache_and_provenance(h, clients, published):
    """Every tag of the graph points to the pushed digest; the index holds the image and its
    provenance attestation; the registry cache ref exists; the provenance names this commit."""
    publisher = clients["publisher"]
    for tag in published["target"]["tags"]:
        assert index_of(publisher, tag)["digest"] == published["digest"], tag
    index = index_of(publisher, published["ref"])
    kinds = [m.get("annotations", {}).get("vnd.docker.reference.type", m.get("platform", {}).get("architecture"))
             for m in index["manifests"]]
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json" and "attestation-manifest" in kinds, kinds
    for cache in published["target"]["cache-to"]:
        ref = dict(p.split("=", 1) for p in cache.split(",") if "=" in p)["ref"]
        publisher.run(["docker", "buildx", "imagetools", "inspect", "--raw", ref], what=f"cache {ref}")
    h.note(f"registry 3: tags {', '.join(t.rsplit(':', 1)[1] for t in published['target']['tags'])} -> "
           f"{published['digest'][:19]}; index: {kinds}; registry cache present")


def provenance(client: Client, ref: str) -> dict:
    proc = client.run(["docker", "buildx", "imagetools", "inspect", "--format", "{{json .Provenance}}", ref],
                      what=f"provenance of {ref}")
    return json.loads(proc.stdout)["SLSA"]


def test_consumer_pulls_by_digest_verifies_provenance_and_signature_and_serves(h, registry, clients, published,
                                                                              tmp_path):
    consumer = clients["consumer"]
    ref, sha = published["ref"], published["sha"]
    # the consumer's engine has no such image before the pull (its base layers it may have)
    absent = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, env=consumer.env)
    assert absent.returncode != 0, f"{ref} is in the consumer's engine before the pull"
    # provenance: what a consumer checks before running an image
    slsa = provenance(consumer, ref)
    params = slsa["invocation"]["parameters"]["args"]
    assert params.get("build-arg:VCS_REF") == sha, params
    assert params.get("label:org.opencontainers.image.revision") == sha, params
    assert slsa["metadata"]["completeness"]["parameters"] is True
    # a signature, made with a key pair made here; another key does not verify it
    keys = tmp_path / "keys"
    keys.mkdir()
    cosign_env = {**consumer.env, "COSIGN_PASSWORD": secrets.token_hex(8)}
    for name in ("signer", "other"):
        h.run(["cosign", "generate-key-pair", "--output-key-prefix", keys / name], env=cosign_env, cwd=keys,
              what=f"cosign key pair {name}")
    sign = h.run(["cosign", "sign", "--yes", "--key", keys / "signer.key", "--allow-http-registry",
                  "--tlog-upload=false", ref], env=cosign_env, what="cosign sign")
    verify = h.run(["cosign", "verify", "--key", keys / "signer.pub", "--allow-http-registry",
                    "--insecure-ignore-tlog=true", ref], env=consumer.env, what="cosign verify")
    claims = json.loads(verify.stdout.strip().splitlines()[-1])
    assert [c["critical"]["image"]["docker-manifest-digest"] for c in claims] == [published["digest"]], claims
    other = h.run(["cosign", "verify", "--key", keys / "other.pub", "--allow-http-registry",
                   "--insecure-ignore-tlog=true", ref], env=consumer.env, check=False, what="cosign verify, other key")
    assert other.returncode != 0, other.stdout
    # pulled by digest
    pull = consumer.run(["docker", "pull", "--quiet", ref], timeout=1800, what="docker pull by digest")
    labels = json.loads(subprocess.run(["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", ref],
                                       capture_output=True, text=True, env=consumer.env, check=True).stdout)
    assert labels["org.opencontainers.image.revision"] == sha, labels
    h.note(f"registry 4: consumer: provenance names {sha[:12]} (build-arg VCS_REF, revision label); cosign "
           f"signature verifies ({sign.seconds:.1f}s sign, {verify.seconds:.1f}s verify), another key does not; "
           f"pulled by digest in {pull.seconds:.1f}s")

    # served by compose from that digest (the shipped CPU override and the tests' additions)
    port = free_port()
    env = {**consumer.env, "RENDER_GID": "0", "SERVE_CPU_IMAGE": ref, "SELFTEST_CPU_IMAGE": ref,
           "VLLM_PORT": str(port), "SELFTEST_RESULTS": str(tmp_path), **integration.CACHE_VOLUMES}
    files = [arg for name in COMPOSE_FILES for arg in ("-f", ROOT / name)]
    compose = ["docker", "compose", "-p", PROJECT, "--project-directory", ROOT, "--env-file", os.devnull, *files]
    h.run([*compose, "down", "--remove-orphans"], env=env, check=False, what="clean leftovers")
    try:
        up = h.run([*compose, "up", "--detach", "--wait", "--wait-timeout", "900", "vllm"], env=env, timeout=1000,
                   check=False, what="compose up --wait (pulled image)")
        if up.returncode != 0:
            logs = h.run([*compose, "logs", "--no-color", "--tail", "60"], env=env, check=False)
            pytest.fail(f"compose up --wait failed (rc={up.returncode}):\n{up.stderr[-1500:]}\n{logs.stdout[-3000:]}")
        running = h.run([*compose, "images", "--format", "json"], env=env, what="compose images").stdout
        image_id = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", ref], capture_output=True,
                                  text=True, env=consumer.env, check=True).stdout.strip()
        assert image_id.split(":")[-1][:12] in running, (image_id, running)
        body = integration.complete(f"http://127.0.0.1:{port}", [5, 3, 9], 8)
        tokens = body["choices"][0]["token_ids"]
        assert len(tokens) == 8, body
        logs = h.run([*compose, "logs", "--no-color"], env=env, check=False).stdout
        assert "vllm-aiter-mla CPU development mode" in logs and "Using CPU_MLA backend" in logs
        h.note(f"registry 5: compose served the pulled image {ref.rsplit('/', 1)[1][:30]}...: healthy after "
               f"{up.seconds:.1f}s, 8 tokens from the backend's CPU development mode")
    finally:
        h.run([*compose, "down", "--remove-orphans"], env=env, check=False, what="compose down")


def manifest_layers(client: Client, ref: str) -> list[str]:
    """The layer blob digests of the linux/amd64 image of ref."""
    manifest = json.loads(client.run(["docker", "buildx", "imagetools", "inspect", "--raw", ref],
                                     what=f"raw {ref}").stdout)
    if "manifests" in manifest:  # an index: its image for linux/amd64
        (image,) = [m for m in manifest["manifests"] if m.get("platform", {}).get("architecture") == "amd64"]
        manifest = json.loads(client.run(["docker", "buildx", "imagetools", "inspect", "--raw",
                                          f"{ref.split('@')[0]}@{image['digest']}"], what="raw image manifest").stdout)
    return [layer["digest"] for layer in manifest["layers"]]


def test_second_build_from_the_registry_cache_is_identical_and_tags_are_guarded(h, registry, clients, published,
                                                                               context_dir, tmp_path_factory):
    publisher = clients["publisher"]
    # no local build cache on the publishing engine: what is reused comes from the registry
    publisher.run(["docker", "builder", "prune", "--all", "--force"], what="empty the publishing engine's build cache")
    second = copy_context(tmp_path_factory.mktemp("context-second-clone"), mtime=946684800 + random.randrange(10**8),
                          source=context_dir)
    results = tmp_path_factory.mktemp("publish-second")
    graph = graph_of(h, registry, published["sha"], published["base"], results, publisher.env)
    assert graph == published["graph"], "the same commit resolved to another graph"
    metadata = results / "build-metadata.json"
    cmd, _ = push_command(graph["target"][TARGET], metadata)
    build = publisher.run(cmd, cwd=second, timeout=1800, what="serve-cpu second build (registry cache)")
    executed, cached = steps_of(build.stderr)
    digest = json.loads(metadata.read_text())["containerimage.digest"]
    (results / "bake-metadata.json").write_text(json.dumps({TARGET: json.loads(metadata.read_text())}))
    first_layers = manifest_layers(publisher, published["ref"])
    again_layers = manifest_layers(publisher, f"{published['repo']}/{TARGET}@{digest}")
    base_layers = manifest_layers(publisher, published["base"])
    owned = len(first_layers) - len(base_layers)
    same = sum(a == b for a, b in zip(first_layers[len(base_layers):], again_layers[len(base_layers):]))
    h.note(f"registry 6: second build of {published['sha'][:12]} (another copy, build cache emptied): "
           f"{build.seconds:.1f}s (first {published['build_s']:.1f}s), {len(executed)} steps run, {len(cached)} "
           f"from the registry cache; {same} of {owned} own layers the same blobs; index {digest[:19]}")
    assert executed == [], f"steps not taken from the registry cache: {executed}"
    assert first_layers[:len(base_layers)] == base_layers and again_layers == first_layers

    # the commit tag already points to the first index: refused, nothing tagged, one line
    tag = ["bash", SCRIPTS / "tag.sh", results / "bake-print.json", results / "bake-metadata.json"]
    commit_tag = published["target"]["tags"][0]
    if digest == published["digest"]:
        pytest.fail("the second build's index equals the first: no other digest to refuse (provenance times?)")
    refused = publisher.run(tag, check=False, what="tag.sh, tag points to another digest")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(lines) == 1, refused.stderr
    assert commit_tag in lines[0] and published["digest"] in lines[0] and "PUBLISH_FORCE=1" in lines[0], lines
    for t in published["target"]["tags"]:
        assert index_of(publisher, t)["digest"] == published["digest"], f"{t} moved although refused"
    forced = publisher.run(tag, env={"PUBLISH_FORCE": "1"}, what="tag.sh, PUBLISH_FORCE=1")
    assert index_of(publisher, commit_tag)["digest"] == digest, forced.stderr
    h.note(f"registry 7: tag.sh refused moving {commit_tag.rsplit(':', 1)[1]} to the second index in one line; "
           "PUBLISH_FORCE=1 moved it")


def test_wrong_credential_is_one_line_and_never_printed(h, registry, tmp_path):
    wrong = secrets.token_hex(16)
    config = Client(h, os.environ.get("DOCKER_HOST", ""), tmp_path / "config")
    env = {**config.env, "REGISTRY": registry["prefix"], "REGISTRY_USERNAME": registry["user"],
           "REGISTRY_PASSWORD": wrong}
    proc = h.run(["bash", SCRIPTS / "login.sh", "echo", "should not run"], env=env, check=False,
                 what="login.sh, wrong password")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "should not run" not in proc.stdout, proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: docker login to {registry['address']} as "), lines
    assert wrong not in proc.stdout + proc.stderr and registry["password"] not in proc.stdout + proc.stderr
    h.note(f"registry 8: wrong credential: {lines[0][:160]}")


def test_registry_down_stops_publish_in_one_line_nothing_tagged(h, registry, clients, published, tmp_path):
    """publish.sh against a registry that does not answer (a port nothing listens on): the build
    cannot even take its base from there; one line names the failure and that nothing was tagged."""
    down = f"127.0.0.1:{free_port()}"
    env = {**clients["publisher"].env, "REGISTRY": f"{down}/rocm-vllm", "GIT_SHA": published["sha"],
           "GIT_REF": "refs/heads/main", "TRACK": cpu_track(), "RESULTS_DIR": str(tmp_path),
           "VLLM_CPU_IMAGE": f"{down}/rocm-vllm/vllm-cpu@{published['base'].split('@')[1]}"}
    proc = h.run(["bash", SCRIPTS / "publish.sh", TARGET], env=env, check=False, timeout=600,
                 what="publish.sh, registry down")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert last.startswith(f"error: the build or its push to {down}/rocm-vllm failed"), last
    assert "nothing tagged" in last, last
    assert "== tagged" not in proc.stderr
    h.note(f"registry 9: registry down: {last}")


def test_registry_script_serves_on_loopback_with_auth_and_removes_its_storage(tmp_path):
    """ci/test-machine/registry.sh on its own state folder: 127.0.0.1 only, 401 without credentials and
    200 with those of its 0600 file, the password in no output or log; `stop` frees the port and
    removes the storage."""
    if shutil.which("docker-registry") is None or shutil.which("htpasswd") is None:
        pytest.skip("docker-registry or htpasswd not installed (bash ci/test-machine/registry.sh start installs them)")
    import base64  # noqa: PLC0415
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    script = ROOT / "ci/test-machine/registry.sh"
    env = {**os.environ, "REGISTRY_STATE": str(tmp_path / "state"), "TMPDIR": str(tmp_path),
           "REGISTRY_NO_INSTALL": "1"}

    def registry(*args):
        return subprocess.run(["bash", script, *args], env=env, capture_output=True, text=True, timeout=120)

    started = registry("start")
    try:
        assert started.returncode == 0, started.stderr
        lines = dict(line.removeprefix("export ").split("=", 1) for line in registry("env").stdout.splitlines())
        host, port = lines["TEST_REGISTRY"].split(":")
        auth = Path(lines["TEST_REGISTRY_AUTH"])
        assert host == "127.0.0.1" and oct(auth.stat().st_mode & 0o777) == "0o600"
        user, password = auth.read_text().splitlines()
        assert f"addr: 127.0.0.1:{port}" in (tmp_path / "state/config.yml").read_text()
        url = f"http://127.0.0.1:{port}/v2/"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 401
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Basic {token}"}),
                                    timeout=10) as resp:
            assert resp.status == 200
        (storage,) = tmp_path.glob("rocm-vllm-registry.*")
        assert registry("status").returncode == 0
    finally:
        stopped = registry("stop")
    assert stopped.returncode == 0, stopped.stderr
    logs = "".join([started.stdout, started.stderr, stopped.stdout, stopped.stderr,
                    (tmp_path / "state/registry.log").read_text()])
    assert password not in logs
    assert not storage.exists() and registry("status").returncode != 0
    assert registry("env").returncode != 0
