"""deploy/kubernetes run as shipped (marker `docker` on the tests that start containers): each
overlay is rendered with `kubectl kustomize` from a copy of deploy/kubernetes with base/secrets.env
written as docs/multi-host.md says, the shipped image name replaced by the CPU serve image the way `kustomize
edit set image` does (an `images:` entry of a further kustomization), and each workload's container
is run through Docker the way the kubelet would start it:

- env resolved as Kubernetes resolves it: the Service links of the rendered ClusterIP Services
  first (NAME_SERVICE_HOST, NAME_PORT, ...), then envFrom (ConfigMaps, Secrets, prefix, optional),
  then env in order (value with $(VAR) expansion over what is defined so far, `$$` an escaped `$`,
  an undefined reference left as written; valueFrom secretKeyRef / configMapKeyRef, a Secret's data
  base64-decoded; a missing Secret, ConfigMap or key that is not optional stops the pod, as the
  kubelet's CreateContainerConfigError does; optional and absent: the variable is unset);
- command and args with $(VAR) expanded over that env; command replaces the image's entrypoint,
  args its CMD;
- volumes: emptyDir is a tmpfs (mode 0777 as the kubelet makes an emptyDir, sizeLimit its size),
  a claim (persistentVolumeClaim or a StatefulSet's volumeClaimTemplates) a Docker volume this
  test creates, empty (nothing copied from the image), its root given to fsGroup (group, setgid,
  g+rwx) as the kubelet does; mount paths and readOnly honoured; any other volume type fails;
- securityContext: runAsUser/runAsGroup (--user), supplementalGroups and fsGroup (--group-add),
  runAsNonRoot (a root user fails), capabilities, allowPrivilegeEscalation: false
  (no-new-privileges), seccompProfile Unconfined, privileged, readOnlyRootFilesystem;
- probes: startup, then readiness, then one liveness round, each at its own period,
  failureThreshold and timeoutSeconds: httpGet on the named port (200-399 passes), exec through
  `docker exec` in the running container, tcpSocket. A container that exits (what becomes a crash
  loop), a startup probe that reaches its failureThreshold, or the test's deadline (DEADLINE_S; the
  manifests allow 30 minutes for a large model) fails with the container's log tail.

What the CPU run changes, as an overlay would (cpu_overlay): the GPU request and limit
(amd.com/gpu) are dropped (no GPU device plugin); resource requests only schedule and are not
applied; the host networking of CI means SERVE_HOST is 127.0.0.1 and the `http` (and `ray`)
containerPort, SERVE_PORT and RAY_PORT a free port; the server settings of the shipped CPU
override compose.cpu.yaml are added (ROCM_VLLM_REQUIRE_GPU=0, the backend's CPU development mode
with the reference kernels, the CPU_MLA attention backend, float32, --enforce-eager, a 512-token
context), and tests/fake_amx is mounted as tests/compose.cpu.yaml does, so that vLLM's CPU
platform selects the same backend on every CPU. The image is the CPU path's serve-cpu target. The pod's own address
(0.0.0.0, port 8000) is run as well, in a container without a network (a pod's own network
namespace): the image's serve command must accept it with the Secret as docs/multi-host.md makes it (it
refuses to serve there without an API key: the shipped base once had an empty key, a crash loop).

replicas (StatefulSet): its two pods run at once as rendered, the first with HF_TOKEN absent from
the Secret (unset), the second with it empty: startup, readiness and liveness probes pass,
/v1/models and a completion answer with the Secret's API key and refuse a request without it.

multinode (LeaderWorkerSet + Ray): the leader's container runs as rendered with a group of size 1
(LWS_GROUP_SIZE=1, LWS_LEADER_ADDRESS=127.0.0.1, the values the LeaderWorkerSet controller injects):
it validates RAY_JOIN_TIMEOUT, starts the Ray head with its identity, sees its group complete (the
image's rocm_vllm_runtime.ray_cluster) and runs the image's serve command with
--distributed-executor-backend ray. There vLLM 0.32's CPU platform stops: its Ray device key is
empty ("current platform cpu does not support ray", vllm/v1/executor/ray_utils.py), so on CPU the
leader exits with that line and its probes, its exec liveness probe and a completion are not run;
the test asserts that this is where it ends (should a CPU vLLM serve through Ray, the test goes on
with the probes and a completion). Not run at all: a worker joining a head (a second Ray node on the
same host network) and a group of two; the worker's container is run as rendered up to its settings
check (a RAY_JOIN_TIMEOUT that is no number stops it in one line before Ray)."""
from __future__ import annotations

