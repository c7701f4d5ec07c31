"""Decisions of the runtime guard for fake device listings (no GPU needed)."""
from __future__ import annotations

from pathlib import Path

import pytest

from rocm_vllm_runtime import guard
from rocm_vllm_runtime.guard import GuardInputs, Listing, decide, shell_exports, strictness
from rocm_vllm_runtime.manifest import parse_manifest

LISTINGS = Path(__file__).parent / "listings"
COMMIT = "de07f3885ee5f2030ba72b6cc5940d674fd457cf"
MANIFEST = parse_manifest({
    "schema": 1,
    "gpu_archs": ["gfx942", "gfx950"],
    "aiter": {"version": "0.1.20.post1", "commit": COMMIT, "ck_commit": "f" * 40},
    "vllm": {"version": "0.32.0", "commit": "a" * 40},
    "prebuilt_modules": ["module_mla_asm"],
})


def smi(name: str) -> Listing:
    return Listing("amd-smi", (LISTINGS / name).read_text())


def rocminfo(name: str) -> Listing:
    return Listing("rocminfo", (LISTINGS / name).read_text())


ABSENT = (Listing("amd-smi", None, "not installed"), Listing("rocminfo", None, "not installed"))


def inputs(listings=ABSENT, mode="serve", env=None, kfd=True, manifest=MANIFEST,
           manifest_error="", aiter=True, render_nodes=None) -> GuardInputs:
    extra = {} if render_nodes is None else {"render_nodes": render_nodes}
    return GuardInputs(mode=mode, listings=listings, env=env or {}, has_kfd=kfd,
                       manifest=manifest, manifest_error=manifest_error, aiter_installed=aiter, **extra)


@pytest.mark.parametrize("listing", [
    smi("amdsmi_gfx942.txt"), smi("amdsmi_gfx942.json"), rocminfo("rocminfo_gfx942.txt"),
    smi("amdsmi_gfx950.txt"), rocminfo("rocminfo_gfx950.txt"), smi("amdsmi_mixed.txt"),
])
def test_cdna3_and_newer_turn_aiter_on(listing: Listing) -> None:
    decision = decide(inputs([listing]))
    assert decision.ok
    assert decision.env["VLLM_ROCM_USE_AITER"] == "1"
    assert any(line.startswith("AITER on") for line in decision.log)


def test_gfx90a_turns_aiter_off_in_one_line() -> None:
    decision = decide(inputs([rocminfo("rocminfo_gfx90a.txt")],
                             manifest=parse_manifest({"schema": 1, "gpu_archs": ["gfx90a", "gfx942"],
                                                      "aiter": None})))
    assert decision.ok
    assert decision.env["VLLM_ROCM_USE_AITER"] == "0"
    off = [line for line in decision.log if line.startswith("AITER off")]
    assert len(off) == 1 and "gfx90a" in off[0]


def test_mixed_archs_all_built_turn_aiter_off_and_say_why() -> None:
    manifest = parse_manifest({"schema": 1, "gpu_archs": ["gfx90a", "gfx942"], "aiter": {"commit": COMMIT}})
    decision = decide(inputs([rocminfo("rocminfo_mixed.txt")], manifest=manifest))
    assert decision.ok
    assert decision.env["VLLM_ROCM_USE_AITER"] == "0"
    assert any("mixed GPU archs gfx90a;gfx942" in line for line in decision.log)


@pytest.mark.parametrize("listing, missing", [
    (rocminfo("rocminfo_gfx90a.txt"), "gfx90a"),
    (rocminfo("rocminfo_gfx1100.txt"), "gfx1100"),
    (rocminfo("rocminfo_mixed.txt"), "gfx90a"),
])
def test_arch_not_built_is_fatal_for_serve_and_names_gpu_archs(listing: Listing, missing: str) -> None:
    decision = decide(inputs([listing]))
    assert not decision.ok
    assert f"GPU arch {missing}" in decision.fatal
    assert "GPU_ARCHS" in decision.fatal
    assert "\n" not in decision.fatal


