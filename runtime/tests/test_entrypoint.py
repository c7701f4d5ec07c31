"""entrypoint.sh end to end with fake amd-smi / rocminfo on PATH (no GPU, no vLLM started)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LISTINGS = Path(__file__).parent / "listings"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# The device listings the guard reads: `amd-smi static --asic` (text) and plain `rocminfo`.
TOOL_ARGV = {"amd-smi": "static --asic", "rocminfo": ""}


@pytest.fixture
def box(tmp_path: Path, runtime_dir: Path):
    """A fake image: device tools, /dev/kfd, manifest, an aiter package with one prebuilt module
    and a stand-in for vLLM's API server that prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kfd = tmp_path / "kfd"
    kfd.write_text("")
    dri = tmp_path / "dri"
    dri.mkdir()
    (dri / "renderD128").write_text("")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"schema": 1, "gpu_archs": ["gfx90a", "gfx942", "gfx950"],
                                    "aiter": {"version": "0.1.20", "commit": COMMIT, "ck_commit": ""},
                                    "vllm": {"version": "0.32.0", "commit": ""},
                                    "prebuilt_modules": ["module_mla_asm"]}))
    pkgs = tmp_path / "pkgs"
    (pkgs / "aiter" / "jit").mkdir(parents=True)
    (pkgs / "aiter" / "__init__.py").write_text("raise ImportError('never imported by the guard')\n")
    (pkgs / "aiter" / "jit" / "module_mla_asm.so").write_text("")
    server = pkgs / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    for d in (pkgs / "vllm", pkgs / "vllm" / "entrypoints", server):
        (d / "__init__.py").write_text("")
    (server / "api_server.py").write_text(
        "import json, os, sys\n"
        "print('API_SERVER ' + json.dumps({'argv': sys.argv[1:], "
        "'aiter': os.environ.get('VLLM_ROCM_USE_AITER'), 'jit': os.environ.get('AITER_JIT_DIR')}))\n")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(pkgs),
        "ROCM_VLLM_PYTHON": sys.executable,
        "ROCM_VLLM_KFD_PATH": str(kfd),
        "ROCM_VLLM_DRI_PATH": str(dri),
        # as compose passes VLLM_BIND_ADDRESS (default 127.0.0.1) in
        "ROCM_VLLM_PUBLISHED_ADDRESS": "127.0.0.1",
        "ROCM_VLLM_MANIFEST": str(manifest),
        "ROCM_VLLM_JIT_CACHE": str(tmp_path / "jit-cache"),
        "TMPDIR": str(tmp_path / "tmp"),  # the container's own /tmp: AITER's builds and their locks
        "TINY_MLA_MODEL": str(tmp_path / "tiny-mla"),
    }

    class Box:
        root = tmp_path

        def tool(self, name: str, listing: str | None, rc: int = 0) -> None:
            # The fake answers only the exact command line the guard must use.
            expected = TOOL_ARGV[name]
            check = (f'if [ "$*" != "{expected}" ]; then echo "fake {name}: unexpected arguments: $*" >&2; '
                     "exit 2; fi\n")
            body = f"cat '{LISTINGS / listing}'\n" if listing else ""
            (bin_dir / name).write_text(f"#!/bin/sh\n{check}{body}exit {rc}\n")
            (bin_dir / name).chmod(0o755)

        def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["bash", str(runtime_dir / "entrypoint.sh"), *args],
                                  env={**env, **extra}, capture_output=True, text=True, timeout=120)

    box = Box()
    box.kfd = kfd
    box.dri = dri
    return box


def _server_call(stdout: str) -> dict:
    line = next(l for l in stdout.splitlines() if l.startswith("API_SERVER "))
    return json.loads(line[len("API_SERVER "):])


