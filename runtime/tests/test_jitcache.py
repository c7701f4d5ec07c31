"""The AITER JIT cache directory: prebuilt modules linked in, ownership kept for the server, and
AITER's build locks kept to the container run that takes them."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from rocm_vllm_runtime import files, guard, jitcache
from rocm_vllm_runtime.manifest import parse_manifest

COMMIT = "de07f3885ee5f2030ba72b6cc5940d674fd457cf"
MANIFEST = parse_manifest({"schema": 1, "gpu_archs": ["gfx942", "gfx950"],
                           "aiter": {"version": "0.1.20.post1", "commit": COMMIT, "ck_commit": "f" * 40},
                           "vllm": {"version": "0.32.0", "commit": "a" * 40},
                           "prebuilt_modules": ["module_mla_asm"]})


@pytest.fixture
def prebuilt(tmp_path: Path) -> Path:
    d = tmp_path / "aiter" / "jit"
    d.mkdir(parents=True)
    (d / "module_mla_asm.so").write_text("")
    return d


def test_links_prebuilt_modules_and_keeps_compiled_ones(tmp_path: Path, prebuilt: Path) -> None:
    cache = tmp_path / "cache" / "aiter-0123"
    cache.mkdir(parents=True)
    (cache / "module_jit.so").write_text("compiled here")
    assert jitcache.prepare(str(cache), prebuilt) == 1
    assert (cache / "module_mla_asm.so").resolve() == prebuilt / "module_mla_asm.so"
    assert (cache / "module_jit.so").read_text() == "compiled here"


def test_as_root_what_is_created_takes_the_cache_owner(tmp_path: Path, prebuilt: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The self-tests run as root on the volume the server's user owns: a directory root
    created there would keep the server from linking and compiling into it."""
    root = tmp_path / "cache"
    root.mkdir()
    if os.geteuid() == 0:
        os.chown(root, 1000, 1000)  # the volume, owned by the server's user
    owner = (os.stat(root).st_uid, os.stat(root).st_gid)
    calls = []
    monkeypatch.setattr(jitcache.os, "geteuid", lambda: 0)
    monkeypatch.setattr(jitcache.os, "chown", lambda p, uid, gid, **kw: calls.append((Path(p), (uid, gid))))
    jitcache.prepare(str(root / "aiter-0123" / "sub"), prebuilt)
    assert calls[:2] == [(root / "aiter-0123", owner), (root / "aiter-0123" / "sub", owner)]
    # the link is made under a temporary name, given its owner, then renamed into place
    (link, link_owner), = calls[2:]
    assert link.parent == root / "aiter-0123" / "sub" and link.name.startswith(".module_mla_asm.so-")
    assert link_owner == owner and (root / "aiter-0123" / "sub" / "module_mla_asm.so").is_symlink()