def test_arch_not_built_only_warns_for_selftest() -> None:
    decision = decide(inputs([rocminfo("rocminfo_gfx1100.txt")], mode="selftest"))
    assert decision.ok
    assert decision.env["VLLM_ROCM_USE_AITER"] == "0"
    assert any(line.startswith("warning:") and "GPU_ARCHS" in line for line in decision.log)


def test_no_kfd_is_fatal_for_serve() -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], kfd=False))
    assert not decision.ok
    assert "/dev/kfd" in decision.fatal and "--device /dev/kfd" in decision.fatal


def test_no_kfd_path_follows_setting() -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], kfd=False,
                             env={"ROCM_VLLM_KFD_PATH": "/x/kfd"}))
    assert "no /x/kfd" in decision.fatal


@pytest.mark.parametrize("listings", [
    ABSENT,
    (rocminfo("rocminfo_cpu_only.txt"),),
    (Listing("amd-smi", None, "exit 1 amdsmi_init failed"), rocminfo("rocminfo_cpu_only.txt")),
])
def test_no_gpu_is_fatal_for_serve(listings) -> None:
    decision = decide(inputs(listings))
    assert not decision.ok
    assert decision.fatal.startswith("no AMD GPU found")
    assert "ROCM_VLLM_REQUIRE_GPU=0" in decision.fatal


def test_no_gpu_is_not_fatal_for_selftest_and_exec() -> None:
    for mode in ("selftest", "exec"):
        decision = decide(inputs(kfd=False, mode=mode))
        assert decision.ok
        assert decision.env["VLLM_ROCM_USE_AITER"] == "0"


def test_require_gpu_setting() -> None:
    assert strictness("serve", {}) == "strict"
    assert strictness("selftest", {}) == "warn"
    assert strictness("exec", {"ROCM_VLLM_REQUIRE_GPU": "1"}) == "strict"
    assert strictness("serve", {"ROCM_VLLM_REQUIRE_GPU": "0"}) == "off"
    decision = decide(inputs(kfd=False, env={"ROCM_VLLM_REQUIRE_GPU": "0"}))
    assert decision.ok and decision.env["VLLM_ROCM_USE_AITER"] == "0"


def test_amd_smi_without_arch_falls_back_to_rocminfo() -> None:
    decision = decide(inputs([smi("amdsmi_no_arch.txt"), rocminfo("rocminfo_gfx942.txt")]))
    assert decision.ok
    assert [g.target for g in decision.gpus] == ["gfx942:sramecc+:xnack-"] * 2
    assert any(line.startswith("GPUs (rocminfo)") for line in decision.log)


@pytest.mark.parametrize("value", ["0", "1"])
def test_user_choice_of_aiter_is_kept(value: str) -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], env={"VLLM_ROCM_USE_AITER": value}))
    assert decision.ok
    assert "VLLM_ROCM_USE_AITER" not in decision.env
    assert any("set by the user" in line for line in decision.log)


def test_user_aiter_on_unsupported_arch_is_warned() -> None:
    manifest = parse_manifest({"schema": 1, "gpu_archs": ["gfx90a"], "aiter": None})
    decision = decide(inputs([rocminfo("rocminfo_gfx90a.txt")], manifest=manifest,
                             env={"VLLM_ROCM_USE_AITER": "1"}))
    assert decision.ok and "VLLM_ROCM_USE_AITER" not in decision.env
    assert any(line.startswith("warning:") and "gfx90a" in line for line in decision.log)


def test_jit_dir_defaults_to_cache_keyed_by_aiter_commit() -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")]))
    assert decision.env["AITER_JIT_DIR"] == f"/var/cache/aiter-jit/aiter-{COMMIT[:12]}"
    assert decision.jit_mount == "/var/cache/aiter-jit"


