"""Deletion has one owner (rocm_vllm_runtime.files.remove_made): it removes only a folder this
program made (its marker inside, inside a root this program made), never through a symbolic link,
and refuses anything else in one line. The guard runs before every container command: whatever a
user keeps where AITER's build directory would go stays as it is."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocm_vllm_runtime import files, guard, jitcache
from rocm_vllm_runtime.manifest import parse_manifest

COMMIT = "de07f3885ee5f2030ba72b6cc5940d674fd457cf"


def manifest(commit: str = COMMIT):
    return parse_manifest({"schema": 1, "gpu_archs": ["gfx942"],
                           "aiter": {"version": "0.1.20.post1", "commit": commit, "ck_commit": "f" * 40},
                           "vllm": {"version": "0.32.0", "commit": "a" * 40}})


@pytest.fixture
def prebuilt(tmp_path: Path) -> Path:
    d = tmp_path / "site" / "aiter" / "jit"
    d.mkdir(parents=True)
    (d / "module_mla_asm.so").write_text("")
    return d


def run_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prebuilt: Path, env: dict[str, str],
              commit: str = COMMIT, level: str = "warn") -> guard.Decision:
    """The guard's JIT cache step of one container start, as `main()` runs it."""
    monkeypatch.setattr(jitcache, "aiter_prebuilt_dir", lambda: prebuilt)
    monkeypatch.setattr(jitcache, "run_key", lambda: "k1")
    env = {"ROCM_VLLM_JIT_CACHE": str(tmp_path / "volume"), "TMPDIR": str(tmp_path / "tmp"),
           "ROCM_VLLM_REQUIRE_GPU": "0", **env}
    decision = guard.decide(guard.GuardInputs(mode="exec", listings=(), env=env, has_kfd=False,
                                              manifest=manifest(commit)))
    guard.apply_jit_cache(decision, level)
    return decision


def user_folder(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "notes.txt").write_text("mine\n")
    (where / "sub").mkdir(exist_ok=True)
    (where / "sub" / "data.bin").write_text("mine too\n")
    return where


def untouched(where: Path) -> bool:
    return (where / "notes.txt").read_text() == "mine\n" and (where / "sub" / "data.bin").is_file()


def one_refusal(decision: guard.Decision, level: str, words: str) -> None:
    """Refused in one line naming what to change: fatal when strict, else a warning."""
    if level == "strict":
        assert not decision.ok and words in decision.fatal and "\n" not in decision.fatal, decision.fatal
    else:
        lines = [line for line in decision.log if line.startswith("warning:") and words in line]
        assert len(lines) == 1, decision.log


@pytest.mark.parametrize("level", ["warn", "strict"])
def test_a_users_build_folder_in_aiter_jit_dir_is_kept(tmp_path, monkeypatch, prebuilt, level):
    mine = tmp_path / "project"
    user_folder(mine / "build")
    decision = run_guard(tmp_path, monkeypatch, prebuilt, {"AITER_JIT_DIR": str(mine)}, level=level)
    assert untouched(mine / "build") and not (mine / "build").is_symlink()
    one_refusal(decision, level, str(mine / "build"))
    assert sorted(p.name for p in mine.iterdir()) == ["build"]  # nothing linked into a folder refused


def test_aiter_jit_dir_dot_keeps_the_build_folder_of_the_working_directory(tmp_path, monkeypatch, prebuilt):
    mine = tmp_path / "project"
    user_folder(mine / "build")
    monkeypatch.chdir(mine)
    decision = run_guard(tmp_path, monkeypatch, prebuilt, {"AITER_JIT_DIR": "."})
    assert untouched(mine / "build") and not (mine / "build").is_symlink()
    one_refusal(decision, "warn", "build")


def test_a_symlinked_build_folder_and_what_it_points_at_are_kept(tmp_path, monkeypatch, prebuilt):
    mine = tmp_path / "project"
    mine.mkdir()
    elsewhere = user_folder(tmp_path / "elsewhere")
    (mine / "build").symlink_to(elsewhere)
    decision = run_guard(tmp_path, monkeypatch, prebuilt, {"AITER_JIT_DIR": str(mine)})
    assert untouched(elsewhere)
    assert os.readlink(mine / "build") == str(elsewhere)
    one_refusal(decision, "warn", str(mine / "build"))


def test_a_plain_file_named_build_is_kept(tmp_path, monkeypatch, prebuilt):
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "build").write_text("mine\n")
    decision = run_guard(tmp_path, monkeypatch, prebuilt, {"AITER_JIT_DIR": str(mine)})
    assert (mine / "build").read_text() == "mine\n"
    one_refusal(decision, "warn", str(mine / "build"))


