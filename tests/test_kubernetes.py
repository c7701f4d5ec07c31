"""deploy/kubernetes: every overlay renders with `kubectl kustomize` and validates offline against
the Kubernetes API schemas (kubernetes-validate, strict: unknown fields fail), and the settings a
ROCm server needs are in the rendered objects. The overlays render from a copy of deploy/kubernetes
with base/secrets.env written as docs/multi-host.md says (the file the Secret is made from; without it the
render stops, naming it). The LeaderWorkerSet's leader and worker scripts run as rendered against
stand-ins for Ray and the entrypoint (tests/ray_stand_ins.py). tests/test_kubernetes_run.py runs the
rendered containers on Docker.

LeaderWorkerSet is a custom resource whose CRD schema is not packaged on PyPI, Debian or npm:
its pod templates (leader and worker) are validated as core PodTemplates, and its own fields
against the small hand-written schema below (field names and enums of leaderworkerset.x-k8s.io/v1).
kubectl: `bash ci/test-machine/k8s-tools.sh install`."""
from __future__ import annotations

import base64
import copy
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import ray_stand_ins

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -r tests/requirements.txt")
yaml = pytest.importorskip("yaml", reason="pip install -r tests/requirements.txt")

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy/kubernetes"
OVERLAYS = ("replicas", "multinode")
# kubectl 1.32 (Debian trixie's kubernetes-client) and the newest schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.32", "1.37")
LWS_API = "leaderworkerset.x-k8s.io/v1"
STARTUP_BUDGET_S = 1800  # a DeepSeek-size model loads for many minutes (compose's HEALTH_START_PERIOD)
CACHES = {"/var/cache/huggingface", "/var/cache/aiter-jit"}
VIDEO_GID = 44
SECRETS_ENV = "base/secrets.env"  # the file the Secret is made from: the user creates it (docs/multi-host.md)
TEST_SECRETS = "VLLM_API_KEY=test-key-0123456789\n"

# Hand-written: the fields of LeaderWorkerSet v1 this project uses and their allowed values; any
# other field fails (the pod templates themselves are validated with the core schemas).
LWS_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": LWS_API},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["leaderWorkerTemplate"],
            "additionalProperties": False,
            "properties": {
                "replicas": {"type": "integer", "minimum": 0},
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "rolloutStrategy": {"type": "object"},
                "networkConfig": {"type": "object"},
                "leaderWorkerTemplate": {
                    "type": "object",
                    "required": ["workerTemplate", "size"],
                    "additionalProperties": False,
                    "properties": {
                        "size": {"type": "integer", "minimum": 1},
                        "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "None", "Default"]},
                        "leaderTemplate": {"type": "object"},
                        "workerTemplate": {"type": "object"},
                        "subGroupPolicy": {"type": "object"},
                    },
                },
            },
        },
    },
}


def kubectl() -> str:
    path = shutil.which("kubectl")
    if not path:
        pytest.skip("kubectl not found: bash ci/test-machine/k8s-tools.sh install")
    return path


def kustomize(directory: Path, check: bool = True):
    proc = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if not check:
        return proc
    assert proc.returncode == 0, f"kubectl kustomize {directory}: {proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def deploy_copy(dest: Path, secrets: str | None = TEST_SECRETS) -> Path:
    """deploy/kubernetes copied to dest/kubernetes, with base/secrets.env holding `secrets` (None: no file)."""
    tree = dest / "kubernetes"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secrets.env"))
    if secrets is not None:
        (tree / SECRETS_ENV).write_text(secrets)
    return tree


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    tree = deploy_copy(tmp_path_factory.mktemp("deploy"))
    return {name: kustomize(tree / "overlays" / name) for name in OVERLAYS}


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} rendered"
    return found[0]


def pod_templates(obj: dict) -> dict[str, dict]:
    """{role: PodTemplateSpec} of a workload."""
    if obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        return {"leader": lwt["leaderTemplate"], "worker": lwt["workerTemplate"]}
    return {"pod": obj["spec"]["template"]}