@pytest.mark.parametrize(("name", "folder"), [("TRITON_CACHE_DIR", "triton"), ("VLLM_CACHE_ROOT", "vllm")])
def test_triton_and_vllm_caches_on_the_jit_cache_volume_unless_set(name, folder) -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")]))
    assert decision.env[name] == f"/var/cache/aiter-jit/{folder}"
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], env={"ROCM_VLLM_JIT_CACHE": "/c"}))
    assert decision.env[name] == f"/c/{folder}"
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], env={name: "/mine"}))
    assert name not in decision.env and name not in decision.cache_dirs
    assert len(decision.cache_dirs) == 1  # the other one still goes to the volume


def test_jit_dir_root_and_user_override() -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], env={"ROCM_VLLM_JIT_CACHE": "/c"}))
    assert decision.env["AITER_JIT_DIR"] == f"/c/aiter-{COMMIT[:12]}"
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], env={"AITER_JIT_DIR": "/mine"}))
    assert "AITER_JIT_DIR" not in decision.env and decision.jit_dir == "/mine"


def test_no_aiter_no_jit_dir_and_serve_on_cdna3_is_fatal() -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], aiter=False))
    assert "AITER_JIT_DIR" not in decision.env
    assert not decision.ok and "aiter" in decision.fatal
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], aiter=False,
                             env={"VLLM_ROCM_USE_AITER": "0"}))
    assert decision.ok
    # Triton's and vLLM's caches still go to the volume (vLLM's Triton kernels, torch.compile)
    assert decision.env["TRITON_CACHE_DIR"] == "/var/cache/aiter-jit/triton"
    assert decision.env["VLLM_CACHE_ROOT"] == "/var/cache/aiter-jit/vllm"


def test_missing_manifest_is_fatal_for_serve_with_setting_named() -> None:
    error = "image manifest not readable at /opt/rocm-vllm/manifest.json; set ROCM_VLLM_MANIFEST"
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], manifest=None, manifest_error=error))
    assert not decision.ok and "ROCM_VLLM_MANIFEST" in decision.fatal
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], mode="selftest", manifest=None,
                             manifest_error=error))
    assert decision.ok and decision.env["VLLM_ROCM_USE_AITER"] == "1"


def test_shell_exports_are_quoted() -> None:
    assert shell_exports({"B": "x y", "A": "1"}) == "export A=1\nexport B='x y'\n"


# ------------------------------------------------- settings read as vLLM reads them

@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("TRUE", True), ("True", True),
                                       ("0", False), ("false", False), ("FALSE", False)])
def test_aiter_values_vllm_reads_are_kept_and_interpreted_as_vllm_does(value: str, on: bool) -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], env={"VLLM_ROCM_USE_AITER": value}))
    assert decision.ok, decision.fatal
    assert "VLLM_ROCM_USE_AITER" not in decision.env
    kept = [line for line in decision.log if "set by the user" in line]
    assert len(kept) == 1 and ("AITER on" if on else "AITER off") in kept[0]


@pytest.mark.parametrize("switch", ["VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MLA"])
@pytest.mark.parametrize("value", ["yes", "on", "2", " 1", "enabled", "-1"])
def test_aiter_values_vllm_ignores_are_rejected_in_one_line(switch: str, value: str) -> None:
    for mode in ("serve", "selftest", "exec"):
        decision = decide(inputs([smi("amdsmi_gfx942.txt")], mode=mode, env={switch: value}))
        assert not decision.ok
        assert decision.fatal.startswith(f"{switch}=") and "\n" not in decision.fatal
        assert "1" in decision.fatal and "0" in decision.fatal


@pytest.mark.parametrize("value", ["1", "TRUE", "0", "False", ""])
def test_aiter_mla_switch_values_vllm_reads_are_kept(value: str) -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], env={"VLLM_ROCM_USE_AITER_MLA": value}))
    assert decision.ok, decision.fatal