@pytest.mark.parametrize("commit", ["/../../../x", "../../outside", "a/b"])
def test_a_manifest_commit_cannot_move_the_jit_dir_out_of_the_cache(tmp_path, monkeypatch, prebuilt, commit):
    outside = user_folder(tmp_path / "build")
    user_folder(tmp_path / "volume" / "build")
    decision = run_guard(tmp_path, monkeypatch, prebuilt, {}, commit=commit, level="strict")
    assert untouched(outside) and untouched(tmp_path / "volume" / "build")
    assert not any(p.name == "module_mla_asm.so" for p in tmp_path.rglob("*") if p.parent != prebuilt)
    assert not decision.ok and "aiter.commit" in decision.fatal and "\n" not in decision.fatal, decision.fatal


def test_a_build_root_linked_to_a_users_folder_keeps_its_run_folders(tmp_path, monkeypatch, prebuilt):
    mine = user_folder(tmp_path / "mine")
    user_folder(mine / "run-1234")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / jitcache.BUILD_ROOT_NAME).symlink_to(mine)
    decision = run_guard(tmp_path, monkeypatch, prebuilt, {})
    assert untouched(mine) and untouched(mine / "run-1234")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "run-1234", "sub"]
    one_refusal(decision, "warn", jitcache.BUILD_ROOT_NAME)


def test_run_folders_this_program_made_are_still_removed(tmp_path, monkeypatch, prebuilt):
    root = tmp_path / "tmp" / jitcache.BUILD_ROOT_NAME
    run_guard(tmp_path, monkeypatch, prebuilt, {})
    monkeypatch.setattr(jitcache, "run_key", lambda: "k2")
    jitcache.run_build_dir(str(root), "k2")
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["current", "run-k2"]


def test_remove_made_refuses_what_it_did_not_make(tmp_path):
    root = files.make_dir(tmp_path / "root")
    mine = user_folder(root / "theirs")
    link = root / "link"
    link.symlink_to(files.make_dir(tmp_path / "made-elsewhere"))
    made = files.make_dir(root / "ours")
    (made / "x").write_text("")
    for path, words in ((mine, "not made by this program"), (link, "symbolic link"),
                        (tmp_path / "made-elsewhere", "outside"), (root / "absent", "not made by this program")):
        with pytest.raises(files.RefusedError) as err:
            files.remove_made(path, root)
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert untouched(mine) and link.is_symlink() and (tmp_path / "made-elsewhere").is_dir()
    files.remove_made(made, root)
    assert not made.exists()


def test_inside_refuses_parts_that_leave_the_root(tmp_path):
    assert files.inside(tmp_path, "aiter-0123") == tmp_path / "aiter-0123"
    for part in ("..", "/etc", "a/../..", "a/b", "", ".", "x\0y"):
        with pytest.raises(files.RefusedError):
            files.inside(tmp_path, part, what="the manifest's aiter.commit")