import base64
import copy
import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import test_engine_integration as integration
from test_engine_integration import IMAGE_PREFIX, ROOT, free_port, own_target_image
from test_kubernetes import deploy_copy, kustomize, pod_templates, yaml

# The integration test's fixtures (pytest collects fixtures among a module's globals): the harness,
# the CPU vLLM image and the build context copy; the serve image gets this test's own tag.
h, cpu_vllm_image, context_dir = integration.h, integration.cpu_vllm_image, integration.context_dir

ENGINE_LOG_SUFFIX = "kubernetes"
SERVE_TAG = f"{IMAGE_PREFIX}/serve:cpu-k8s"
SHIPPED_IMAGE = "localhost/rocm-vllm/serve"
API_KEY = "k8s-run-test-key-7d1f09"
SECRETS = f"VLLM_API_KEY={API_KEY}\n"
DEADLINE_S = 480  # start-up and readiness of the tiny model on a 2-core machine (about a minute)
LAUNCH_S = 120  # the serve command's decision (the guard, then the launcher's checks)
LOG_TAIL = 40
WORKLOADS = ("StatefulSet", "Deployment", "DaemonSet", "LeaderWorkerSet")
CLUSTER_IP_BASE = "10.96.0."
RAY_ON_CPU_REFUSED = "current platform cpu does not support ray"
RAY_START_TIMED_OUT = "The current node timed out during startup"  # Ray's own line (ray/_private/node.py)
LEADER_RESTARTS = 3  # starts after the first when Ray's head start times out (the kubelet's would go on)
# tests/compose.cpu.yaml's AMX hook (tests/fake_amx, mounted with FAKE_AMX_MOUNT)
FAKE_AMX_ENV = {"PYTHONPATH": "/opt/fake_amx", "ROCM_VLLM_FAKE_AMX": "1"}
FAKE_AMX_MOUNT = ("-v", f"{ROOT / 'tests/fake_amx'}:/opt/fake_amx:ro")


class ConfigError(Exception):
    """What the kubelet reports instead of starting the container (CreateContainerConfigError, a
    non-root policy violation), or a field this emulation does not model (never ignored)."""


# ----------------------------------------------------------------- Kubernetes semantics

def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion (env values, command, args): `$$` is `$`, `$(NAME)` the value of
    NAME when defined, else left as written; any other `$` is kept."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                close = text.find(")", i + 2)
                if close != -1:
                    name = text[i + 2:close]
                    out.append(env[name] if name in env else f"$({name})")
                    i = close + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def stores(objs: list[dict]) -> dict[str, dict[str, dict[str, str]]]:
    """{"Secret": {name: {key: value}}, "ConfigMap": {...}} of the render, Secret data decoded."""
    secrets = {o["metadata"]["name"]: {**{k: base64.b64decode(v).decode() for k, v in (o.get("data") or {}).items()},
                                       **(o.get("stringData") or {})}
               for o in objs if o["kind"] == "Secret"}
    maps = {o["metadata"]["name"]: {**(o.get("data") or {}),
                                    **{k: base64.b64decode(v).decode() for k, v in (o.get("binaryData") or {}).items()}}
            for o in objs if o["kind"] == "ConfigMap"}
    return {"Secret": secrets, "ConfigMap": maps}