def test_serve_on_gfx942_turns_aiter_on_and_runs_the_server(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("serve", "--max-num-seqs", "8")
    assert proc.returncode == 0, proc.stderr
    call = _server_call(proc.stdout)
    assert call["aiter"] == "1"
    assert call["jit"] == str(box.root / "jit-cache" / f"aiter-{COMMIT[:12]}")
    assert call["argv"][-2:] == ["--max-num-seqs", "8"]
    assert "--load-format" in call["argv"] and "--skip-tokenizer-init" in call["argv"]
    link = Path(call["jit"]) / "module_mla_asm.so"
    assert link.is_symlink()
    assert (Path(call["jit"]) / "build").resolve().parent == box.root / "tmp" / "rocm-vllm-aiter-build"
    assert "AITER on for gfx942" in proc.stderr
    assert f"AITER JIT cache: {call['jit']}" in proc.stderr


def test_no_command_means_serve(box) -> None:
    box.tool("rocminfo", "rocminfo_gfx950.txt")
    proc = box.run()
    assert proc.returncode == 0, proc.stderr
    assert _server_call(proc.stdout)["aiter"] == "1"


def test_serve_without_kfd_fails_with_one_line(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    box.kfd.unlink()
    proc = box.run("serve")
    assert proc.returncode == 1
    errors = [l for l in proc.stderr.splitlines() if "error:" in l]
    assert len(errors) == 1 and "--device /dev/kfd" in errors[0]
    assert "API_SERVER" not in proc.stdout


def test_serve_without_gpu_fails(box) -> None:
    box.tool("amd-smi", None, rc=1)
    box.tool("rocminfo", "rocminfo_cpu_only.txt")
    proc = box.run("serve")
    assert proc.returncode == 1
    assert "error: no AMD GPU found" in proc.stderr


def test_serve_on_unbuilt_arch_names_gpu_archs(box) -> None:
    box.tool("rocminfo", "rocminfo_gfx1100.txt")
    proc = box.run("serve")
    assert proc.returncode == 1
    assert "GPU arch gfx1100" in proc.stderr and "GPU_ARCHS" in proc.stderr


def test_serve_with_a_manifest_of_another_schema_stops_in_one_line(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    manifest = box.root / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "schema": 2}))
    proc = box.run("serve")
    assert proc.returncode == 1
    errors = [l for l in proc.stderr.splitlines() if "error:" in l]
    assert len(errors) == 1 and "has schema 2" in errors[0] and "rebuild the image" in errors[0], proc.stderr
    assert "API_SERVER" not in proc.stdout


def test_gfx90a_runs_with_aiter_off(box) -> None:
    box.tool("rocminfo", "rocminfo_gfx90a.txt")
    proc = box.run("sh", "-c", "echo use_aiter=$VLLM_ROCM_USE_AITER")
    assert proc.returncode == 0, proc.stderr
    assert "use_aiter=0" in proc.stdout
    assert len([l for l in proc.stderr.splitlines() if "AITER off" in l]) == 1