def test_not_root_nothing_is_chowned(tmp_path: Path, prebuilt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jitcache.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(jitcache.os, "chown", lambda *a, **kw: pytest.fail("chown as non-root"))
    assert jitcache.prepare(str(tmp_path / "c" / "d"), prebuilt) == 1


# ------------------------------------------- AITER's build locks (ROCm/aiter #3635)

class AiterJit:
    """Stand-in for AITER's JIT build lock, as strict as AITER's (v0.1.20.post1) or stricter.

    AITER builds in `bd_dir = <AITER_JIT_DIR>/build` (aiter/jit/core.py), created with
    os.makedirs(bd_dir, exist_ok=True) at import and in build_module. build_module holds the
    lock file `<bd_dir>/lock_<module>` (mp_lock -> FileBaton.try_acquire: O_CREAT | O_EXCL,
    then pid and hostname written into it); a process that cannot create it polls while the
    file exists (FileBaton.wait). AITER breaks a lock only when it names this hostname and a
    pid that is dead here; the stand-in never does (a container started again has another
    hostname, or that pid is alive again in its new PID namespace), and gives up after a few
    polls where AITER goes on waiting. A finished module is copied to AITER_JIT_DIR itself.
    """

    def __init__(self, jit_dir: Path) -> None:
        self.jit_dir = jit_dir
        self.bd_dir = jit_dir / "build"
        os.makedirs(self.bd_dir, exist_ok=True)  # raises on a dangling link, as AITER's import does

    def start_build(self, module: str) -> bool:
        """Take the module's build lock; False where AITER would wait for another holder."""
        os.makedirs(self.bd_dir, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.bd_dir / f"lock_{module}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                time.sleep(0.01)
                continue
            os.write(fd, f"{os.getpid()}\n{socket.gethostname()}\n".encode())
            os.close(fd)
            (self.bd_dir / module / "build").mkdir(parents=True, exist_ok=True)
            return True
        return False

    def finish_build(self, module: str) -> None:
        (self.jit_dir / f"{module}.so").write_text("compiled at run time")
        (self.bd_dir / f"lock_{module}").unlink()


def start_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prebuilt: Path, run: str,
                    env: dict[str, str] | None = None) -> Path:
    """The guard of one container start (`run` names the container run); returns AITER_JIT_DIR.
    The cache volume is tmp_path/volume, the container's own /tmp tmp_path/tmp."""
    monkeypatch.setattr(jitcache, "aiter_prebuilt_dir", lambda: prebuilt)
    monkeypatch.setattr(jitcache, "run_key", lambda: run, raising=False)
    env = {"ROCM_VLLM_JIT_CACHE": str(tmp_path / "volume"), "TMPDIR": str(tmp_path / "tmp"),
           "ROCM_VLLM_REQUIRE_GPU": "0", **(env or {})}
    decision = guard.decide(guard.GuardInputs(mode="serve", listings=(), env=env, has_kfd=False,
                                              manifest=MANIFEST))
    guard.apply_jit_cache(decision, "strict")
    assert decision.ok, decision.fatal
    return Path(env.get("AITER_JIT_DIR") or decision.env["AITER_JIT_DIR"])


@pytest.mark.parametrize("chosen", [None, "volume/mine"], ids=["default", "AITER_JIT_DIR set"])
def test_a_build_killed_with_its_container_does_not_block_the_next_start(
        tmp_path: Path, prebuilt: Path, monkeypatch: pytest.MonkeyPatch, chosen: str | None) -> None:
    """The container is stopped while AITER compiles a module: its lock file is never removed.
    The next start must build that module again, not wait for the dead build forever."""
    env = {"AITER_JIT_DIR": str(tmp_path / chosen)} if chosen else {}
    jit = start_container(tmp_path, monkeypatch, prebuilt, "run-1", env)
    first = AiterJit(jit)
    assert first.start_build("module_a")
    first.finish_build("module_a")
    assert first.start_build("module_b")  # ... and the container is killed here

    jit = start_container(tmp_path, monkeypatch, prebuilt, "run-2", env)
    assert AiterJit(jit).start_build("module_b"), \
        "AITER would wait forever for the lock of a build killed with the previous container run"
    assert (jit / "module_a.so").read_text() == "compiled at run time"  # kept on the volume
    assert (jit / "module_mla_asm.so").resolve() == prebuilt / "module_mla_asm.so"


def test_a_build_directory_left_on_the_volume_is_kept_and_named(tmp_path: Path, prebuilt: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache volume from an image without this layout: AITER's build directory on it may hold the
    locks of killed builds, but nothing tells it from a folder of the user's: it is never removed.
    The guard stops in one line that names it (serve), so the user moves it away."""
    jit = tmp_path / "volume" / f"aiter-{COMMIT[:12]}"
    (jit / "build" / "module_b" / "build").mkdir(parents=True)
    (jit / "build" / "lock_module_b").write_text("245\nanother-container\n")
    (jit / "module_a.so").write_text("compiled at run time")
    monkeypatch.setattr(jitcache, "aiter_prebuilt_dir", lambda: prebuilt)
    monkeypatch.setattr(jitcache, "run_key", lambda: "run-1")
    env = {"ROCM_VLLM_JIT_CACHE": str(tmp_path / "volume"), "TMPDIR": str(tmp_path / "tmp"),
           "ROCM_VLLM_REQUIRE_GPU": "0"}
    decision = guard.decide(guard.GuardInputs(mode="serve", listings=(), env=env, has_kfd=False,
                                              manifest=MANIFEST))
    guard.apply_jit_cache(decision, "strict")
    assert not decision.ok and str(jit / "build") in decision.fatal and "move it away" in decision.fatal
    assert (jit / "build" / "lock_module_b").read_text() == "245\nanother-container\n"
    assert (jit / "module_a.so").read_text() == "compiled at run time"
    (jit / "build" / "lock_module_b").unlink()  # the user moves it away ...
    (jit / "build" / "module_b" / "build").rmdir()
    (jit / "build" / "module_b").rmdir()
    (jit / "build").rmdir()
    assert start_container(tmp_path, monkeypatch, prebuilt, "run-1") == jit  # ... and the next start goes on
    assert AiterJit(jit).start_build("module_b")


def test_processes_of_one_container_run_share_the_build_locks(tmp_path: Path, prebuilt: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`selftest` run with docker exec beside the server goes through the guard again: a build
    the server has in progress stays locked, and AITER waits for it as it should."""
    jit = start_container(tmp_path, monkeypatch, prebuilt, "run-1")
    server = AiterJit(jit)
    assert server.start_build("module_b")
    start_container(tmp_path, monkeypatch, prebuilt, "run-1")
    beside = AiterJit(jit)
    assert not beside.start_build("module_b")
    server.finish_build("module_b")
    assert beside.start_build("module_b")


def test_build_directory_that_cannot_be_made_names_tmpdir(tmp_path: Path, prebuilt: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(jitcache, "aiter_prebuilt_dir", lambda: prebuilt)
    env = {"ROCM_VLLM_JIT_CACHE": str(tmp_path / "volume"), "TMPDIR": str(blocker),
           "ROCM_VLLM_REQUIRE_GPU": "0"}
    for level in ("strict", "warn"):
        decision = guard.decide(guard.GuardInputs(mode="serve", listings=(), env=env, has_kfd=False,
                                                  manifest=MANIFEST))
        guard.apply_jit_cache(decision, level)
        if level == "strict":
            assert not decision.ok and "TMPDIR" in decision.fatal and str(blocker) in decision.fatal
        else:
            assert decision.ok and "AITER_JIT_DIR" not in decision.env
            assert any(line.startswith("warning:") and "TMPDIR" in line for line in decision.log)


def test_aiter_package_directory_as_jit_dir_gets_no_build_link(tmp_path: Path, prebuilt: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """AITER_JIT_DIR set to AITER's own directory: AITER builds inside the container already."""
    start_container(tmp_path, monkeypatch, prebuilt, "run-1", {"AITER_JIT_DIR": str(prebuilt)})
    assert not os.path.lexists(prebuilt / "build")


def test_run_build_dir_keeps_this_run_and_removes_the_runs_before(tmp_path: Path) -> None:
    root = tmp_path / "rocm-vllm-aiter-build"
    current = jitcache.run_build_dir(str(root), "a")
    (current / "lock_module_b").write_text("7\nhost\n")
    assert jitcache.run_build_dir(str(root), "a") == current
    assert (current / "lock_module_b").exists()  # the same run: a live build's lock
    assert jitcache.run_build_dir(str(root), "b") == root / "current"
    assert os.readlink(root / "current") == "run-b"
    assert sorted(p.name for p in root.iterdir() if p.name != files.MARKER) == ["current", "run-b"]


def fake_proc(tmp_path: Path, boot: str, pid_ns: str, comm: str, start: int) -> Path:
    proc = tmp_path / f"proc{len(list(tmp_path.iterdir()))}"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(f"{boot}\n")
    (proc / "self" / "ns").mkdir(parents=True)
    (proc / "self" / "ns" / "pid").symlink_to(f"pid:[{pid_ns}]")
    (proc / "1").mkdir()
    fields = ["S", "0", "1", "1", "0", "-1", "4194560"] + ["0"] * 12 + [str(start), "0", "0"]
    (proc / "1" / "stat").write_text(f"1 ({comm}) " + " ".join(fields) + "\n")
    return proc


def test_run_key_changes_with_a_new_process_1_or_pid_namespace(tmp_path: Path) -> None:
    key = jitcache.run_key(fake_proc(tmp_path, "boot", "4026532567", "python3", 812))
    assert key == jitcache.run_key(fake_proc(tmp_path, "boot", "4026532567", "python3", 812))
    assert key != jitcache.run_key(fake_proc(tmp_path, "boot", "4026532567", "python3", 90311))
    assert key != jitcache.run_key(fake_proc(tmp_path, "boot", "4026532999", "python3", 812))
    assert key != jitcache.run_key(fake_proc(tmp_path, "boot2", "4026532567", "python3", 812))
    # the command name may hold spaces and parentheses
    assert jitcache._start_time("1 (a) b) S " + " ".join(str(i) for i in range(4, 30))) == "22"
    assert jitcache.run_key(tmp_path / "no-proc")  # unreadable parts count as empty


def test_as_root_the_build_link_takes_the_cache_owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jit = tmp_path / "aiter-0123"
    jit.mkdir()
    owner = (os.stat(jit).st_uid, os.stat(jit).st_gid)
    monkeypatch.setattr(jitcache, "_owner_to_keep", lambda existing: owner if existing == jit else None)
    calls = []
    monkeypatch.setattr(jitcache.os, "chown", lambda p, uid, gid, **kw: calls.append(((uid, gid), kw)))
    jitcache.link_build_dir(str(jit), tmp_path / "tmp" / "current")
    assert os.readlink(jit / "build") == str(tmp_path / "tmp" / "current")
    assert calls == [(owner, {"follow_symlinks": False})]
