"""Smoke suite (needs an AMD GPU with AITER): does this image work on this GPU?

* AITER imports and reports the GPU arch (one the image was built for);
* aiter.mla.mla_decode_fwd and aiter.flash_attn_varlen_func agree with the
  backend package's pure-PyTorch reference on small bf16 shapes (16 and 128
  heads; vLLM block sizes 1 and 16 through the package's decode planning);
* vLLM serves the tiny dummy-weight MLA model with ROCM_AITER_MLA selected and
  completes a request;
* the AITER modules used were prebuilt: nothing was compiled at run time (JIT).

Elsewhere every check skips with the reason (no /dev/kfd, aiter not importable);
`selftest smoke` reports such a run as "could not run", never as a pass.

Settings: TINY_MLA_MODEL (model directory), SMOKE_START_TIMEOUT (seconds for the
server to become healthy, default 900), SMOKE_SERVE_ARGS (extra server arguments),
ROCM_VLLM_MANIFEST (image manifest).
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from rocm_vllm_runtime import files, jitcache, numeric, web
from rocm_vllm_runtime.guard import kfd_path
from rocm_vllm_runtime.manifest import ManifestError, load_manifest
from rocm_vllm_runtime.selection import OURS, selection
from rocm_vllm_runtime.serve import tiny_model

# runtime/ in this repository, /opt/rocm-vllm in the image: the tiny model is under models/ in both
RUNTIME_DIR = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.gpu

KV_LORA_RANK, ROPE_DIM = 512, 64
ATOL = RTOL = 2e-2  # bf16 kernels against an fp32-softmax reference
JIT_BUILD = re.compile(r"start build \[(\w+)\]")


def missing_gpu_reason() -> str:
    """'' when AITER can run here, else what is missing (checked without touching the GPU first)."""
    kfd = kfd_path(os.environ)
    if not os.path.exists(kfd):
        return f"no {kfd}: no AMD GPU in this container (docker run --device /dev/kfd --device /dev/dri)"
    if importlib.util.find_spec("aiter") is None:
        return "aiter not installed"
    try:
        import torch
    except ImportError as exc:
        return f"torch not importable: {exc}"
    if getattr(torch.version, "hip", None) is None or not torch.cuda.is_available():
        return "torch sees no ROCm GPU (a ROCm build of torch and a visible GPU are needed)"
    try:
        importlib.import_module("aiter")
    except Exception as exc:  # noqa: BLE001 - any import failure means: cannot run
        return f"aiter not importable: {exc.__class__.__name__}: {exc}"
    return ""


@pytest.fixture(scope="session")
def jit_snapshot() -> dict[str, float]:
    """Real .so files in AITER's JIT directory before the suite touched AITER."""
    return _jit_files()


def _jit_dir() -> Path | None:
    if os.environ.get("AITER_JIT_DIR"):
        return Path(os.environ["AITER_JIT_DIR"])
    return jitcache.aiter_prebuilt_dir()


def _jit_files() -> dict[str, float]:
    root = _jit_dir()
    if root is None or not root.is_dir():
        return {}
    files = {p.name: p.stat().st_mtime for p in root.glob("*.so") if p.is_file() and not p.is_symlink()}
    build = root / "build"
    if build.is_dir():
        files.update({f"build/{p.name}": p.stat().st_mtime for p in build.iterdir() if p.is_dir()})
    return files


@pytest.fixture(scope="session")
def aiter(jit_snapshot: dict[str, float]) -> ModuleType:
    reason = missing_gpu_reason()
    if reason:
        pytest.skip(reason)
    return importlib.import_module("aiter")


@pytest.fixture(scope="session")
def torch_gpu(aiter: ModuleType):
    import torch

    torch.manual_seed(0)
    return torch


@pytest.fixture(scope="session")
def reference() -> ModuleType:
    return importlib.import_module("vllm_aiter_mla.reference")