def test_user_setting_wins(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("sh", "-c", "echo use_aiter=$VLLM_ROCM_USE_AITER jit=$AITER_JIT_DIR",
                   VLLM_ROCM_USE_AITER="0", AITER_JIT_DIR=str(box.root / "mine"))
    assert proc.returncode == 0, proc.stderr
    assert f"use_aiter=0 jit={box.root / 'mine'}" in proc.stdout
    assert (box.root / "mine" / "module_mla_asm.so").is_symlink()


def test_selftest_mode_runs_without_gpu(box) -> None:
    box.kfd.unlink()
    proc = box.run("selftest", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "selftest" in proc.stdout and "warning: no" in proc.stderr


def test_cpu_serve_with_gpu_check_off(box) -> None:
    box.kfd.unlink()
    proc = box.run("serve", ROCM_VLLM_REQUIRE_GPU="0")
    assert proc.returncode == 0, proc.stderr
    assert _server_call(proc.stdout)["aiter"] == "0"


def test_unwritable_jit_cache_is_fatal_for_serve(box) -> None:
    if os.geteuid() == 0:
        blocker = box.root / "file"
        blocker.write_text("")
        cache = str(blocker / "sub")  # a path below a regular file can never be created
    else:
        cache = "/proc/aiter-jit"
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("serve", ROCM_VLLM_JIT_CACHE=cache)
    assert proc.returncode == 1
    assert "AITER_JIT_DIR" in proc.stderr and "API_SERVER" not in proc.stdout


def _errors(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if "error:" in l]


def test_aiter_value_vllm_ignores_stops_with_one_line(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    for mode in (("serve",), ("sh", "-c", "true")):
        proc = box.run(*mode, VLLM_ROCM_USE_AITER="yes")
        assert proc.returncode == 1
        assert len(_errors(proc.stderr)) == 1 and "VLLM_ROCM_USE_AITER=yes" in proc.stderr
        assert "API_SERVER" not in proc.stdout and "Traceback" not in proc.stderr


def test_require_gpu_value_out_of_its_set_stops_with_one_line(box) -> None:
    box.kfd.unlink()
    proc = box.run("serve", ROCM_VLLM_REQUIRE_GPU="false")
    assert proc.returncode == 1
    assert len(_errors(proc.stderr)) == 1 and "ROCM_VLLM_REQUIRE_GPU=false" in proc.stderr


# ------------------------------------------------- API key on a reachable address

@pytest.mark.parametrize("extra", [
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "0.0.0.0"},                       # compose, VLLM_BIND_ADDRESS=0.0.0.0
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "192.168.1.7"},
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "", "SERVE_HOST": ""},            # docker run: binds every address
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "", "SERVE_HOST": "10.1.2.3"},
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "0.0.0.0", "VLLM_API_KEY": ""},
])
def test_reachable_address_without_api_key_is_refused(box, extra) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("serve", **extra)
    assert proc.returncode == 1, proc.stdout
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and "API_SERVER" not in proc.stdout
    assert "VLLM_API_KEY" in errors[0] and "ROCM_VLLM_ALLOW_NO_API_KEY=1" in errors[0]


def test_host_option_on_the_command_line_counts(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("serve", "--host", "0.0.0.0", ROCM_VLLM_PUBLISHED_ADDRESS="")
    assert proc.returncode == 1 and "ROCM_VLLM_ALLOW_NO_API_KEY" in proc.stderr
    proc = box.run("serve", "--host=127.0.0.1", ROCM_VLLM_PUBLISHED_ADDRESS="")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("extra", [
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "0.0.0.0", "VLLM_API_KEY": "k-env"},
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "0.0.0.0", "SERVE_EXTRA_ARGS": "--api-key k-arg"},
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "0.0.0.0", "ROCM_VLLM_ALLOW_NO_API_KEY": "1"},
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "127.0.0.1"},                     # compose default: loopback only
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "", "SERVE_HOST": "127.0.0.1"},   # host network, loopback
    {"ROCM_VLLM_PUBLISHED_ADDRESS": "", "SERVE_HOST": "::1"},
])
def test_key_opt_out_or_loopback_serves(box, extra) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("serve", **extra)
    assert proc.returncode == 0, proc.stderr
    assert _server_call(proc.stdout)
    if "ROCM_VLLM_ALLOW_NO_API_KEY" in extra:
        assert any("warning:" in l and "without an API key" in l for l in proc.stderr.splitlines())