def service_links(objs: list[dict]) -> dict[str, str]:
    """The variables the kubelet gives every pod (enableServiceLinks) for each Service with a cluster IP."""
    env: dict[str, str] = {}
    services = [o for o in objs if o["kind"] == "Service" and o["spec"].get("clusterIP") != "None"]
    for n, svc in enumerate(services, start=10):
        name, ip = svc["metadata"]["name"].upper().replace("-", "_"), f"{CLUSTER_IP_BASE}{n}"
        ports = svc["spec"].get("ports", [])
        env[f"{name}_SERVICE_HOST"] = ip
        for i, p in enumerate(ports):
            proto = p.get("protocol", "TCP")
            if i == 0:
                env[f"{name}_SERVICE_PORT"] = str(p["port"])
                env[f"{name}_PORT"] = f"{proto.lower()}://{ip}:{p['port']}"
            if p.get("name"):
                env[f"{name}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(p["port"])
            prefix = f"{name}_PORT_{p['port']}_{proto}"
            env.update({prefix: f"{proto.lower()}://{ip}:{p['port']}", f"{prefix}_PROTO": proto.lower(),
                        f"{prefix}_PORT": str(p["port"]), f"{prefix}_ADDR": ip})
    return env


def resolve_env(c: dict, objs: list[dict], spec: dict | None = None) -> dict[str, str]:
    """The container's environment as the kubelet builds it (see the module docstring)."""
    data = stores(objs)
    env = service_links(objs) if (spec or {}).get("enableServiceLinks", True) else {}
    for source in c.get("envFrom", []):
        kind = "ConfigMap" if "configMapRef" in source else "Secret" if "secretRef" in source else None
        if kind is None:
            raise ConfigError(f"{c['name']}: envFrom {sorted(source)} is not modelled")
        ref = source["configMapRef" if kind == "ConfigMap" else "secretRef"]
        values = data[kind].get(ref["name"])
        if values is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f"{c['name']}: {kind.lower()} \"{ref['name']}\" not found")
        env.update({source.get("prefix", "") + k: v for k, v in values.items()})
    for entry in c.get("env", []):
        name = entry["name"]
        if "valueFrom" not in entry:
            env[name] = expand(entry.get("value", ""), env)
            continue
        source = entry["valueFrom"]
        kind = "ConfigMap" if "configMapKeyRef" in source else "Secret" if "secretKeyRef" in source else None
        if kind is None:
            raise ConfigError(f"{c['name']}: {name} from {sorted(source)} is not modelled")
        ref = source["configMapKeyRef" if kind == "ConfigMap" else "secretKeyRef"]
        values = data[kind].get(ref["name"])
        if values is None or ref["key"] not in values:
            if ref.get("optional"):
                continue
            what = f"{kind.lower()} \"{ref['name']}\" not found" if values is None else \
                f"couldn't find key {ref['key']} in {kind} {ref['name']}"
            raise ConfigError(f"{c['name']}: {name}: {what}")
        env[name] = values[ref["key"]]
    return env


QUANTITY = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(text: str | int) -> int:
    m = re.fullmatch(r"(\d+)(|k|M|G|T|Ki|Mi|Gi|Ti)", str(text))
    if not m:
        raise ConfigError(f"quantity {text!r} is not modelled")
    return int(m.group(1)) * QUANTITY[m.group(2)]


@dataclass
class Pod:
    """One container of a rendered pod template, ready for `docker run`."""
    role: str
    template: dict
    container: dict
    objs: list[dict]
    claims: dict[str, dict] = field(default_factory=dict)  # volumeClaimTemplates by name
    extra_env: dict[str, str] = field(default_factory=dict)  # what a controller injects (LWS_*)

    @property
    def spec(self) -> dict:
        return self.template["spec"]

    def env(self) -> dict[str, str]:
        c = copy.deepcopy(self.container)
        c["env"] = [{"name": k, "value": v} for k, v in self.extra_env.items()] + c.get("env", [])
        return resolve_env(c, self.objs, self.spec)

    def ports(self) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for p in self.container.get("ports", []) if p.get("name")}

    def security_args(self) -> list[str]:
        pod_sc, c_sc = self.spec.get("securityContext", {}), self.container.get("securityContext", {})
        sc = {**pod_sc, **c_sc}
        uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
        if sc.get("runAsNonRoot") and uid is None:
            raise ConfigError(f"{self.container['name']}: runAsNonRoot without runAsUser is not modelled")
        if sc.get("runAsNonRoot") and uid == 0:
            raise ConfigError(f"{self.container['name']}: container's runAsUser breaks non-root policy")
        args = ["--user", f"{uid}:{gid}" if gid is not None else str(uid)] if uid is not None else []
        groups = [*pod_sc.get("supplementalGroups", []), *([pod_sc["fsGroup"]] if "fsGroup" in pod_sc else [])]
        for g in dict.fromkeys(groups):
            args += ["--group-add", str(g)]
        seccomp = sc.get("seccompProfile", {}).get("type", "RuntimeDefault")
        if seccomp == "Unconfined":
            args += ["--security-opt", "seccomp=unconfined"]
        elif seccomp != "RuntimeDefault":
            raise ConfigError(f"seccompProfile {seccomp} is not modelled")
        caps = c_sc.get("capabilities", {})
        args += [a for cap in caps.get("drop", []) for a in ("--cap-drop", cap)]
        args += [a for cap in caps.get("add", []) for a in ("--cap-add", cap)]
        if c_sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if c_sc.get("privileged"):
            args.append("--privileged")
        if c_sc.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        return args

    def resource_args(self) -> list[str]:
        args = []
        for name, value in self.container.get("resources", {}).get("limits", {}).items():
            if name == "cpu":
                args += ["--cpus", str(value)]
            elif name == "memory":
                args += ["--memory", str(quantity(value))]
            else:
                raise ConfigError(f"resource limit {name} is not modelled (cpu_overlay drops amd.com/gpu)")
        return args

    def volumes(self) -> list[tuple[str, dict, dict]]:
        """(kind, volume source, mount) per mount: kind emptyDir or claim (source: {claimName})."""
        defined = {v["name"]: v for v in self.spec.get("volumes", [])}
        out = []
        for m in self.container.get("volumeMounts", []):
            if set(m) - {"name", "mountPath", "readOnly"}:
                raise ConfigError(f"mount fields {sorted(set(m) - {'name', 'mountPath', 'readOnly'})} are not modelled")
            if m["name"] in self.claims:
                out.append(("claim", {"claimName": m["name"]}, m))
                continue
            v = defined.get(m["name"])
            if v is None:
                raise ConfigError(f"{self.container['name']}: volume {m['name']} is not defined")
            if "emptyDir" in v:
                out.append(("emptyDir", v["emptyDir"] or {}, m))
            elif "persistentVolumeClaim" in v:
                out.append(("claim", v["persistentVolumeClaim"], m))
            else:
                raise ConfigError(f"volume {m['name']}: {sorted(set(v) - {'name'})} is not modelled")
        return out

    def command_args(self, env: dict[str, str]) -> list[str]:
        command = [expand(a, env) for a in self.container.get("command") or []]
        args = [expand(a, env) for a in self.container.get("args") or []]
        entry = ["--entrypoint", command[0]] if command else []
        return [*entry, self.container["image"], *command[1:], *args]