def test_aiter_reports_gpu_arch(aiter: ModuleType, torch_gpu) -> None:
    from aiter.jit.utils.chip_info import get_gfx

    arch = get_gfx()
    device_arch = torch_gpu.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    print(f"AITER reports {arch}; torch reports {torch_gpu.cuda.get_device_properties(0).gcnArchName}")
    assert arch == device_arch
    try:
        built = load_manifest(os.environ).gpu_archs
    except ManifestError:
        return
    assert arch in built, f"{arch} not among the image's GPU_ARCHS {built}"


def _paged_cache(torch, seq_lens: list[int], block_size: int, device: str):
    """A KV cache of shuffled blocks, its block table and query_start_loc (one query per request)."""
    blocks_per_req = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_req) + 3
    order = torch.randperm(num_blocks, device=device).to(torch.int32)
    width = max(blocks_per_req)
    block_table = torch.zeros(len(seq_lens), width, dtype=torch.int32, device=device)
    used = 0
    for row, n in enumerate(blocks_per_req):
        block_table[row, :n] = order[used:used + n]
        used += n
    cache = torch.randn(num_blocks * block_size, KV_LORA_RANK + ROPE_DIM, dtype=torch.bfloat16,
                        device=device)
    seq = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    qsl = torch.arange(len(seq_lens) + 1, dtype=torch.int32, device=device)
    return cache, block_table, seq, qsl


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("num_heads", [16, 128])
def test_mla_decode_matches_reference(aiter: ModuleType, torch_gpu, reference: ModuleType,
                                      num_heads: int, block_size: int) -> None:
    torch = torch_gpu
    from aiter.mla import mla_decode_fwd

    from vllm_aiter_mla.planning import plan_decode

    seq_lens = [1, 17, 40, 129]
    cache, block_table, seq, qsl = _paged_cache(torch, seq_lens, block_size, "cuda")
    plan = plan_decode(block_table, seq, qsl, block_size)
    kv_buffer = cache.view(-1, 1, 1, KV_LORA_RANK + ROPE_DIM)  # pages of one slot
    q = torch.randn(len(seq_lens), num_heads, KV_LORA_RANK + ROPE_DIM, dtype=torch.bfloat16,
                    device="cuda")
    scale = 1.0 / (128 + ROPE_DIM) ** 0.5  # the model's qk head dim, as vLLM passes it
    args = (plan.qo_indptr, plan.kv_indptr, plan.kv_indices, plan.kv_last_page_lens)
    out = torch.empty(len(seq_lens), num_heads, KV_LORA_RANK, dtype=torch.bfloat16, device="cuda")
    expected = torch.empty_like(out)
    mla_decode_fwd(q, kv_buffer, out, *args, 1, page_size=1, nhead_kv=1, sm_scale=scale)
    reference.mla_decode_fwd(q, kv_buffer, expected, *args, 1, page_size=1, nhead_kv=1,
                             sm_scale=scale)
    torch.cuda.synchronize()
    assert expected.abs().sum() > 0
    torch.testing.assert_close(out.float(), expected.float(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("num_heads", [16, 128])
def test_flash_attn_varlen_matches_reference(aiter: ModuleType, torch_gpu, reference: ModuleType,
                                             num_heads: int) -> None:
    torch = torch_gpu
    lens = [5, 17, 64]
    total = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    qk_dim, v_dim = 128 + ROPE_DIM, 128  # DeepSeek prefill: nope 128 + rope 64, v 128
    q = torch.randn(total, num_heads, qk_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(total, num_heads, qk_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(total, num_heads, v_dim, dtype=torch.bfloat16, device="cuda")
    kwargs = dict(softmax_scale=qk_dim ** -0.5, causal=True)
    out = aiter.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), **kwargs)
    expected = reference.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    expected = expected[0] if isinstance(expected, tuple) else expected
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), expected.float(), atol=ATOL, rtol=RTOL)


def test_manifest_prebuilt_modules_are_installed(aiter: ModuleType) -> None:
    try:
        manifest = load_manifest(os.environ)
    except ManifestError as exc:
        pytest.fail(str(exc))
    prebuilt = jitcache.aiter_prebuilt_dir()
    assert prebuilt is not None
    missing = [m for m in manifest.prebuilt_modules if not (prebuilt / f"{m}.so").is_file()]
    assert manifest.prebuilt_modules, "manifest lists no prebuilt modules"
    assert not missing, f"prebuilt modules missing from {prebuilt}: {missing}"