def test_the_guard_command_keeps_the_folder_and_says_so_in_one_line(tmp_path, monkeypatch, prebuilt, capsys):
    """As the entrypoint runs it before a container command (exec mode, no GPU check)."""
    mine = tmp_path / "project"
    user_folder(mine / "build")
    monkeypatch.setattr(jitcache, "aiter_prebuilt_dir", lambda: prebuilt)
    monkeypatch.setattr(jitcache, "run_key", lambda: "k1")
    for name, value in {"AITER_JIT_DIR": str(mine), "TMPDIR": str(tmp_path / "tmp"), "ROCM_VLLM_REQUIRE_GPU": "0",
                        "ROCM_VLLM_MANIFEST": str(tmp_path / "absent.json"),
                        "ROCM_VLLM_JIT_CACHE": str(tmp_path / "volume")}.items():
        monkeypatch.setenv(name, value)
    assert guard.main(["--mode", "exec"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if str(mine / "build") in line]
    assert len(err) == 1 and err[0].startswith("[rocm-vllm] warning: AITER's build directory: "), err
    assert untouched(mine / "build") and not (mine / "build").is_symlink()


# ------------------------------------------------------------------ a folder trusted by its owner, not its name
# As OpenSSH trusts a configuration file: the folder and its marker belong to the user that runs this
# program, only that user can write to the folder, and no other user can replace it (every folder above
# belongs to root or to that user and takes no new names from others, unless sticky as /tmp is).

OTHER_UID = 65534  # nobody
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user takes root")


def shared_tmp(tmp_path: Path) -> Path:
    """A temporary directory every user may create in, as /tmp (mode 1777)."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def planted_root(shared: Path, mode: int, uid: int | None) -> Path:
    """The build root made beforehand with a copied marker: by another user (uid) and/or open to all (mode)."""
    root = shared / jitcache.BUILD_ROOT_NAME
    root.mkdir()
    (root / files.MARKER).write_text("made by rocm-vllm: this folder and all in it may be removed by it\n")
    user_folder(root / "run-theirs")
    (root / "run-theirs" / files.MARKER).write_text("copied\n")
    root.chmod(mode)
    if uid is not None:
        for path in (root, root / files.MARKER, root / "run-theirs", root / "run-theirs" / files.MARKER):
            os.chown(path, uid, uid)
    return root


PLANTED = {
    "another user's, open to all": (0o777, OTHER_UID, "belongs to uid 65534"),
    "another user's": (0o755, OTHER_UID, "belongs to uid 65534"),
    "ours, open to all": (0o777, None, "can be changed by other users (mode 0777)"),
    "ours, open to the group": (0o775, None, "can be changed by other users (mode 0775)"),
}


@pytest.mark.parametrize("case", PLANTED)
@pytest.mark.parametrize("level", ["warn", "strict"])
def test_a_build_root_with_a_copied_marker_is_not_used(tmp_path, monkeypatch, prebuilt, case, level):
    mode, uid, words = PLANTED[case]
    if uid is not None and os.geteuid() != 0:
        pytest.skip("giving a folder to another user takes root")
    root = planted_root(shared_tmp(tmp_path), mode, uid)
    decision = run_guard(tmp_path, monkeypatch, prebuilt, {}, level=level)
    one_refusal(decision, level, words)
    one_refusal(decision, level, f"{root} was not made by this program")
    assert sorted(p.name for p in root.iterdir()) == [files.MARKER, "run-theirs"]  # nothing used, nothing removed
    assert untouched(root / "run-theirs") and not os.path.lexists(tmp_path / "volume" / "aiter-de07f3885ee5" / "build")


def test_a_build_root_another_user_can_replace_is_not_used(tmp_path, monkeypatch, prebuilt):
    """Our own folder and marker, in a folder others may rename things in (group-writable, not sticky)."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    root = files.make_dir(shared / jitcache.BUILD_ROOT_NAME)
    shared.chmod(0o775)
    decision = run_guard(tmp_path, monkeypatch, prebuilt, {}, level="strict")
    one_refusal(decision, "strict", f"{shared} can be changed by other users (mode 0775, not sticky)")
    assert sorted(p.name for p in root.iterdir()) == [files.MARKER]


def test_the_build_root_in_a_shared_sticky_tmp_is_used(tmp_path, monkeypatch, prebuilt):
    """/tmp itself (1777, sticky) is fine: no one else can rename what is ours in it."""
    shared = shared_tmp(tmp_path)
    decision = run_guard(tmp_path, monkeypatch, prebuilt, {}, level="strict")
    assert decision.ok, decision.fatal
    assert os.readlink(shared / jitcache.BUILD_ROOT_NAME / "current") == "run-k1"


@as_root
def test_remove_made_refuses_a_copied_marker_in_another_users_folder(tmp_path):
    root = files.make_dir(tmp_path / "root")
    theirs = user_folder(root / "theirs")
    (theirs / files.MARKER).write_text("copied\n")
    for path in (theirs, theirs / files.MARKER):
        os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(files.RefusedError) as err:
        files.remove_made(theirs, root)
    assert "belongs to uid 65534" in str(err.value) and "\n" not in str(err.value)
    assert untouched(theirs)
    opened = files.make_dir(root / "opened")
    opened.chmod(0o777)
    with pytest.raises(files.RefusedError, match="can be changed by other users"):
        files.remove_made(opened, root)
    assert opened.is_dir()


def test_make_dir_makes_a_folder_it_trusts_whatever_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        made = files.make_dir(tmp_path / "made")
    finally:
        os.umask(old)
    assert files.made_problem(made) == ""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.integers(0o700, 0o777), other_owner=st.booleans(), marker=st.sampled_from(["ours", "theirs", "none",
                                                                                          "folder", "link"]),
       above=st.sampled_from([0o700, 0o755, 0o775, 0o777, 0o1777, 0o1775]), link=st.booleans())
def test_is_made_is_owner_mode_marker_and_the_folders_above(tmp_path, mode, other_owner, marker, above, link):
    """Over folder modes, owners, markers and the mode of the folder above: trusted exactly when the folder and
    its marker are ours, only we can write to the folder, and the folder above takes no names from others."""
    if other_owner and os.geteuid() != 0:
        other_owner = False
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        parent = Path(scratch) / "above"
        parent.mkdir()
        folder = parent / "made"
        folder.mkdir()
        if marker == "folder":
            (folder / files.MARKER).mkdir()
        elif marker == "link":
            (parent / "elsewhere").write_text("")
            (folder / files.MARKER).symlink_to(parent / "elsewhere")
        elif marker != "none":
            (folder / files.MARKER).write_text("")
            if marker == "theirs" and os.geteuid() == 0:
                os.chown(folder / files.MARKER, OTHER_UID, OTHER_UID)
        if other_owner:
            os.chown(folder, OTHER_UID, OTHER_UID)
        folder.chmod(mode)
        parent.chmod(above)
        path = folder
        if link:
            (parent / "to-made").symlink_to("made")
            path = parent / "to-made"
        marker_ours = marker == "ours" or (marker == "theirs" and os.geteuid() != 0)
        expected = (not link and not other_owner and not mode & 0o022 and marker_ours
                    and (not above & 0o022 or bool(above & 0o1000)))
        problem = files.made_problem(path)
        assert files.is_made(path) == expected == (problem == ""), (oct(mode), other_owner, marker, oct(above), link,
                                                                    problem)
        assert "\n" not in problem
        parent.chmod(0o700)
        folder.chmod(0o700)