def pods_of(objs: list[dict]) -> dict[str, Pod]:
    """{role: Pod} of every workload's first container: the StatefulSet's `pod`, the
    LeaderWorkerSet's `leader` and `worker`."""
    pods = {}
    for obj in objs:
        if obj["kind"] not in WORKLOADS:
            continue
        claims = {t["metadata"]["name"]: t for t in obj["spec"].get("volumeClaimTemplates", [])}
        for role, template in pod_templates(obj).items():
            (c,) = template["spec"]["containers"]
            pods[role] = Pod(role, template, c, objs, claims)
    return pods


def cpu_overlay(pod: Pod, ports: dict[str, int], env: dict[str, str] | None = None) -> Pod:
    """The CPU run's changes (module docstring): GPU resources dropped, CPU settings added, the named
    ports (and SERVE_PORT / RAY_PORT) on free ports, SERVE_HOST 127.0.0.1; `env` overrides last."""
    pod = copy.deepcopy(pod)
    c = pod.container
    for part in ("requests", "limits"):
        c.get("resources", {}).get(part, {}).pop("amd.com/gpu", None)
    c.get("resources", {}).pop("requests", None)  # scheduling only
    named = {p["name"]: p for p in c.get("ports", []) if p.get("name")}
    settings = {**integration.shipped_cpu_settings(), **FAKE_AMX_ENV}
    for name, port in ports.items():
        named[name]["containerPort"] = port
    if "http" in ports:
        settings.update(SERVE_HOST="127.0.0.1", SERVE_PORT=str(ports["http"]))
    if "ray" in ports:
        settings["RAY_PORT"] = str(ports["ray"])
    settings.update(env or {})
    entries = c.setdefault("env", [])
    for name, value in settings.items():
        found = [e for e in entries if e["name"] == name]
        if found:
            found[0].clear()
            found[0].update(name=name, value=value)
        else:
            entries.append({"name": name, "value": value})
    return pod


def render(tmp: Path, overlay: str, image: str, secrets: str) -> list[dict]:
    """The overlay rendered from a copy with base/secrets.env = secrets, the image set as
    `kustomize edit set image localhost/rocm-vllm/serve=<image>` sets it."""
    tree = deploy_copy(tmp, secrets)
    run_dir = tree / "overlays" / f"{overlay}-image"
    run_dir.mkdir()
    name, tag = image.rsplit(":", 1)
    (run_dir / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": [f"../{overlay}"],
        "images": [{"name": SHIPPED_IMAGE, "newName": name, "newTag": tag}]}))
    return kustomize(run_dir)