def test_opt_out_takes_only_one_or_zero(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("serve", ROCM_VLLM_PUBLISHED_ADDRESS="0.0.0.0", ROCM_VLLM_ALLOW_NO_API_KEY="yes")
    assert proc.returncode == 1
    assert len(_errors(proc.stderr)) == 1 and "ROCM_VLLM_ALLOW_NO_API_KEY=yes" in proc.stderr


def test_api_key_is_masked_in_the_start_line(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("serve", "--api-key=k-cli", ROCM_VLLM_PUBLISHED_ADDRESS="0.0.0.0",
                   SERVE_EXTRA_ARGS="--api-key k-extra1 k-extra2 --max-num-seqs 4", VLLM_API_KEY="k-env")
    assert proc.returncode == 0, proc.stderr
    for secret in ("k-cli", "k-extra1", "k-extra2", "k-env"):
        assert secret not in proc.stderr
    start = next(l for l in proc.stderr.splitlines() if "serve:" in l)
    assert "--api-key '***' '***'" in start and "--api-key=***" in start and "--max-num-seqs 4" in start
    argv = _server_call(proc.stdout)["argv"]
    assert argv[argv.index("--api-key"):argv.index("--api-key") + 3] == ["--api-key", "k-extra1", "k-extra2"]
    assert "--api-key=k-cli" in argv


def test_unclosed_quote_in_extra_args_is_one_line(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("serve", SERVE_EXTRA_ARGS="--served-model-name 'my model")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "API_SERVER" not in proc.stdout
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and "SERVE_EXTRA_ARGS" in errors[0]


# ------------------------------------------------- render nodes and the JIT cache

def test_render_node_that_cannot_be_opened_names_render_gid(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    node = box.dri / "renderD128"
    node.unlink()
    if os.geteuid() == 0:
        node.symlink_to(box.root / "no-such-device")  # root opens any file: only a missing target fails
    else:
        node.write_text("")
        node.chmod(0)
    proc = box.run("serve")
    assert proc.returncode == 1 and "API_SERVER" not in proc.stdout
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and str(node) in errors[0]
    assert "RENDER_GID" in errors[0] and "getent group render" in errors[0]


def test_no_render_node_asks_for_dev_dri(box) -> None:
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    (box.dri / "renderD128").unlink()
    proc = box.run("serve")
    assert proc.returncode == 1 and "--device /dev/dri" in proc.stderr


def test_jit_dir_not_exported_when_the_cache_cannot_be_prepared(box) -> None:
    blocker = box.root / "file"
    blocker.write_text("")
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("sh", "-c", "echo jit=${AITER_JIT_DIR-unset}", ROCM_VLLM_JIT_CACHE=str(blocker / "sub"))
    assert proc.returncode == 0, proc.stderr
    assert "jit=unset" in proc.stdout
    warnings = [l for l in proc.stderr.splitlines() if "AITER JIT cache" in l]
    assert len(warnings) == 1 and "AITER_JIT_DIR not set" in warnings[0]


def test_triton_and_vllm_caches_are_made_on_the_volume_and_exported(box) -> None:
    """Triton's kernel cache and vLLM's cache folder live on the JIT cache volume (the planner's warm-up,
    vLLM's Triton kernels, torch.compile's artifacts and what vLLM learns of a model class in a child
    process are made once per volume); where one cannot be made it is not exported."""
    show = "echo triton=${TRITON_CACHE_DIR-unset} vllm=${VLLM_CACHE_ROOT-unset}"
    box.tool("amd-smi", "amdsmi_gfx942.txt")
    proc = box.run("sh", "-c", show)
    assert proc.returncode == 0, proc.stderr
    caches = box.root / "jit-cache"
    assert f"triton={caches / 'triton'} vllm={caches / 'vllm'}" in proc.stdout
    assert (caches / "triton").is_dir() and (caches / "vllm").is_dir()
    assert f"Triton kernels in {caches / 'triton'}, vLLM's caches in {caches / 'vllm'}" in proc.stderr
    blocker = box.root / "file"
    blocker.write_text("")
    proc = box.run("sh", "-c", show, ROCM_VLLM_JIT_CACHE=str(blocker / "sub"))
    assert proc.returncode == 0, proc.stderr
    assert "triton=unset vllm=unset" in proc.stdout
    assert "TRITON_CACHE_DIR not set" in proc.stderr and "VLLM_CACHE_ROOT not set" in proc.stderr
    (box.root / "vllm-file").write_text("")
    proc = box.run("sh", "-c", show, TRITON_CACHE_DIR="/mine", VLLM_CACHE_ROOT=str(box.root / "vllm-file" / "x"))
    assert f"triton=/mine vllm={box.root / 'vllm-file' / 'x'}" in proc.stdout  # as given, never prepared
