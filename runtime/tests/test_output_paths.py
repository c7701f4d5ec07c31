"""Result paths: every command that writes results (the serving benchmark, the accuracy gate, the
self-test runner) checks its outputs through one rule (rocm_vllm_runtime.files.outputs_problem)
before it starts any work. A directory given as a result file, a result file under a file, or an
output folder that is a file stops the command with one line naming the option: never a
traceback after an hour of serving, never a server started, nothing there changed."""
from __future__ import annotations

import os
import stat
import threading

import pytest

from rocm_vllm_runtime import accuracy, bench, files, report, selftest

# entry point -> (main, exit status for a bad output, options that name result files, output folders)
ENTRY_POINTS = {
    "bench": (bench.main, 2, ["--json"], ["--out-dir"]),
    "accuracy": (accuracy.main, 2, ["--json"], ["--out-dir"]),
    "selftest": (selftest.main, report.EXIT_NOT_RUN, ["--json", "--junit"], []),
}


def bad_paths(tmp_path):
    """(kind of output, path) pairs no command may accept."""
    a_dir = tmp_path / "accuracy.json"
    a_dir.mkdir()
    (a_dir / "kept").write_text("mine\n")
    a_file = tmp_path / "plain-file"
    a_file.write_text("mine\n")
    return {"file": [str(a_dir), str(a_file / "under-a-file.json")], "folder": [str(a_file)]}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_every_result_path_is_checked_before_any_work(name, tmp_path, monkeypatch, capsys):
    main, status, file_options, folder_options = ENTRY_POINTS[name]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCURACY_DATA", str(tmp_path))
    started = []
    monkeypatch.setattr(bench, "compare", lambda *a, **k: started.append("bench"))
    monkeypatch.setattr(accuracy, "compare", lambda *a, **k: started.append("accuracy"))
    monkeypatch.setattr(selftest, "run_suite", lambda *a, **k: started.append("pytest"))
    paths = bad_paths(tmp_path)
    cases = [(o, p) for o in file_options for p in paths["file"]] + [(o, p) for o in folder_options
                                                                      for p in paths["folder"]]
    assert cases
    for option, path in cases:
        assert main([option, path]) == status, (option, path)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"{name}: error: ") and option in err[0], (option, path, err)
    assert started == []
    assert (tmp_path / "accuracy.json" / "kept").read_text() == "mine\n"
    assert (tmp_path / "plain-file").read_text() == "mine\n"


def test_two_outputs_into_one_file_are_refused(tmp_path):
    same = str(tmp_path / "r.json")
    assert "name the same file" in files.outputs_problem({"--json": same, "--junit": same})


def test_a_failed_final_write_is_one_line(tmp_path, capsys):
    a_dir = tmp_path / "d"
    a_dir.mkdir()
    assert not files.write_result("prog", "--json", str(a_dir), "{}")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("prog: error: cannot write --json"), err


def test_good_paths_pass_and_leave_nothing_behind(tmp_path):
    out = tmp_path / "new" / "r.json"
    assert files.outputs_problem({"--json": str(out)}, {"--out-dir": str(tmp_path / "logs")}) == ""
    assert not out.exists() and (tmp_path / "logs").is_dir()


def special_files(tmp_path):
    """Paths that are not regular files: a result written there would replace a device node, hang on a
    FIFO, or go to a stream the run prints on."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link-to-stdout.json"
    link.symlink_to("/dev/stdout")
    return ["/dev/null", str(fifo), "/dev/stdout", "/dev/stderr", "/proc/self/fd/1", str(link)]


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_only_an_absent_path_or_a_regular_file_is_a_result_file(name, tmp_path, monkeypatch, capsys):
    main, status, file_options, _ = ENTRY_POINTS[name]
    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr(bench, "compare", lambda *a, **k: started.append("bench"))
    monkeypatch.setattr(accuracy, "compare", lambda *a, **k: started.append("accuracy"))
    monkeypatch.setattr(selftest, "run_suite", lambda *a, **k: started.append("pytest"))
    null = os.stat("/dev/null")
    paths = special_files(tmp_path)
    for option in file_options:
        for path in paths:
            done = threading.Event()
            threading.Thread(target=lambda p=path: (done.wait(5) or _unblock(p)), daemon=True).start()
            assert main([option, path]) == status, (option, path)
            done.set()
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith(f"{name}: error: ") and option in err[0] \
                and "not a regular file" in err[0], (option, path, err)
    assert started == []
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == null.st_ino
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)


def _unblock(path):
    """Open the other end of a FIFO the command may hang on, so a failing test ends."""
    if path.endswith("fifo") and os.path.exists(path):
        with open(path, "rb", buffering=0) as f:
            f.read()


def test_the_writer_itself_refuses_a_device_and_a_fifo(tmp_path):
    """Checked again at the write: as root, a device node given as the result (a copy of /dev/null
    here) would be replaced by a regular file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    paths = [fifo]
    if os.geteuid() == 0:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        paths.append(tmp_path / "null")
    for path in paths:
        with pytest.raises(files.OutputError, match="not a regular file"):
            files.write_text(path, "{}")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.geteuid() != 0 or stat.S_ISCHR(os.lstat(tmp_path / "null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)


def test_selftest_json_cannot_be_a_suites_own_result_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SELFTEST_RESULTS_DIR", raising=False)
    ran = []
    monkeypatch.setattr(selftest, "run_suite", lambda *a, **k: ran.append(a[0]))
    assert selftest.main(["bench", "--json", "out/bench.json"]) == report.EXIT_NOT_RUN
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json" in err[0] and "bench suite" in err[0], err
    assert ran == []