def test_aiter_false_without_aiter_installed_serves_with_aiter_off() -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], aiter=False, env={"VLLM_ROCM_USE_AITER": "false"}))
    assert decision.ok, decision.fatal
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], aiter=False, env={"VLLM_ROCM_USE_AITER": "True"}))
    assert not decision.ok and "aiter" in decision.fatal


def test_aiter_true_any_case_on_unsupported_arch_is_warned() -> None:
    manifest = parse_manifest({"schema": 1, "gpu_archs": ["gfx90a"], "aiter": None})
    decision = decide(inputs([rocminfo("rocminfo_gfx90a.txt")], manifest=manifest,
                             env={"VLLM_ROCM_USE_AITER": "TRUE"}))
    assert decision.ok
    assert any(line.startswith("warning:") and "gfx90a" in line for line in decision.log)


@pytest.mark.parametrize("value", ["yes", "true", "2", "off", " 0"])
def test_require_gpu_accepts_only_its_documented_values(value: str) -> None:
    for mode in ("serve", "selftest"):
        decision = decide(inputs(kfd=False, mode=mode, env={"ROCM_VLLM_REQUIRE_GPU": value}))
        assert not decision.ok
        assert decision.fatal.startswith("ROCM_VLLM_REQUIRE_GPU=") and "\n" not in decision.fatal


def test_require_gpu_empty_means_unset() -> None:
    assert strictness("serve", {"ROCM_VLLM_REQUIRE_GPU": ""}) == "strict"
    assert strictness("selftest", {"ROCM_VLLM_REQUIRE_GPU": ""}) == "warn"


# ------------------------------------------------- render nodes (the render group)

def test_render_node_not_openable_names_render_gid() -> None:
    nodes = (guard.RenderNode("/dev/dri/renderD128", "Permission denied"),)
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], render_nodes=nodes))
    assert not decision.ok
    assert "/dev/dri/renderD128" in decision.fatal and "Permission denied" in decision.fatal
    assert "RENDER_GID" in decision.fatal and "getent group render" in decision.fatal
    assert "\n" not in decision.fatal
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], mode="selftest", render_nodes=nodes))
    assert decision.ok and decision.env["VLLM_ROCM_USE_AITER"] == "0"
    assert any(line.startswith("warning:") and "RENDER_GID" in line for line in decision.log)


def test_no_render_node_asks_for_dev_dri() -> None:
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], render_nodes=(), env={"ROCM_VLLM_DRI_PATH": "/x/dri"}))
    assert not decision.ok
    assert "/x/dri" in decision.fatal and "--device /dev/dri" in decision.fatal


def test_render_nodes_that_open_pass() -> None:
    nodes = (guard.RenderNode("/dev/dri/renderD128", ""), guard.RenderNode("/dev/dri/renderD129", ""))
    decision = decide(inputs([smi("amdsmi_gfx942.txt")], render_nodes=nodes))
    assert decision.ok and decision.env["VLLM_ROCM_USE_AITER"] == "1"


def test_render_nodes_are_opened_under_the_configured_directory(tmp_path: Path) -> None:
    (tmp_path / "renderD128").write_text("")
    (tmp_path / "renderD129").symlink_to(tmp_path / "gone")  # cannot be opened, even by root
    (tmp_path / "card0").symlink_to(tmp_path / "gone")  # not a render node: not checked
    nodes = guard.render_nodes({"ROCM_VLLM_DRI_PATH": str(tmp_path)})
    assert [(Path(n.path).name, bool(n.error)) for n in nodes] == [("renderD128", False), ("renderD129", True)]
    assert guard.render_nodes({"ROCM_VLLM_DRI_PATH": str(tmp_path / "absent")}) == []


# ---------------------------------------------- the guard's device tools, run as the image runs them

# amd-smi that answers only `amd-smi static --asic`; %s: what it does then (sh).
FAKE_SMI = ('#!/bin/sh\nif [ "$*" != "static --asic" ]; then echo "fake amd-smi: unexpected arguments: $*" >&2; '
            "exit 2; fi\n%s\n")