def schema_errors(obj: dict) -> list[str]:
    """Offline validation against the Kubernetes API schemas of every version in KUBERNETES_VERSIONS.
    A LeaderWorkerSet: LWS_SCHEMA for its own fields, each pod template as a core v1 PodTemplate."""
    if obj.get("apiVersion") == LWS_API:
        errors = [f"LeaderWorkerSet: {e.message} at {list(e.absolute_path)}"
                  for e in jsonschema.Draft202012Validator(LWS_SCHEMA).iter_errors(obj)]
        for role, template in pod_templates(obj).items():
            wrapped = {"apiVersion": "v1", "kind": "PodTemplate",
                       "metadata": {"name": f"{obj['metadata']['name']}-{role}"}, "template": template}
            errors += [f"{role} template: {e}" for e in schema_errors(wrapped)]
        return errors
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata'].get('name')} (Kubernetes {version}): "
                          f"{exc.message} at {list(exc.absolute_path)}")
    return errors


def reference_errors(objs: list[dict]) -> list[str]:
    """Names a pod refers to that the render does not define: Secrets and their keys, claims,
    volumes; and Services that select no API-server pod."""
    secrets = {s["metadata"]["name"]: set(s.get("data", {})) | set(s.get("stringData", {}))
               for s in by_kind(objs, "Secret")}
    claims = {c["metadata"]["name"] for c in by_kind(objs, "PersistentVolumeClaim")}
    errors, pod_labels = [], []
    for obj in objs:
        if obj["kind"] not in ("StatefulSet", "Deployment", "LeaderWorkerSet"):
            continue
        templates_claims = {t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", [])}
        for role, template in pod_templates(obj).items():
            pod_labels.append(template["metadata"].get("labels", {}))
            spec = template["spec"]
            volumes = {v["name"] for v in spec.get("volumes", [])} | templates_claims
            for v in spec.get("volumes", []):
                claim = v.get("persistentVolumeClaim", {}).get("claimName")
                if claim and claim not in claims:
                    errors.append(f"{role}: volume {v['name']} claims {claim}, which is not rendered")
            for c in spec["containers"]:
                for m in c.get("volumeMounts", []):
                    if m["name"] not in volumes:
                        errors.append(f"{role}/{c['name']}: mount of undefined volume {m['name']}")
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref and not ref.get("optional") and ref["key"] not in secrets.get(ref["name"], set()):
                        errors.append(f"{role}/{c['name']}: {e['name']} refers to secret {ref['name']} "
                                      f"key {ref['key']}, which is not rendered")
    for svc in by_kind(objs, "Service"):
        selector = svc["spec"]["selector"]
        if not any(selector.items() <= labels.items() for labels in pod_labels):
            errors.append(f"Service {svc['metadata']['name']} selects no pod ({selector})")
    return errors


def container(template: dict, name: str | None = None) -> dict:
    containers = template["spec"]["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def probe_budget_s(probe: dict) -> int:
    return probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


# ----------------------------------------------------------------- rendering and schemas

def test_every_overlay_is_tested():
    assert sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir()) == sorted(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_against_kubernetes_schemas(rendered, overlay):
    objs = rendered[overlay]
    assert objs, f"{overlay} rendered nothing"
    errors = [e for obj in objs for e in schema_errors(obj)]
    assert not errors, "\n".join(errors)
    assert not reference_errors(objs), reference_errors(objs)


def test_a_broken_manifest_is_rejected(rendered):
    """The checks above can fail: a misspelled field, a wrong type, a dangling reference, a
    malformed LeaderWorkerSet and a kustomization naming a missing file are each rejected."""
    sts = one(rendered["replicas"], "StatefulSet")
    misspelled = copy.deepcopy(sts)
    misspelled["spec"]["replica"] = misspelled["spec"].pop("replicas")
    assert any("replica" in e for e in schema_errors(misspelled))
    wrong_type = copy.deepcopy(sts)
    container(wrong_type["spec"]["template"])["ports"][0]["containerPort"] = "eight thousand"
    assert schema_errors(wrong_type)

    lws = one(rendered["multinode"], "LeaderWorkerSet")
    bad_pod = copy.deepcopy(lws)
    container(bad_pod["spec"]["leaderWorkerTemplate"]["workerTemplate"])["resources"]["limits"] = ["amd.com/gpu"]
    assert any(e.startswith("worker template") for e in schema_errors(bad_pod))
    bad_field = copy.deepcopy(lws)
    bad_field["spec"]["leaderWorkerTemplate"]["groupSize"] = 2
    assert any("groupSize" in e for e in schema_errors(bad_field))

    dangling = copy.deepcopy(rendered["multinode"])
    one(dangling, "Secret")["metadata"]["name"] = "renamed"
    one(dangling, "PersistentVolumeClaim", "rocm-vllm-aiter-jit")["metadata"]["name"] = "renamed-too"
    problems = reference_errors(dangling)
    assert any("rocm-vllm-secrets" in p for p in problems) and any("rocm-vllm-aiter-jit" in p for p in problems)


def test_kustomize_refuses_a_broken_kustomization(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - missing.yaml\n")
    proc = kustomize(tmp_path, check=False)
    assert proc.returncode != 0 and "missing.yaml" in proc.stderr


# ----------------------------------------------------------------- what a ROCm server needs

def check_pod(template: dict, c: dict) -> None:
    sc = template["spec"]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0 and sc["runAsGroup"] > 0 and sc["fsGroup"] > 0
    groups = sc["supplementalGroups"]
    assert VIDEO_GID in groups and len(groups) == 2, f"video and render groups expected: {groups}"
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    gpus = c["resources"]["limits"]["amd.com/gpu"]
    assert gpus == c["resources"]["requests"]["amd.com/gpu"] == "8"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert CACHES <= set(mounts) and "/dev/shm" in mounts
    env = env_of(c)
    assert env["HF_HOME"] == "/var/cache/huggingface"
    if template["metadata"]["labels"]["app.kubernetes.io/component"] != "api-server" or c.get("args") != ["serve"]:
        # not the serve command: the guard only warns unless told a GPU is required
        assert env["ROCM_VLLM_REQUIRE_GPU"] == "1"
    # optional: a model that needs no token runs without one (absent from the Secret: unset)
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "rocm-vllm-secrets", "key": "HF_TOKEN", "optional": True}}


GENERATE_PROBE = ["python3", "-m", "rocm_vllm_runtime.health", "--generate"]


def check_api_server(c: dict, across_nodes: bool = False) -> None:
    env = env_of(c)
    assert env["SERVE_MODEL"] == "", "the default is the tiny model in the image (no download)"
    assert env["VLLM_API_KEY"] == {"secretKeyRef": {"name": "rocm-vllm-secrets", "key": "VLLM_API_KEY"}}
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    assert env["SERVE_PORT"] == str(port)  # the health probe's default URL
    for kind in ("startupProbe", "readinessProbe") if across_nodes else ("startupProbe", "readinessProbe",
                                                                           "livenessProbe"):
        assert c[kind]["httpGet"] == {"path": "/health", "port": "http"}, kind
    if across_nodes:
        # /health does not see a lost node until a request reaches the engine: one generated token does
        command = c["livenessProbe"]["exec"]["command"]
        assert command[:len(GENERATE_PROBE)] == GENERATE_PROBE
        per_request = float(command[command.index("--timeout") + 1])
        assert c["livenessProbe"]["timeoutSeconds"] > 3 * per_request  # /health, /v1/models, one completion
    assert probe_budget_s(c["startupProbe"]) >= STARTUP_BUDGET_S
    assert probe_budget_s(c["livenessProbe"]) < STARTUP_BUDGET_S  # the startup probe guards the load


def test_replicas_one_per_8_gpu_node_behind_one_service(rendered):
    objs = rendered["replicas"]
    sts = one(objs, "StatefulSet")
    template = sts["spec"]["template"]
    c = container(template, "vllm")
    assert sts["spec"]["replicas"] >= 2
    assert c["args"] == ["serve"]
    check_pod(template, c)
    check_api_server(c)
    (term,) = template["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    claims = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert {mounts[p] for p in CACHES} == set(claims)
    service = one(objs, "Service", "rocm-vllm")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()


def test_multinode_leader_is_ray_head_and_api_server_workers_join(rendered):
    objs = rendered["multinode"]
    lws = one(objs, "LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] >= 2
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    templates = pod_templates(lws)
    leader, worker = container(templates["leader"], "vllm"), container(templates["worker"], "ray-worker")
    for role, c in (("leader", leader), ("worker", worker)):
        check_pod(templates[role], c)
        script = c["args"][2]
        assert c["args"][:2] == ["bash", "-c"]
        syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert syntax.returncode == 0, f"{role} script: {syntax.stderr}"
    check_api_server(leader, across_nodes=True)
    assert 'ray start --head --port="$RAY_PORT"' in leader["args"][2]
    ray_port = next(p["containerPort"] for p in leader["ports"] if p["name"] == "ray")
    assert env_of(leader)["RAY_PORT"] == env_of(worker)["RAY_PORT"] == str(ray_port)
    assert "entrypoint.sh serve --distributed-executor-backend ray" in leader["args"][2]
    assert "--pipeline-parallel-size \"$LWS_GROUP_SIZE\"" in leader["args"][2]
    assert 'ray start --address="$LWS_LEADER_ADDRESS:$RAY_PORT"' in worker["args"][2]
    service = one(objs, "Service", "rocm-vllm")
    assert service["spec"]["selector"].items() <= templates["leader"]["metadata"]["labels"].items()
    assert not service["spec"]["selector"].items() <= templates["worker"]["metadata"]["labels"].items()
    for pvc in by_kind(objs, "PersistentVolumeClaim"):
        assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_secret_is_made_from_the_users_secrets_file_under_a_stable_name(rendered):
    for objs in rendered.values():
        secret = one(objs, "Secret")
        assert secret["metadata"]["name"] == "rocm-vllm-secrets"  # the custom resource refers to it by name
        assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
            "VLLM_API_KEY": "test-key-0123456789"}


@pytest.mark.parametrize("line,secret", [('VLLM_API_KEY="test-key-0123456789"', '"test-key-0123456789"'),
                                         ("VLLM_API_KEY='test-key-0123456789'", "'test-key-0123456789'")])
def test_a_quoted_key_in_the_secrets_file_stops_the_server_in_one_line(tmp_path, line, secret):
    """kustomize keeps quotes in an env file's value (read here from the real render): the server
    would take the quoted string as its key and refuse every client sending the key. The image's
    serve command refuses such a key at start, naming the variable, the key not shown."""
    from rocm_vllm_runtime.serve import ServeError, build_argv, check_api_keys

    objs = kustomize(deploy_copy(tmp_path, secrets=line + "\n") / "overlays" / OVERLAYS[0])
    value = {k: base64.b64decode(v).decode() for k, v in one(objs, "Secret")["data"].items()}["VLLM_API_KEY"]
    assert value == secret
    env = {"VLLM_API_KEY": value}
    with pytest.raises(ServeError, match=r"^VLLM_API_KEY: the API key is wrapped in quotes") as err:
        check_api_keys(build_argv([], env), env)
    assert "test-key" not in str(err.value)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_without_the_secrets_file_the_render_stops_naming_it(tmp_path, overlay):
    """The servers listen on the pod network and refuse to start there without an API key: rather than
    pods in a crash loop, `kubectl apply -k` (which renders first) stops in one line naming the file."""
    tree = deploy_copy(tmp_path, secrets=None)
    proc = kustomize(tree / "overlays" / overlay, check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{tree / SECRETS_ENV}: no such file or directory" in lines[0], proc.stderr
    assert (K8S / "base/.gitignore").read_text().splitlines()[-1] == "secrets.env"


# ----------------------------------------------------------------- the LeaderWorkerSet's scripts, with stand-ins

IMAGE_ENTRYPOINT = "/opt/rocm-vllm/entrypoint.sh"


@pytest.fixture()
def stand_ins(tmp_path) -> ray_stand_ins.StandIns:
    return ray_stand_ins.stand_ins(tmp_path)


def run_lws(rendered, role: str, found: ray_stand_ins.StandIns, **env: str) -> subprocess.CompletedProcess:
    """A LeaderWorkerSet container's script as rendered, with its plain env, what the controller
    injects (a group of 2, the leader at 10.0.0.1), a join timeout of 1 s and tests/ray_stand_ins.py's
    stand-ins (the image's python3 -m rocm_vllm_runtime.ray_cluster is the checkout's); the leader's
    path to the image's entrypoint points at the stand-in."""
    c = container(pod_templates(one(rendered["multinode"], "LeaderWorkerSet"))[role])
    args = list(c["args"])
    assert args[2].count(IMAGE_ENTRYPOINT) == (role == "leader"), args[2]
    args[2] = args[2].replace(IMAGE_ENTRYPOINT, str(found.entrypoint))
    plain = {name: value for name, value in env_of(c).items() if isinstance(value, str)}
    injected = {"LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "10.0.0.1",
                "LWS_WORKER_INDEX": "0" if role == "leader" else "1"}
    return subprocess.run(args, env={**plain, **found.env, **injected, "RAY_JOIN_TIMEOUT": "1", **env},
                          capture_output=True, text=True, timeout=120)


def test_lws_scripts_run_the_images_membership_module(rendered):
    """No Python written inline: the settings, the identity and the wait are the module compose.ray.yaml's
    node script runs too (tests/test_shell_python.py holds the manifest to no inline Python)."""
    templates = pod_templates(one(rendered["multinode"], "LeaderWorkerSet"))
    leader, worker = container(templates["leader"])["args"][2], container(templates["worker"])["args"][2]
    for script in (leader, worker):
        assert "python3 -m rocm_vllm_runtime.ray_cluster settings --lws" in script
        assert "python3 -m rocm_vllm_runtime.ray_cluster identity" in script
        assert '--resources="{\\"$me\\": 1}"' in script
        assert "python3 -c" not in script and "case " not in script
    assert 'python3 -m rocm_vllm_runtime.ray_cluster wait --lws "$nodes"' in leader


def test_lws_leader_advertises_its_identity_waits_for_its_group_then_serves(rendered, stand_ins):
    me = stand_ins.me
    proc = run_lws(rendered, "leader", stand_ins, FAKE_RAY_NODES=json.dumps(
        [ray_stand_ins.node(me, address="10.0.0.1"), ray_stand_ins.node(me, address="10.0.0.2")]))
    assert proc.returncode == 0, proc.stderr
    (start,) = stand_ins.log.read_text().splitlines()
    assert start.startswith("start --head --port=6379 --num-gpus=8") and f'--resources={{"{me}": 1}}' in start
    assert f"[rocm-vllm] ray: 2 of 2 nodes joined, all {me}" in proc.stderr
    assert proc.stdout.strip() == "ENTRYPOINT serve --distributed-executor-backend ray --pipeline-parallel-size 2"


def test_lws_leader_refuses_a_node_that_differs_and_a_group_that_never_fills(rendered, stand_ins):
    me, node = stand_ins.me, ray_stand_ins.node
    other = "rocm-vllm-ffffffffffff-gfx90ax8"
    differs = json.dumps([node(me), node(other, address="10.0.0.5")])
    proc = run_lws(rendered, "leader", stand_ins, FAKE_RAY_NODES=differs)
    assert proc.returncode == 1 and "ENTRYPOINT" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: Ray node 10.0.0.5 runs ['{other}'], the head {me}: "), proc.stderr
    # a worker that advertises no identity (one of an older manifest) is refused as well
    bare = {"Alive": True, "NodeManagerAddress": "10.0.0.6", "Resources": {"GPU": 8.0}}
    proc = run_lws(rendered, "leader", stand_ins, FAKE_RAY_NODES=json.dumps([node(me), bare]))
    assert proc.returncode == 1 and "error: Ray node 10.0.0.6 runs no rocm-vllm identity" in proc.stderr
    proc = run_lws(rendered, "leader", stand_ins, FAKE_RAY_NODES=json.dumps([node(me)]))
    assert proc.returncode == 1 and "ENTRYPOINT" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == ("error: 1 of 2 Ray nodes joined within 1s: read the worker pods' "
                                                    "logs, or raise RAY_JOIN_TIMEOUT"), proc.stderr


def test_lws_worker_joins_the_leader_with_its_identity_and_exits_when_it_is_gone(rendered, stand_ins):
    proc = run_lws(rendered, "worker", stand_ins)
    assert proc.returncode == 1 and proc.stderr.strip().endswith("error: lost the Ray head 10.0.0.1:6379"), proc.stderr
    start, status = stand_ins.log.read_text().splitlines()
    assert start.startswith("start --address=10.0.0.1:6379 --num-gpus=8")
    assert f'--resources={{"{stand_ins.me}": 1}}' in start and status == "status --address=10.0.0.1:6379"


# Read by rocm_vllm_runtime.numeric, as compose's (empty: the default, 1200 s; "010": 10 s).
BAD_JOIN_TIMEOUTS = ("abc", "0", "-5", "nan", "inf", "1e3", "1.5", " 5", "9999999999", "0x10", "+5")


@pytest.mark.parametrize("value", BAD_JOIN_TIMEOUTS)
@pytest.mark.parametrize("role", ("leader", "worker"))
def test_lws_scripts_refuse_a_join_timeout_that_is_no_whole_number_of_seconds(rendered, role, value, stand_ins):
    """Before Ray starts: one line naming RAY_JOIN_TIMEOUT, exit 2 (bash arithmetic would read `abc` as 0
    and stop at `1e3` with its own message). `ray` is a stand-in that records any call."""
    proc = run_lws(rendered, role, stand_ins, RAY_JOIN_TIMEOUT=value)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: RAY_JOIN_TIMEOUT='{value}' "), proc.stderr
    assert " is not a whole number of seconds " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not stand_ins.log.exists()


@pytest.mark.parametrize("value", ("", "010"))
@pytest.mark.parametrize("role", ("leader", "worker"))
def test_lws_scripts_take_an_empty_or_zero_padded_join_timeout_as_compose_does(rendered, role, value, stand_ins):
    """Empty: the default (1200 s); leading zeros: decimal (bash arithmetic would read 010 as 8)."""
    nodes = [ray_stand_ins.node(stand_ins.me), ray_stand_ins.node(stand_ins.me, address="10.0.0.2")]
    proc = run_lws(rendered, role, stand_ins, RAY_JOIN_TIMEOUT=value, FAKE_RAY_NODES=json.dumps(nodes))
    assert stand_ins.log.read_text().startswith("start "), proc.stderr
    if role == "leader":
        assert proc.returncode == 0 and proc.stdout.startswith("ENTRYPOINT serve "), proc.stderr
    else:
        assert proc.returncode == 1 and proc.stderr.strip().endswith("error: lost the Ray head 10.0.0.1:6379")