def test_kernels_ran_without_jit_compilation(aiter: ModuleType, jit_snapshot: dict[str, float]) -> None:
    """Runs after the kernel checks: AITER built nothing while they ran."""
    from aiter.jit import core

    prebuilt = jitcache.aiter_prebuilt_dir()
    loaded = getattr(core, "__mds", {})
    compiled = sorted(
        name for name, module in loaded.items()
        if prebuilt is not None and getattr(module, "__file__", None)
        and not Path(module.__file__).resolve().is_relative_to(prebuilt.resolve())
    )
    new = sorted(k for k, t in _jit_files().items() if jit_snapshot.get(k) != t)
    print(f"AITER modules loaded: {sorted(loaded)}")
    assert loaded, "no AITER module was loaded by the kernel checks"
    assert not compiled, f"AITER modules compiled at run time (not prebuilt): {compiled}"
    assert not new, f"AITER JIT build outputs appeared during the suite: {new}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_dir() -> Path:
    for candidate in (os.environ.get("TINY_MLA_MODEL"), tiny_model({}),
                      str(RUNTIME_DIR / "models" / "tiny-mla")):
        if candidate and (Path(candidate) / "config.json").is_file():
            return Path(candidate)
    pytest.fail("tiny MLA model not found: set TINY_MLA_MODEL to its directory")


def _post(url: str, body: dict, timeout: float) -> dict:
    with web.request(url, json.dumps(body).encode(), {"Content-Type": "application/json"},
                     timeout=timeout) as response:
        return files.json_value(files.read_bounded(response, url), url)


def test_vllm_serves_tiny_mla_with_rocm_aiter_mla(aiter: ModuleType, tmp_path: Path) -> None:
    model, port = _model_dir(), _free_port()
    env = dict(os.environ, TINY_MLA_MODEL=str(model))
    if env.get("VLLM_TARGET_DEVICE") == "cpu":  # set for CPU runs of the suites only
        del env["VLLM_TARGET_DEVICE"]
    env.setdefault("VLLM_ROCM_USE_AITER", "1")
    command = [sys.executable, "-m", "rocm_vllm_runtime.serve", "--model", str(model),
               "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
               "--gpu-memory-utilization", "0.3",
               *shlex.split(os.environ.get("SMOKE_SERVE_ARGS", ""))]
    log_path = tmp_path / "server.log"
    deadline = time.monotonic() + numeric.duration("SMOKE_START_TIMEOUT", os.environ.get("SMOKE_START_TIMEOUT", "900"))
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while True:
                assert proc.poll() is None, (f"server exited {proc.returncode}: "
                                             + log_path.read_text()[-2000:])
                try:
                    web.request(f"{base}/health", timeout=5).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "server not healthy in SMOKE_START_TIMEOUT"
                    time.sleep(2)
            reply = _post(f"{base}/v1/completions",
                          {"model": str(model), "prompt": list(range(1, 17)), "max_tokens": 8,
                           "temperature": 0.0, "ignore_eos": True, "return_token_ids": True},
                          timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    text = log_path.read_text(errors="replace")
    selected = selection(text)
    built = sorted(set(JIT_BUILD.findall(text)))
    print(f"backends selected: {sorted(selected.attention_backends)}; implementation: {selected.implementation}; "
          f"usage: {reply.get('usage')}")
    assert reply["usage"]["completion_tokens"] == 8
    assert selected.attention_backends == ("ROCM_AITER_MLA",), \
        f"expected ROCM_AITER_MLA only, log shows {list(selected.attention_backends)}"
    assert selected.implementation == OURS, "ROCM_AITER_MLA ran, but not this image's implementation (vllm-aiter-mla)"
    assert not built, f"AITER compiled modules at run time while serving: {built}"
