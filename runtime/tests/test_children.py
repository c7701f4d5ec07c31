"""Child processes have one supervisor (rocm_vllm_runtime.children): each child in its own process
group; SIGTERM, SIGINT and SIGHUP to the command are forwarded to it, and nothing it started is
left running when the command ends. Checked through the real entry points (bench, selftest)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from processes import running

SLEEPER = "import os, time, pathlib, sys; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(600)"


_alive = running  # tests/processes.py: a zombie of an exited child counts as gone


def _wait_for_pid(proc: subprocess.Popen, pid_file: Path) -> int:
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return int(pid_file.read_text())


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BENCH = textwrap.dedent("""
    import sys
    from rocm_vllm_runtime import bench
    bench.server_command = lambda *a, **kw: [sys.executable, "-c", {sleeper!r}, {pid_file!r}]
    sys.exit(bench.main(["--backends", "cpu-vllm", "--port", "{port}", "--out-dir", {out!r},
                         "--start-timeout", "600"]))
""")


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_bench_stops_its_server(tmp_path, sig):
    pid_file = tmp_path / "server.pid"
    script = BENCH.format(sleeper=SLEEPER, pid_file=str(pid_file), port=_free_port(), out=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    server = _wait_for_pid(proc, pid_file)
    time.sleep(0.5)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert _gone(server), f"the server outlived {sig.name} to bench"
    assert proc.returncode == 128 + sig, (proc.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_selftest_stops_its_pytest(tmp_path, sig):
    suites = tmp_path / "suites"
    suites.mkdir()
    pid_file = tmp_path / "pytest.pid"
    (suites / "test_selector.py").write_text(textwrap.dedent(f"""
        import os, time
        def test_waits():
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(600)
    """))
    env = {**os.environ, "SELFTEST_SUITES": str(suites)}
    proc = subprocess.Popen([sys.executable, "-m", "rocm_vllm_runtime.selftest", "selector"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pytest_pid = _wait_for_pid(proc, pid_file)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert _gone(pytest_pid), f"selftest's pytest outlived {sig.name} to selftest"
    assert proc.returncode == 128 + sig, (proc.returncode, out, err)


def test_run_leaves_no_grandchild_behind(tmp_path):
    """A child that started one of its own and exited: the group is stopped when the child ends."""
    from rocm_vllm_runtime import children  # noqa: PLC0415

    pid_file = tmp_path / "grandchild.pid"
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}, {str(pid_file)!r}])"
    code += "; import time\nwhile True:\n  time.sleep(0.1)\n  import pathlib\n"
    code += f"  if pathlib.Path({str(pid_file)!r}).is_file() and pathlib.Path({str(pid_file)!r}).read_text(): break"
    assert children.run([sys.executable, "-c", code]) == 0
    assert _gone(int(pid_file.read_text()), 10.0)


def test_output_of_a_tool_that_hangs_ends_at_its_deadline():
    from rocm_vllm_runtime import children  # noqa: PLC0415

    t0 = time.monotonic()
    result = children.output(["sleep", "30"], timeout_s=1.0)
    assert result.timed_out and time.monotonic() - t0 < 10
    assert children.output([sys.executable, "-c", "print('hi')"]).stdout == "hi\n"
    assert children.output(["no-such-tool-here"]).error


def test_a_signal_to_selftest_stops_what_its_suite_started(tmp_path):
    """The bench and accuracy suites start servers (each in its own process group) from inside
    pytest: those are stopped too, not only pytest."""
    suites = tmp_path / "suites"
    suites.mkdir()
    pid_file = tmp_path / "server.pid"
    (suites / "test_bench.py").write_text(textwrap.dedent(f"""
        import sys, time
        from rocm_vllm_runtime import children
        def test_serves(tmp_path):
            with children.started([sys.executable, "-c", {SLEEPER!r}, {str(pid_file)!r}], tmp_path / "log"):
                time.sleep(600)
    """))
    env = {**os.environ, "SELFTEST_SUITES": str(suites)}
    proc = subprocess.Popen([sys.executable, "-m", "rocm_vllm_runtime.selftest", "bench"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server = _wait_for_pid(proc, pid_file)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=90)
    assert _gone(server), "the server a suite started outlived SIGTERM to selftest"
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out, err)


# ------------------------------------------------- what a child detaches; signals during clean-up

# A process in a session of its own (setsid), as a server's helper or a daemon starts one: it writes
# its pid and sleeps. With "daemon" it forks once more and its parent exits (the classic double fork),
# so it is nobody's child any more when clean-up starts. With "unmarked" it also clears the mark the
# supervisor hands down in the environment.
DETACH = textwrap.dedent("""
    import os, subprocess, sys, time, pathlib
    pid_file, how, then, marked = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    sleeper = {sleeper!r}
    if how == "daemon":
        sleeper = ("import os, sys\\nif os.fork(): os._exit(0)\\nos.setsid()\\n" + sleeper)
    env = dict(os.environ)
    if marked == "unmarked":
        env.pop("ROCM_VLLM_SUPERVISED")
    subprocess.Popen([sys.executable, "-c", sleeper, pid_file], start_new_session=True, env=env)
    while not (pathlib.Path(pid_file).is_file() and pathlib.Path(pid_file).read_text()):
        time.sleep(0.05)
    print("listing", flush=True)
    if then == "stay":
        time.sleep(600)