HELPER = ("import os, sys, time, pathlib; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); "
          "time.sleep(600)")


def _guard(tmp_path: Path, smi_body: str, timeout_s: float = 30.0):
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "amd-smi").write_text(FAKE_SMI % smi_body)
    (bin_dir / "rocminfo").write_text('#!/bin/sh\n[ "$#" = 0 ] || exit 2\necho "rocminfo: no driver" >&2\nexit 1\n')
    for tool in ("amd-smi", "rocminfo"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "kfd").write_text("")
    (tmp_path / "dri").mkdir()
    (tmp_path / "dri" / "renderD128").write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "ROCM_VLLM_KFD_PATH": str(tmp_path / "kfd"),
           "ROCM_VLLM_DRI_PATH": str(tmp_path / "dri"), "ROCM_VLLM_MANIFEST": str(tmp_path / "absent.json"),
           "ROCM_VLLM_JIT_CACHE": str(tmp_path / "jit"), "TMPDIR": str(tmp_path)}
    env.pop(guard.REQUIRE_GPU_ENV, None)
    return subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.guard", "--mode", "serve"], env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def test_a_device_tool_that_leaves_a_helper_running_does_not_hold_the_start(tmp_path: Path) -> None:
    """amd-smi prints its listing and exits, a helper of its (in a session of its own) keeps its stdout
    open: the guard goes on with the listing, the helper stopped, well within the tool limit."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import time  # noqa: PLC0415

    pid_file = tmp_path / "helper.pid"
    body = (f"cat '{LISTINGS / 'amdsmi_gfx942.txt'}'\n"
            f"setsid {sys.executable} -c '{HELPER}' '{pid_file}' &\n"
            f"while [ ! -s '{pid_file}' ]; do sleep 0.05; done\nexit 0")
    t0 = time.monotonic()
    try:
        proc = _guard(tmp_path, body)
    except subprocess.TimeoutExpired:
        pytest.fail("the guard was still waiting for amd-smi's output 30 s later")
    finally:
        helper = int(pid_file.read_text()) if pid_file.is_file() and pid_file.read_text() else 0
        alive = helper and os.path.exists(f"/proc/{helper}") and \
            open(f"/proc/{helper}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        if alive:
            os.kill(helper, signal.SIGKILL)
    assert time.monotonic() - t0 < 15
    assert "GPUs (amd-smi): " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not alive, "amd-smi's helper outlived the guard"


def test_a_device_tool_that_prints_bytes_that_are_not_utf8_is_one_line(tmp_path: Path) -> None:
    proc = _guard(tmp_path, "printf 'amdsmi: bad \\377\\376 byte\\n' >&2\nprintf 'GPU: \\377\\n'\nexit 1")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1
    error = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and "amd-smi: exit 1 amdsmi: bad \ufffd\ufffd byte" in error[0], proc.stderr


def test_an_image_without_aiter_makes_triton_and_vllm_caches_on_the_volume(tmp_path) -> None:
    from rocm_vllm_runtime.guard import GuardInputs, apply_jit_cache  # noqa: PLC0415

    volume = tmp_path / "volume"
    env = {"ROCM_VLLM_JIT_CACHE": str(volume), "ROCM_VLLM_REQUIRE_GPU": "0"}
    decision = decide(GuardInputs(mode="exec", listings=(), env=env, has_kfd=False, aiter_installed=False))
    apply_jit_cache(decision, "off")
    assert (volume / "triton").is_dir() and (volume / "vllm").is_dir() and "AITER_JIT_DIR" not in decision.env
    assert decision.log[-1] == (f"caches: Triton kernels in {volume / 'triton'}, vLLM's caches in {volume / 'vllm'} "
                                f"(no AITER in this image; mount a volume at {volume} to keep them)")