# ----------------------------------------------------------------- running a pod on Docker

def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])}: {proc.stderr.strip()[-1000:]}")
    return proc


class Running:
    """A pod's container started on Docker; its containers and volumes removed by close()."""

    def __init__(self, pod: Pod, network: str = "host", extra: tuple[str, ...] = FAKE_AMX_MOUNT):
        self.pod, self.name = pod, f"rocm-vllm-k8s-{uuid.uuid4().hex[:8]}-{pod.role}"
        self.volumes: list[str] = []
        self.env = pod.env()
        args = ["run", "-d", "--name", self.name, "--network", network, *pod.security_args(), *pod.resource_args()]
        claims = []
        fs_group = pod.spec.get("securityContext", {}).get("fsGroup")
        for kind, source, mount in pod.volumes():
            ro = ",readonly" if mount.get("readOnly") else ""
            if kind == "emptyDir":
                size = f",tmpfs-size={quantity(source['sizeLimit'])}" if "sizeLimit" in source else ""
                args += ["--mount", f"type=tmpfs,dst={mount['mountPath']},tmpfs-mode=0777{size}{ro}"]
            else:
                volume = f"{self.name}-{source['claimName']}"
                docker("volume", "create", volume)
                self.volumes.append(volume)
                claims.append(volume)
                args += ["--mount", f"type=volume,src={volume},dst={mount['mountPath']},volume-nocopy{ro}"]
        if claims and fs_group is not None:  # the kubelet's fsGroup ownership of a claim's root
            mounts = [a for i, v in enumerate(claims) for a in ("--mount", f"type=volume,src={v},dst=/claims/{i}")]
            docker("run", "--rm", "--network", "none", "--user", "0", *mounts, "--entrypoint", "sh",
                   pod.container["image"], "-c", f"chgrp {fs_group} /claims/* && chmod 2775 /claims/*")
        for key, value in self.env.items():
            args += ["-e", f"{key}={value}"]
        self.argv = [*args, *extra, *pod.command_args(self.env)]
        docker(*self.argv)
        self.started = time.monotonic()

    def logs(self, tail: int = LOG_TAIL) -> str:
        proc = docker("logs", "--tail", str(tail), self.name, check=False)
        return (proc.stdout + proc.stderr).rstrip()

    def state(self) -> tuple[str, int]:
        out = docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", self.name, check=False).stdout.split()
        return (out[0], int(out[1])) if len(out) == 2 else ("gone", -1)

    def fail(self, why: str) -> None:
        status, code = self.state()
        pytest.fail(f"{self.pod.role} ({self.pod.container['name']}): {why} [container {status}, exit {code}]\n"
                    f"--- last {LOG_TAIL} lines of its log\n{self.logs()}", pytrace=False)

    def check_running(self) -> None:
        status, code = self.state()
        if status != "running":
            self.fail(f"the container exited with {code} (the kubelet would restart it: a crash loop)")

    def close(self) -> None:
        docker("rm", "-f", "-v", self.name, check=False)
        for volume in self.volumes:
            docker("volume", "rm", "-f", volume, check=False)

    # probes
    def port(self, port: int | str) -> int:
        """A probe's port: a number, or the name of one of the container's ports."""
        if isinstance(port, int):
            return port
        if port not in self.pod.ports():
            raise ConfigError(f"probe port {port!r} is no named port of the container")
        return self.pod.ports()[port]

    def probe_once(self, probe: dict) -> str | None:
        """None when the probe passes, else why not."""
        timeout = probe.get("timeoutSeconds", 1)
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = self.port(get["port"])
            url = f"{get.get('scheme', 'HTTP').lower()}://{get.get('host') or '127.0.0.1'}:{port}{get.get('path', '/')}"
            headers = {x["name"]: x["value"] for x in get.get("httpHeaders", [])}
            try:
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
                    return None if 200 <= resp.status < 400 else f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                return f"{url}: HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                return f"{url}: {getattr(exc, 'reason', exc)}"
        if "exec" in probe:
            try:
                proc = docker("exec", self.name, *probe["exec"]["command"], timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                return f"exec {probe['exec']['command']}: no answer within timeoutSeconds {timeout}"
            return None if proc.returncode == 0 else f"exec: rc {proc.returncode}: {proc.stderr.strip()[-300:]}"
        if "tcpSocket" in probe:
            try:
                with socket.create_connection(("127.0.0.1", self.port(probe["tcpSocket"]["port"])), timeout=timeout):
                    return None
            except OSError as exc:
                return str(exc)
        raise ConfigError(f"probe {sorted(probe)} is not modelled")

    def await_probe(self, kind: str, deadline: float, restarts: bool) -> float:
        """Seconds until the probe passed; fails (log tail) on exit, on failureThreshold when the
        probe restarts the container (startup, liveness), or at the deadline."""
        probe = self.pod.container.get(kind)
        t0 = time.monotonic()
        if probe is None:
            return 0.0
        self.sleep(probe.get("initialDelaySeconds", 0), deadline)
        failures = 0
        while True:
            self.check_running()
            why = self.probe_once(probe)
            if why is None:
                return time.monotonic() - t0
            failures += 1
            if restarts and failures >= probe.get("failureThreshold", 3):
                self.fail(f"{kind} failed {failures} times, its failureThreshold (the kubelet restarts the "
                          f"container): {why}")
            if time.monotonic() + probe.get("periodSeconds", 10) > deadline:
                self.fail(f"{kind} has not passed within the test's {DEADLINE_S}s: {why}")
            self.sleep(probe.get("periodSeconds", 10), deadline)

    def sleep(self, seconds: float, deadline: float) -> None:
        """Sleep, watching the container: an exit fails at once."""
        end = min(time.monotonic() + seconds, deadline)
        while time.monotonic() < end:
            self.check_running()
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))

    def await_log(self, needle: str, limit: float) -> str:
        """'seen' once needle is in the log, else 'exited' when the container stopped; fails at limit."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if needle in self.logs(tail=100000):
                return "seen"
            if self.state()[0] != "running":
                return "seen" if needle in self.logs(tail=100000) else "exited"
            time.sleep(1)
        self.fail(f"neither {needle!r} in the log nor an exit within {limit:.0f}s")
        raise AssertionError("not reached")


def api(base: str, path: str, payload=None, key: str | None = API_KEY):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(payload).encode() if payload is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=headers), timeout=120) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()[:300]


def serve_and_complete(h, run: Running, label: str) -> None:
    """Startup, readiness and liveness probes, then /v1/models and a completion with the key."""
    deadline = run.started + DEADLINE_S
    run.await_probe("startupProbe", deadline, restarts=True)
    started = time.monotonic() - run.started
    ready = run.await_probe("readinessProbe", deadline, restarts=False)
    live = run.await_probe("livenessProbe", time.monotonic() + 300, restarts=True)
    port = run.pod.ports()["http"]
    base = f"http://127.0.0.1:{port}"
    status, body = api(base, "/v1/models", key=None)
    assert status == 401, f"/v1/models without the API key: {status} {body}"
    status, models = api(base, "/v1/models")
    assert status == 200, f"/v1/models with the Secret's API key: {status} {models}"
    model = models["data"][0]["id"]
    status, body = api(base, "/v1/completions", {"model": model, "prompt": [5, 7, 11], "max_tokens": 4,
                                                 "temperature": 0.0, "ignore_eos": True, "return_token_ids": True})
    if status != 200:
        run.fail(f"/v1/completions: HTTP {status} {body!r}")
    tokens = body["choices"][0]["token_ids"]
    assert len(tokens) == 4, body
    h.note(f"kubernetes {label}: startup probe passed {started:.1f}s after docker run, readiness "
           f"+{ready:.1f}s, liveness +{live:.1f}s; /v1/models 401 without the key, 200 with it; "
           f"completion of {model}: {tokens}")


# ----------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def serve_image(h, cpu_vllm_image, context_dir) -> str:
    return own_target_image(h, cpu_vllm_image, context_dir, "serve-cpu", SERVE_TAG, "kubernetes")


@pytest.fixture()
def running():
    started: list[Running] = []

    def start(pod: Pod, **kwargs) -> Running:
        run = Running(pod, **kwargs)
        started.append(run)
        return run

    yield start
    for run in started:
        run.close()


# ----------------------------------------------------------------- without Docker

def test_expansion_follows_kubernetes():
    env = {"A": "x", "EMPTY": ""}
    assert expand("$(A)-$(EMPTY)-$(B)", env) == "x--$(B)"
    assert expand("$$(A) $$ $1 $((SECONDS + A)) $(A", env) == "$(A) $ $1 $((SECONDS + A)) $(A"
    assert expand("end$", env) == "end$"


def test_env_resolves_secrets_as_the_kubelet_does(tmp_path):
    """The rendered StatefulSet's env: the Secret's key, HF_TOKEN unset when absent and empty when
    empty, Service links, $(VAR) in a value; a missing key that is not optional stops the pod."""
    objs = render(tmp_path / "a", "replicas", SERVE_TAG, SECRETS)
    env = pods_of(objs)["pod"].env()
    assert env["VLLM_API_KEY"] == API_KEY and "HF_TOKEN" not in env
    assert env["ROCM_VLLM_SERVICE_HOST"].startswith(CLUSTER_IP_BASE) and env["ROCM_VLLM_PORT"].startswith("tcp://")
    assert "ROCM_VLLM_PODS_SERVICE_HOST" not in env  # headless: no links
    objs = render(tmp_path / "b", "replicas", SERVE_TAG, SECRETS + "HF_TOKEN=\n")
    pod = pods_of(objs)["pod"]
    assert pod.env()["HF_TOKEN"] == "" and pod.container["image"] == SERVE_TAG
    with_ref = copy.deepcopy(pod)
    with_ref.container["env"].append({"name": "URL", "value": "http://$(SERVE_HOST):$(SERVE_PORT)/$(NOPE)"})
    assert with_ref.env()["URL"] == "http://0.0.0.0:8000/$(NOPE)"
    objs = render(tmp_path / "c", "replicas", SERVE_TAG, "HF_TOKEN=hf_x\n")
    with pytest.raises(ConfigError, match="couldn't find key VLLM_API_KEY in Secret rocm-vllm-secrets"):
        pods_of(objs)["pod"].env()
    no_secret = [o for o in objs if o["kind"] != "Secret"]
    with pytest.raises(ConfigError, match='secret "rocm-vllm-secrets" not found'):
        Pod("pod", pod.template, pod.container, no_secret).env()


def test_security_volumes_and_resources_as_rendered(tmp_path):
    objs = render(tmp_path, "replicas", SERVE_TAG, SECRETS)
    pod = pods_of(objs)["pod"]
    args = pod.security_args()
    assert args[:2] == ["--user", "1000:1000"] and ["--group-add", "44"] == args[2:4]
    assert "--cap-drop" in args and "no-new-privileges" in args and "seccomp=unconfined" in args
    kinds = {m["mountPath"]: kind for kind, _, m in pod.volumes()}
    assert kinds == {"/var/cache/huggingface": "claim", "/var/cache/aiter-jit": "claim", "/home/vllm": "emptyDir",
                     "/dev/shm": "emptyDir"}
    with pytest.raises(ConfigError, match="amd.com/gpu"):
        pod.resource_args()  # the GPU limit is only dropped by the CPU overlay, stated
    assert cpu_overlay(pod, {"http": 1234}).resource_args() == []
    root = copy.deepcopy(pod)
    root.template["spec"]["securityContext"]["runAsUser"] = 0
    with pytest.raises(ConfigError, match="non-root"):
        root.security_args()


# ----------------------------------------------------------------- on Docker

@pytest.mark.docker(unit="second")
def test_replicas_pods_serve_as_rendered(h, serve_image, tmp_path, running):
    """The StatefulSet's two replicas at once, each from a render whose Secret holds the API key: the
    first without HF_TOKEN (unset in the container), the second with an empty one."""
    runs = []
    for ordinal, extra in enumerate(("", "HF_TOKEN=\n")):
        objs = render(tmp_path / str(ordinal), "replicas", serve_image, SECRETS + extra)
        pod = cpu_overlay(pods_of(objs)["pod"], {"http": free_port()})
        pod.role = f"pod-{ordinal}"
        assert ("HF_TOKEN" in pod.env()) == bool(extra)
        runs.append(running(pod))
    for run, token in zip(runs, ("absent", "empty")):
        serve_and_complete(h, run, f"replicas (StatefulSet {run.pod.role}, HF_TOKEN {token})")


@pytest.mark.docker(unit="second")
def test_the_pods_own_address_needs_the_secrets_api_key(h, serve_image, tmp_path, running):
    """SERVE_HOST 0.0.0.0 and port 8000 as rendered, in a container with its own network namespace
    (as a pod has): with the documented Secret the serve command starts vLLM; with an empty key it refuses,
    and the harness reports that as a crash loop with the log tail (the shipped base's old default)."""
    env = {"SERVE_HOST": "0.0.0.0", "SERVE_PORT": "8000"}
    launch = "[rocm-vllm] serve: "
    objs = render(tmp_path / "key", "replicas", serve_image, SECRETS)
    run = running(cpu_overlay(pods_of(objs)["pod"], {}, env), network="none")
    assert run.await_log(launch, LAUNCH_S) == "seen", run.logs()
    line = next(x for x in run.logs(100000).splitlines() if x.startswith(launch))
    assert "--host 0.0.0.0 --port 8000" in line and API_KEY not in line
    objs = render(tmp_path / "empty", "replicas", serve_image, "VLLM_API_KEY=\n")
    run = running(cpu_overlay(pods_of(objs)["pod"], {}, env), network="none")
    assert run.await_log(launch, LAUNCH_S) == "exited"
    with pytest.raises(pytest.fail.Exception) as failed:
        run.await_probe("startupProbe", time.monotonic() + 60, restarts=True)
    message = str(failed.value)
    assert "crash loop" in message and "refusing to serve without an API key on 0.0.0.0" in message, message
    h.note("kubernetes: the pod's own address (0.0.0.0:8000): serve starts with the Secret's key; an empty key: "
           "exit, reported as a crash loop with the log tail")


@pytest.mark.docker(unit="second")
def test_multinode_leader_runs_as_rendered_until_vllm_refuses_ray_on_cpu(h, serve_image, tmp_path, running):
    objs = render(tmp_path, "multinode", serve_image, SECRETS)
    leader = pods_of(objs)["leader"]
    leader.extra_env = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "1", "LWS_WORKER_INDEX": "0"}
    pod = cpu_overlay(leader, {"http": free_port(), "ray": free_port()})
    run = running(pod)
    t0 = time.monotonic()
    outcome = run.await_log(RAY_ON_CPU_REFUSED, DEADLINE_S)
    log = run.logs(100000)
    restarts = 0
    while (outcome == "exited" and RAY_START_TIMED_OUT in log and "Ray runtime started" not in log
           and restarts < LEADER_RESTARTS):
        # Ray gives its raylet a fixed 30 s to register (ray/_private/node.py): on the 2-core machine
        # with the other lanes busy it can miss it. The container exited as a pod's would, and the
        # kubelet starts it again (restartPolicy Always, with a back-off): so does this test, a few times.
        run.close()
        run, restarts = running(pod), restarts + 1
        outcome = run.await_log(RAY_ON_CPU_REFUSED, DEADLINE_S)
        log = run.logs(100000)
    restarted = (f" (started again {restarts} time(s), as the kubelet restarts it: Ray's head start timed out)"
                 if restarts else "")
    assert "Ray runtime started" in log, log[-3000:]
    assert "Ray nodes joined within" not in log and "[rocm-vllm] serve: " in log, log[-3000:]
    assert "[rocm-vllm] ray: 1 of 1 nodes joined, all rocm-vllm-" in log, log[-3000:]
    assert "--distributed-executor-backend ray --pipeline-parallel-size 1" in log, log[-3000:]
    if outcome == "seen":
        status = "exited" if run.await_log("never printed: wait for the exit", 120) == "exited" else "running"
        assert status == "exited" and run.state()[1] != 0, run.state()
        h.note(f"kubernetes multinode leader (LWS size 1): Ray head started, group complete, serve reached with the "
               f"Ray executor; vLLM's CPU platform refuses Ray ({RAY_ON_CPU_REFUSED!r}) after "
               f"{time.monotonic() - t0:.1f}s{restarted}: its probes and a completion not run on CPU")
        return
    serve_and_complete(h, run, "multinode leader (LWS size 1)")  # a CPU vLLM that serves through Ray


@pytest.mark.docker(unit="second")
@pytest.mark.parametrize("value", ("abc", "0", "1e3"))
def test_multinode_worker_runs_as_rendered_to_its_settings_check(serve_image, tmp_path, running, value):
    objs = render(tmp_path, "multinode", serve_image, SECRETS)
    worker = pods_of(objs)["worker"]
    worker.extra_env = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
    run = running(cpu_overlay(worker, {}, {"RAY_JOIN_TIMEOUT": value}))
    assert run.await_log("RAY_JOIN_TIMEOUT", LAUNCH_S) == "seen"
    end = time.monotonic() + 30
    while run.state()[0] == "running" and time.monotonic() < end:
        time.sleep(0.5)
    assert run.state() == ("exited", 2), (run.state(), run.logs())
    assert run.logs().splitlines()[-1].startswith(f"error: RAY_JOIN_TIMEOUT='{value}' is not a whole number")