""").format(sleeper=SLEEPER)


def _detacher(pid_file: Path, how: str = "setsid", then: str = "exit", marked: str = "marked") -> list[str]:
    return [sys.executable, "-c", DETACH, str(pid_file), how, then, marked]


def _kill_left(*pid_files: Path) -> None:
    """A failing test leaves nothing behind either."""
    for pid_file in pid_files:
        if pid_file.is_file() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.parametrize("how", ["setsid", "daemon"])
def test_run_stops_what_its_child_detached(tmp_path, how):
    """children.run (selftest's pytest): a process the child moved into a session of its own is not in
    the child's group, and is stopped all the same when the command ends."""
    from rocm_vllm_runtime import children  # noqa: PLC0415

    pid_file = tmp_path / "detached.pid"
    try:
        assert children.run(_detacher(pid_file, how)) == 0
        assert _gone(int(pid_file.read_text()), 10.0), f"a {how} process outlived children.run"
    finally:
        _kill_left(pid_file)


@pytest.mark.parametrize("how", ["setsid", "daemon"])
def test_run_stops_what_its_child_detached_without_the_mark(tmp_path, how):
    """A helper that clears the supervisor's mark from its environment and detaches: once its parent
    has exited it is an orphan this process (the subreaper) adopted, so it is ended with the command
    all the same, and reaped."""
    from rocm_vllm_runtime import children  # noqa: PLC0415

    pid_file = tmp_path / "detached.pid"
    try:
        assert children.run(_detacher(pid_file, how, "exit", "unmarked")) == 0
        assert _gone(int(pid_file.read_text()), 5.0), f"an unmarked {how} process outlived children.run"
        assert not Path(f"/proc/{pid_file.read_text()}").exists(), "an orphan stopped but not reaped"
    finally:
        _kill_left(pid_file)


UNMARKED_BESIDE = textwrap.dedent("""
    import sys
    from rocm_vllm_runtime import children
    detacher = [sys.executable, "-c", sys.argv[1], *sys.argv[2:]]
    with children.started([sys.executable, "-c", "import time; time.sleep(600)"], None, grace_s=lambda: 5.0):
        children.run(detacher)  # another child runs: the orphan's owner is not known yet
""")


def test_an_unmarked_orphan_adopted_beside_another_child_is_ended_with_the_last(tmp_path):
    """While another child runs, an unmarked orphan cannot be told apart from that child's: it is ended
    when the last running child stops, before the command ends."""
    pid_file = tmp_path / "detached.pid"
    try:
        # its streams are not this test's pipes: a process left running would hold them open
        proc = subprocess.run([sys.executable, "-c", UNMARKED_BESIDE, DETACH, str(pid_file), "daemon", "exit",
                               "unmarked"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30)
        assert proc.returncode == 0
        assert _gone(int(pid_file.read_text()), 5.0), "an unmarked daemon outlived the supervising command"
    finally:
        _kill_left(pid_file)


# A signal between a child's start and the block that owes its stop (a moment too short to hit from
# outside): the child is started as that leaves it, and the process exits.
NEVER_STOPPED = textwrap.dedent("""
    import pathlib, sys, time
    from rocm_vllm_runtime import children
    children._spawn([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    while not (pathlib.Path(sys.argv[2]).is_file() and pathlib.Path(sys.argv[2]).read_text()):
        time.sleep(0.05)
    sys.exit(128 + 15)
""")


def test_a_child_whose_stop_never_ran_is_stopped_when_the_supervisor_exits(tmp_path):
    pid_file = tmp_path / "server.pid"
    try:
        # its streams are not this test's pipes: a child left running would hold them open
        proc = subprocess.run([sys.executable, "-c", NEVER_STOPPED, SLEEPER, str(pid_file)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=30)
        assert proc.returncode == 128 + 15
        assert _gone(int(pid_file.read_text()), 5.0), "a child outlived the supervising process's exit"
    finally:
        _kill_left(pid_file)


@pytest.mark.parametrize("how", ["setsid", "daemon"])
def test_started_stops_what_its_server_detached(tmp_path, how):
    """children.started (bench's and accuracy's servers): the server still running, its helper in a
    session of its own (or daemonized) is stopped with it."""
    from rocm_vllm_runtime import children  # noqa: PLC0415

    pid_file = tmp_path / "detached.pid"
    try:
        with children.started(_detacher(pid_file, how, "stay"), tmp_path / "log", grace_s=lambda: 5.0):
            deadline = time.monotonic() + 30
            while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
                time.sleep(0.05)
            if how == "daemon":  # an orphan: re-parented to this process (the subreaper), not to init
                time.sleep(0.2)
                with open(f"/proc/{pid_file.read_text()}/stat") as f:
                    assert int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
        assert _gone(int(pid_file.read_text()), 10.0), f"a {how} process outlived its server"
        assert not Path(f"/proc/{pid_file.read_text()}").exists(), "an orphan stopped but not reaped"
    finally:
        _kill_left(pid_file)


def test_selftest_stops_what_its_suite_detached(tmp_path):
    """Through the real entry point: a suite's process in a session of its own is stopped when the
    suite ends."""
    suites = tmp_path / "suites"
    suites.mkdir()
    pid_file = tmp_path / "detached.pid"
    (suites / "test_selector.py").write_text(textwrap.dedent(f"""
        import subprocess, sys
        def test_detaches():
            subprocess.run({_detacher(pid_file)!r}, check=True)
    """))
    env = {**os.environ, "SELFTEST_SUITES": str(suites)}
    try:
        proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.selftest", "selector"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert _gone(int(pid_file.read_text()), 10.0), "a suite's setsid process outlived selftest"
    finally:
        _kill_left(pid_file)


HANGS_ON_STOP = ("import os, signal, sys, time, pathlib; "
                 "[signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)]; "
                 "pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(600)")
STOPPING = {
    # bench / accuracy: forward_signals, the block ends normally, the server ignores its SIGTERM,
    # and the user presses Ctrl-C while the supervisor waits out the grace period
    "started": textwrap.dedent("""
        import pathlib, sys, time
        from rocm_vllm_runtime import children
        children.forward_signals()
        pid_file, marker = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
        with children.started([sys.executable, "-c", {hang!r}, str(pid_file)], marker.with_suffix(".log"),
                              grace_s=lambda: 600.0):
            while not (pid_file.is_file() and pid_file.read_text()):
                time.sleep(0.05)
            marker.write_text("stopping")
    """),
    # no forwarding installed (Python's own SIGINT handler): a first Ctrl-C starts the clean-up, a
    # second one arrives during its grace period
    "run": textwrap.dedent("""
        import pathlib, sys
        from rocm_vllm_runtime import children
        pid_file = pathlib.Path(sys.argv[1])
        children.run([sys.executable, "-c", {hang!r}, str(pid_file)], grace_s=600.0)
    """),
}


def _sigint_acts() -> None:
    """A user's Ctrl-C reaches a process whose SIGINT acts. A test lane's process may hold SIGINT ignored
    (something run in it before set SIG_IGN), exec keeps that, and Python then installs no KeyboardInterrupt:
    the supervisor would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("entry", list(STOPPING))
def test_a_signal_during_the_grace_period_does_not_cut_the_clean_up_short(tmp_path, entry):
    pid_file, marker = tmp_path / "server.pid", tmp_path / "marker"
    script = STOPPING[entry].format(hang=HANGS_ON_STOP)
    proc = subprocess.Popen([sys.executable, "-c", script, str(pid_file), str(marker)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_acts)
    try:
        server = _wait_for_pid(proc, pid_file)
        if entry == "started":
            while not marker.is_file():
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.05)
        else:
            proc.send_signal(signal.SIGINT)  # starts the clean-up
        time.sleep(0.5)  # inside the grace period now (on an idle machine)
        t0 = time.monotonic()
        # "run": a signal that reaches Python while the one before is still unhandled merges with it, and on a
        # busy machine half a second may not see the first one handled: another Ctrl-C each second until it
        # ends. "started" gets one Ctrl-C only: a second one could land while the interpreter shuts down, when
        # Python has put SIGINT's default action back, and end it by the signal instead of its exit status.
        sent = 0
        while True:
            if entry == "run" or not sent:
                proc.send_signal(signal.SIGINT)
                sent += 1
            try:
                out, err = proc.communicate(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() - t0 > 60:
                    raise
        took = time.monotonic() - t0
        assert _gone(server, 5.0), f"the server outlived a Ctrl-C during its grace period ({entry})"
        assert took < 20, f"the clean-up waited {took:.0f}s after a Ctrl-C during its grace period"
        if entry == "started":
            assert proc.returncode == 128 + signal.SIGINT, (proc.returncode, out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_left(pid_file)


# ------------------------------------------------------------------ children.output's deadline

OUTPUT = textwrap.dedent("""
    import json, os, sys, time
    from rocm_vllm_runtime import children
    t0 = time.monotonic()
    out = children.output(json.loads(sys.argv[1]), float(sys.argv[2]))
    took = time.monotonic() - t0
    def zombie_child(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            return False
        return state == "Z" and ppid == str(os.getpid())
    zombies = [p for p in os.listdir("/proc") if p.isdigit() and zombie_child(p)]
    print(json.dumps({"took": took, "stdout": out.stdout, "returncode": out.returncode,
                      "timed_out": out.timed_out, "zombies": zombies}))
""")


def _output(argv: list[str], timeout_s: float, pid_file: Path) -> dict:
    """children.output in a process of its own, so that a call that never returns fails the test."""
    import json  # noqa: PLC0415

    try:
        proc = subprocess.run([sys.executable, "-c", OUTPUT, json.dumps(argv), str(timeout_s)],
                              capture_output=True, text=True, timeout=timeout_s + 30)
    except subprocess.TimeoutExpired:
        _kill_left(pid_file)
        pytest.fail(f"children.output({timeout_s}s) had not returned {timeout_s + 30:.0f}s later")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_output_ends_at_its_deadline_when_a_helper_holds_the_pipe(tmp_path):
    """A tool that hangs, and a helper of its in a session of its own holding its stdout open: the
    deadline bounds the whole call, reading included, and the helper is stopped."""
    pid_file = tmp_path / "helper.pid"
    try:
        result = _output(_detacher(pid_file, "setsid", "stay"), 2.0, pid_file)
        assert result["timed_out"] and result["took"] < 2.0 + 5, result
        assert _gone(int(pid_file.read_text()), 5.0), "the helper outlived children.output"
    finally:
        _kill_left(pid_file)


def test_output_of_a_tool_that_leaves_a_helper_running(tmp_path):
    """A tool that printed its answer and exited, its helper still holding the pipe (amd-smi leaving a
    helper running): the answer comes back soon after the tool ends, not at the deadline, and the
    helper is stopped."""
    pid_file = tmp_path / "helper.pid"
    try:
        result = _output(_detacher(pid_file, "setsid", "exit"), 60.0, pid_file)
        assert result["stdout"] == "listing\n" and result["returncode"] == 0 and not result["timed_out"], result
        assert result["took"] < 10, result
        assert _gone(int(pid_file.read_text()), 5.0), "the helper outlived children.output"
    finally:
        _kill_left(pid_file)


# A tool that starts a helper which ends at once, never waits for it, prints its answer and exits: the
# helper is a zombie, adopted by the supervisor when the tool ends ("group": in the tool's process
# group; "setsid": in a session of its own).
ZOMBIE_HELPER = textwrap.dedent("""
    import os, sys
    if os.fork() == 0:
        if sys.argv[1] == "setsid":
            os.setsid()
        os._exit(0)
    import time
    time.sleep(0.2)
    print("listing", flush=True)
""")


@pytest.mark.parametrize("how", ["group", "setsid"])
def test_output_returns_within_its_limit_when_a_helper_is_a_zombie(tmp_path, how):
    result = _output([sys.executable, "-c", ZOMBIE_HELPER, how], 3.0, tmp_path / "none.pid")
    assert result["stdout"] == "listing\n" and result["returncode"] == 0 and not result["timed_out"], result
    assert result["took"] < 3.0, f"children.output(argv, 3) took {result['took']:.1f}s: a zombie helper held it"
    assert not result["zombies"], f"the tool's helper was left a zombie: {result['zombies']}"


def test_output_returns_within_its_limit_when_its_tool_cannot_be_killed(tmp_path, monkeypatch):
    """A tool stuck where SIGKILL does not reach it (uninterruptible sleep in a driver), stood in for
    by a supervisor whose signals do nothing: output still returns about its limit after it started,
    and the tool is left to the clean-up at exit."""
    from rocm_vllm_runtime import children  # noqa: PLC0415

    pid_file = tmp_path / "tool.pid"
    monkeypatch.setattr(children, "_signal_group", lambda pgid, sig: True)
    monkeypatch.setattr(children, "_kill", lambda p, sig: None)
    try:
        t0 = time.monotonic()
        result = children.output([sys.executable, "-c", SLEEPER, str(pid_file)], 1.0)
        took = time.monotonic() - t0
        assert result.timed_out and took < 3.0, f"output(argv, 1) took {took:.1f}s"
    finally:
        monkeypatch.undo()
        _kill_left(pid_file)


def test_output_that_is_not_utf8_is_shown_not_a_traceback():
    from rocm_vllm_runtime import children  # noqa: PLC0415

    code = "import sys; sys.stdout.buffer.write(b'gfx942 \\xff\\xfe\\n'); sys.stderr.buffer.write(b'\\xc3(\\n')"
    result = children.output([sys.executable, "-c", code], 10.0)
    assert result.stdout == "gfx942 \ufffd\ufffd\n" and result.stderr == "\ufffd(\n"
    assert result.returncode == 0


STREAMS = ("import os, sys; print(os.getcwd(), os.environ.get('STREAMS_PROBE', '-')); "
           "print('to stderr', file=sys.stderr)")


def test_the_childs_folder_environment_and_streams_are_the_callers_choice(tmp_path):
    """cwd and env for each door; run's stdout, output's stderr and started's streams (no log)
    go where the caller says (tools/cpu_serve.py: a build's stdout dropped, a log followed on stderr,
    a long tool's progress on the terminal while its stdout is read)."""
    from rocm_vllm_runtime import children  # noqa: PLC0415

    env = {**os.environ, "STREAMS_PROBE": "probe"}
    out = tmp_path / "stdout.txt"
    with open(out, "w") as f:
        assert children.run([sys.executable, "-c", STREAMS], env, cwd=tmp_path, stdout=f) == 0
    assert out.read_text() == f"{tmp_path} probe\n"

    result = children.output([sys.executable, "-c", STREAMS], 30.0, env=env, cwd=tmp_path,
                             stderr=subprocess.DEVNULL)
    assert (result.stdout, result.stderr, result.returncode) == (f"{tmp_path} probe\n", "", 0)

    with open(out, "w") as f, children.started([sys.executable, "-c", STREAMS], None, env, cwd=tmp_path,
                                               stdout=f, stderr=subprocess.DEVNULL) as proc:
        assert proc.wait(30) == 0
    assert out.read_text() == f"{tmp_path} probe\n"
