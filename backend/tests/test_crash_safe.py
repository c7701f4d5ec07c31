"""A decode call that raises, aborts its process or hangs during the start-up measurement ends neither
the server nor the other tensor-parallel ranks (crash_safe): it is first measured in a child process
under a time limit (measure_child), its outcome recorded (measurement_record) and read by a later start;
only calls the child found served run in the server's process; every rank makes one agreement exchange
per set of calls, and ends on the remedy where the remedy measured right.

Real children run stand-ins of child_standins.py (this folder on their PYTHONPATH): right, raising,
aborting (os.abort) and hanging past a small limit. What the parent makes of a child's end, and the
records, are tested with children run in this process (child_standins.in_process) or answers made here."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import child_standins
import pytest
import remedy_standins
import torch
from rocm_vllm_runtime import children, numeric

import vllm_aiter_mla
from vllm_aiter_mla import crash_safe, measure, measure_child, measurement_record
from vllm_aiter_mla.kernels import MLAKernels
from vllm_aiter_mla.measure import Outcome
from vllm_aiter_mla.remedy import TritonDecode

BF16 = torch.bfloat16
CPU = torch.device("cpu")
HERE = Path(__file__).resolve().parent
HANG_LIMIT_S = 20.0  # a hanging child is killed after this (long enough for a loaded machine's torch import)


def calls(max_qlen: int) -> list[measure.DecodeCall]:
    return list(measure.layer_calls(16, max_qlen, BF16, BF16, BF16))


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """One PyTorch thread here and in the children (two test lanes share two cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def child_env(monkeypatch):
    """Children import the code this test imported, and the stand-ins of this folder."""
    roots = [Path(vllm_aiter_mla.__file__).parents[1], Path(children.__file__).parents[1], HERE]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(str(p) for p in roots))


@pytest.fixture
def ends_raise(monkeypatch):
    """In this process a stand-in's abort or hang raises child_standins.Died: a call run here that the
    child found ending its process fails the test instead of ending pytest."""
    def died():
        raise child_standins.Died(None)

    monkeypatch.setitem(child_standins.END, "abort", died)
    monkeypatch.setitem(child_standins.END, "hang", died)


def no_child(argv, timeout_s):
    raise AssertionError("a measurement child was started")


# ---- real children ----

def test_a_raising_and_an_aborting_call_leave_the_server_on_the_remedy_and_a_record_skips_the_child(
        monkeypatch, tmp_path, child_env, ends_raise):
    """AITER right at query length 1, raising at 2, aborting its process at 3: the child is killed by
    SIGABRT at 3 and this process lives; 2 and 3 are served by the remedy, measured right; only the calls
    the child found served run here. A second start reads the record: no child, the same answer."""
    monkeypatch.setenv(crash_safe.RECORDS_ENV, str(tmp_path))
    kernels = child_standins.raises_2_aborts_3("aiter", 4)
    here = []
    counted = MLAKernels("counted", lambda *a, **k: here.append(a[7]) or kernels.mla_decode_fwd(*a, **k),
                                 kernels.get_mla_metadata_info_v1, kernels.get_mla_metadata_v1)
    triton = remedy_standins.triton_standin()
    for start in ("first", "second"):
        here.clear()
        found = crash_safe.measure_layer(counted, triton, calls(3), 4, CPU, "child_standins:raises_2_aborts_3")
        outcomes = {q: m.outcome for q, m in found.measured.items()}
        assert outcomes == {1: Outcome.CORRECT, 2: Outcome.RAISED, 3: Outcome.ENDED}, (start, found)
        assert "killed by SIGABRT" in found.measured[3].describe(), found.measured[3]
        assert all(m.outcome is Outcome.CORRECT for m in found.remedy.values()), found.remedy
        assert measure.serving(found.measured, found.remedy, found.flags) == {1: "aiter", 2: "triton", 3: "triton"}
        assert set(here) == {1}, here  # in this process: only what the child found served
        assert ("measured in a child" if start == "first" else "read from its record") in found.first, found.first
        monkeypatch.setattr(crash_safe, "run_child", no_child)
    assert len(list(tmp_path.glob("*.json"))) == 1


TWO_RANKS = """
import json, sys, datetime, torch, torch.distributed as dist
torch.set_num_threads(1)
from vllm_aiter_mla import crash_safe, measure
import child_standins, remedy_standins
rank, port, factory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=240))
def died():
    raise SystemExit(f"rank {rank} ran in its own process a call that ended its child")
child_standins.END.update(abort=died, hang=died)
kernels = getattr(child_standins, factory.split(":")[1])("aiter", 4)
calls = list(measure.layer_calls(16, 2, torch.bfloat16, torch.bfloat16, torch.bfloat16))
found = crash_safe.measure_layer(kernels, remedy_standins.triton_standin(), calls, 4, torch.device("cpu"), factory,
                                 dist.group.WORLD)
after = measure.agree(True, dist.group.WORLD)  # in step: each rank made the same number of exchanges before
print(json.dumps({"serving": measure.serving(found.measured, found.remedy, found.flags), "after": after,
                  "aiter": {q: m.describe() for q, m in found.measured.items()},
                  "remedy": {q: m.outcome.value for q, m in found.remedy.items()}}))
dist.destroy_process_group()
"""


def test_two_ranks_one_raising_and_aborting_one_hanging_both_end_on_the_remedy(tmp_path, child_env):
    """Two ranks over gloo on loopback. Rank 0: AITER raises at query length 1 and aborts its process at 2;
    rank 1: AITER right at 1, hanging at 2 past the limit. Both ranks live, agree in one exchange and
    serve both query lengths with the remedy (rank 1 at 1 too: rank 0 measured AITER wrong there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, crash_safe.TIMEOUT_ENV: f"{HANG_LIMIT_S:g}", crash_safe.RECORDS_ENV: str(tmp_path)}
    factories = ("child_standins:raises_1_aborts_2", "child_standins:hangs_2")
    procs = [subprocess.Popen([sys.executable, "-c", TWO_RANKS, str(rank), str(port), factory], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, factory in enumerate(factories)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    ranks = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert all(r["serving"] == {"1": "triton", "2": "triton"} and r["after"] for r in ranks), ranks
    assert all(r["remedy"] == {"1": "correct", "2": "correct"} for r in ranks), ranks
    zero, one = ranks[0]["aiter"], ranks[1]["aiter"]
    assert zero["1"].startswith("raised RuntimeError: AITER: no kernel") and "killed by SIGABRT" in zero["2"], zero
    assert one["1"].startswith("correct") and one["2"].startswith("passed the time limit"), one
    assert f"{crash_safe.TIMEOUT_ENV}={HANG_LIMIT_S:g} s" in one["2"], one


# ---- what the parent makes of a child's end (children run in this process) ----

def test_a_remedy_ending_its_child_leaves_aiters_calls_to_a_second_child(monkeypatch):
    """The remedy aborts at query length 1: its query length 2 is not measured, AITER's calls run in a
    second child, where 2 hangs: 1 goes to AITER, 2 to nothing (the server would refuse)."""
    started = []
    run = child_standins.in_process()
    monkeypatch.setattr(crash_safe, "run_child", lambda argv, t: started.append(argv) or run(argv, t))
    found, _ = crash_safe.measure_in_children("child_standins:remedy_aborts_1_aiter_hangs_2", calls(2), 4, CPU, 9.0)
    assert [argv.count("--task") for argv in started] == [4, 2], started
    assert {t: m.outcome for t, m in found.items()} == {
        ("triton", 1): Outcome.ENDED, ("triton", 2): Outcome.NOT_MEASURED,
        ("aiter", 1): Outcome.CORRECT, ("aiter", 2): Outcome.TIMED_OUT}, found
    assert found["triton", 2].detail == "vLLM's Triton decode at query length 1 ended the process first"
    assert "passed AITER_MLA_MEASURE_TIMEOUT_S=9 s" in found["aiter", 2].detail
    aiter = {q: found["aiter", q] for q in (1, 2)}
    assert measure.serving(aiter, {q: found["triton", q] for q in (1, 2)}) == {1: "aiter", 2: None}


@pytest.mark.parametrize("output,said", [
    (children.Output("", "Traceback ...\nModuleNotFoundError: No module named 'gone'\n", 1),
     "the measurement child was exited with status 1: ModuleNotFoundError: No module named 'gone'"),
    (children.Output("", "", -11), "the measurement child was killed by SIGSEGV"),
    (children.Output("", "", None, timed_out=True), "passed AITER_MLA_MEASURE_TIMEOUT_S=5 s"),
    (children.Output(error="No such file or directory"), "could not be started (No such file or directory)"),
], ids=["exit 1", "signal", "time limit", "not started"])
def test_a_child_that_ends_before_its_first_call_leaves_every_call_unserved(monkeypatch, output, said):
    monkeypatch.setattr(crash_safe, "run_child", lambda argv, t: output)
    found, _ = crash_safe.measure_in_children(measure_child.PRODUCTION, calls(2), 4, CPU, 5.0)
    assert len(found) == 4 and all(not m.outcome.served for m in found.values()), found
    assert all(said in m.detail for m in found.values()), found


def test_a_child_that_finishes_with_a_signal_after_its_last_call_is_believed(monkeypatch):
    """A process that crashes at exit (a GPU runtime's teardown) after reporting every call."""
    lines = [measure_child.LINE + json.dumps({"done": [kind, 1], "measured": measure.measured_data(RIGHT)})
             for kind in measure_child.KINDS]
    monkeypatch.setattr(crash_safe, "run_child", lambda argv, t: children.Output("\n".join(lines), "", -11))
    found, _ = crash_safe.measure_in_children(measure_child.PRODUCTION, calls(1), 4, CPU, 5.0)
    assert all(m.outcome is Outcome.CORRECT for m in found.values()), found


def test_a_report_line_cut_short_or_foreign_output_is_ignored():
    good = measure_child.LINE + json.dumps({"done": ["aiter", 1], "measured": measure.measured_data(RIGHT)})
    stdout = "\n".join(["INFO the kernels' own output", good, measure_child.LINE + '{"begin": ["aiter", 2]}',
                        measure_child.LINE + '{"done": ["aiter", 2], "meas'])
    end = crash_safe.child_end(children.Output(stdout, "", -6), 5.0)
    assert set(end.done) == {("aiter", 1)} and end.running == ("aiter", 2), end
    assert end.failure.outcome is Outcome.ENDED and "SIGABRT" in end.failure.detail


# ---- where the first measurement runs ----

def test_cpu_development_mode_measures_in_this_process_and_starts_no_child(monkeypatch):
    """The pure-PyTorch reference on the CPU (AITER_MLA_KERNELS=reference, the production factory) cannot
    end the process: no child; every call and the remedy (not loadable on the CPU) are measured here."""
    monkeypatch.setattr(crash_safe, "run_child", no_child)
    found = crash_safe.measure_layer(child_standins.REFERENCE, None, calls(2), 4, CPU,
                                     environ={"AITER_MLA_KERNELS": "reference"})
    assert found.first == crash_safe.IN_PROCESS
    assert {q: m.outcome for q, m in found.measured.items()} == {1: Outcome.CORRECT, 2: Outcome.CORRECT}
    assert {q: m.outcome for q, m in found.remedy.items()} == {1: Outcome.RAISED, 2: Outcome.RAISED}


# measure_child.PRODUCTION is a server's factory, vllm_aiter_mla.upstream_kernels:production
@pytest.mark.parametrize("environ, factory, device", [
    ({}, measure_child.PRODUCTION, CPU),  # AITER's kernels (the default)
    ({"AITER_MLA_KERNELS": "aiter"}, measure_child.PRODUCTION, CPU),
    ({"AITER_MLA_KERNELS": "reference"}, "child_standins:right", CPU),  # a stand-in factory
    ({"AITER_MLA_KERNELS": "reference"}, measure_child.PRODUCTION, torch.device("cuda", 0)),  # Triton on a GPU
], ids=["aiter-default", "aiter", "stand-in", "reference-on-gpu"])
def test_a_child_measures_first_wherever_a_kernel_could_end_the_process(monkeypatch, tmp_path, environ, factory,
                                                                       device):
    environ = {**environ, crash_safe.RECORDS_ENV: str(tmp_path)}
    assert crash_safe.needs_child(factory, device, environ)
    if device.type != "cpu":
        return
    started = []
    monkeypatch.setattr(crash_safe, "run_child", lambda argv, t: started.append(argv) or children.Output(error="no"))
    found = crash_safe.measure_layer(child_standins.REFERENCE, None, calls(1), 4, device, factory=factory,
                                     environ=environ)
    assert started and found.first != crash_safe.IN_PROCESS
    assert not found.measured[1].outcome.served, found.measured[1]


# ---- every rank makes one exchange, whatever its measurement did ----

@pytest.mark.parametrize("broken", ["setting", "runtime", "record folder", "child not started"])
def test_one_exchange_whatever_the_first_measurement_did(monkeypatch, tmp_path, broken):
    """Whatever goes wrong before the agreement becomes an outcome (not served), never an exception that
    would leave the other ranks waiting in the exchange."""
    exchanges = []

    def agree(flags, qlens, group):
        exchanges.append(group)
        return flags

    monkeypatch.setattr(measure, "agree_flags", agree)
    monkeypatch.setattr(crash_safe, "run_child", lambda argv, t: children.Output(error="no python"))
    env = {crash_safe.RECORDS_ENV: str(tmp_path / "records")}
    if broken == "setting":
        env[crash_safe.TIMEOUT_ENV] = "soon"
    elif broken == "runtime":
        monkeypatch.setattr(crash_safe, "_runtime", lambda: (_ for _ in ()).throw(
            RuntimeError(crash_safe.RUNTIME_MISSING)))
    elif broken == "record folder":
        (tmp_path / "records").write_text("a file where the folder goes")
    found = crash_safe.measure_layer(child_standins.REFERENCE, None, calls(2), 4, CPU, group="the group",
                                     environ=env)
    assert exchanges == ["the group"]
    assert not any(m.outcome.served for m in found.measured.values()), found
    expected = {"setting": "AITER_MLA_MEASURE_TIMEOUT_S='soon' is not a number of seconds",
                "runtime": "rocm_vllm_runtime (the image's runtime), which is not installed",
                "record folder": "could not be started (no python)",
                "child not started": "could not be started (no python)"}[broken]
    assert expected in found.measured[1].describe(), found.measured[1].describe()


# ---- settings ----

def test_the_time_limit_setting(tmp_path):
    assert crash_safe.timeout_setting({}) == crash_safe.DEFAULT_TIMEOUT_S == 300.0
    assert crash_safe.timeout_setting({crash_safe.TIMEOUT_ENV: "12.5"}) == 12.5
    for bad in ("0", "-1", "901", "1e3", "ten", "5 s"):
        with pytest.raises(numeric.SettingError, match=f"^{crash_safe.TIMEOUT_ENV}="):
            crash_safe.timeout_setting({crash_safe.TIMEOUT_ENV: bad})


def test_the_record_folder_setting(tmp_path):
    assert crash_safe.records_setting({crash_safe.RECORDS_ENV: str(tmp_path / "r")}) == tmp_path / "r"
    cache = {"ROCM_VLLM_JIT_CACHE": str(tmp_path)}
    assert crash_safe.records_setting(cache) == tmp_path / "aiter-mla-measured"  # the image's cache volume
    assert crash_safe.records_setting({"ROCM_VLLM_JIT_CACHE": str(tmp_path / "absent")}) is None  # no volume


# ---- records ----

RIGHT = measure.Measured(Outcome.CORRECT, 0.003, 0.031, "", 1.0, 0.0, 0.0039, 0.002)
ALL_RIGHT = {(kind, q): RIGHT for kind in measure_child.KINDS for q in (1, 2)}


def reporting(measured: dict) -> callable:
    """A child that reports ``measured`` and finishes, counting its starts."""
    def run(argv, timeout_s):
        run.started += 1
        lines = [measure_child.LINE + json.dumps({"done": list(t), "measured": measure.measured_data(m)})
                 for t, m in measured.items()]
        return children.Output("\n".join(lines), "", 0)

    run.started = 0
    return run


@pytest.fixture
def record(monkeypatch, tmp_path):
    """A good record made by a first start (one child), and what a second start makes of it."""
    child = reporting(ALL_RIGHT)
    monkeypatch.setattr(crash_safe, "run_child", child)
    found, source = crash_safe.first_measurement("f:g", calls(2), 4, CPU, tmp_path, 300.0)
    assert child.started == 1 and found == ALL_RIGHT and "recorded in" in source, source
    path = next(tmp_path.glob("*.json"))

    def second_start(timeout_s: float = 300.0) -> tuple[int, str]:
        child.started = 0
        again, source = crash_safe.first_measurement("f:g", calls(2), 4, CPU, tmp_path, timeout_s)
        assert again == ALL_RIGHT
        return child.started, source

    return path, second_start


def test_a_good_record_skips_the_child(record):
    path, second_start = record
    assert second_start() == (0, f"read from its record {path}")


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


BAD_RECORDS = {
    "not JSON": lambda p: p.write_text("{not json"),
    "cut short (a writer that crashed)": lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]),
    "empty": lambda p: p.write_text(""),
    "another shape": lambda p: _edit(p, lambda d: d.pop("measured")),
    "an unknown outcome": lambda p: _edit(p, lambda d: d["measured"]["aiter"]["1"].update(outcome="fine")),
    "a query length missing": lambda p: _edit(p, lambda d: d["measured"]["triton"].pop("2")),
    "a key twice": lambda p: p.write_text(p.read_text().replace('"format": 1,', '"format": 1, "format": 1,')),
    "foreign: another GPU": lambda p: _edit(p, lambda d: d["identity"].update(gpu="gfx950 AMD Instinct MI355X")),
    "foreign: other calls": lambda p: _edit(p, lambda d: d["identity"]["calls"].pop()),
    "stale: another AITER": lambda p: _edit(p, lambda d: d["builds"].update(aiter="amd-aiter 0.1.1 0123456789abcdef")),
    "stale: another plugin source": lambda p: _edit(p, lambda d: d["builds"].update(plugin="0.1.0 0000000000000000")),
    "stale: another format": lambda p: _edit(p, lambda d: d.update(format=0)),
}
WHY = {"not JSON": "malformed", "cut short (a writer that crashed)": "malformed", "empty": "malformed",
       "another shape": "malformed", "an unknown outcome": "malformed", "a query length missing": "malformed",
       "a key twice": "malformed", "foreign: another GPU": "foreign", "foreign: other calls": "foreign",
       "stale: another AITER": "stale (measured with another aiter)",
       "stale: another plugin source": "stale (measured with another plugin)", "stale: another format": "stale"}


@pytest.mark.parametrize("bad", list(BAD_RECORDS))
def test_a_record_that_cannot_be_trusted_is_measured_again_and_replaced(record, caplog, bad):
    path, second_start = record
    BAD_RECORDS[bad](path)
    with caplog.at_level("INFO", logger="vllm.aiter_mla"):
        started, source = second_start()
    assert started == 1 and "recorded in" in source, (bad, source)
    assert f"is {WHY[bad]}" in caplog.text, caplog.text
    assert second_start() == (0, f"read from its record {path}")  # replaced by a good one


def test_a_folder_where_the_record_goes_is_measured_again_at_each_start(record, caplog):
    """It cannot be replaced: each start measures in a child and says so."""
    path, second_start = record
    path.unlink()
    path.mkdir()
    for _ in range(2):
        with caplog.at_level("INFO", logger="vllm.aiter_mla"):
            assert second_start()[0] == 1
    assert "is unreadable" in caplog.text and "could not be written" in caplog.text, caplog.text


def test_a_call_that_passed_a_shorter_time_limit_is_measured_again(monkeypatch, tmp_path):
    hung = {**ALL_RIGHT, ("aiter", 2): measure.Measured(Outcome.TIMED_OUT, math.nan, math.nan, "hung")}
    monkeypatch.setattr(crash_safe, "run_child", reporting(hung))
    crash_safe.first_measurement("f:g", calls(2), 4, CPU, tmp_path, 60.0)
    monkeypatch.setattr(crash_safe, "run_child", no_child)
    found, _ = crash_safe.first_measurement("f:g", calls(2), 4, CPU, tmp_path, 60.0)  # the same limit: believed
    assert found["aiter", 2].outcome is Outcome.TIMED_OUT
    path = next(tmp_path.glob("*.json"))
    found, why = measurement_record.read(path, measurement_record.identity(
        "cpu", calls(2), 4, "f:g"), measurement_record.builds(), (1, 2), 120.0)
    assert found is None and why == "stale (a call passed its time limit of 60 s, now 120 s)"


def test_records_are_kept_apart_by_gpu_calls_and_kernels(tmp_path):
    ident = measurement_record.identity("cpu", calls(2), 4, "f:g")
    others = [measurement_record.identity("gfx942 AMD Instinct MI300X", calls(2), 4, "f:g"),
              measurement_record.identity("cpu", calls(3), 4, "f:g"),
              measurement_record.identity("cpu", calls(2), 8, "f:g"),
              measurement_record.identity("cpu", calls(2), 4, measure_child.PRODUCTION)]
    paths = {measurement_record.path_in(tmp_path, i) for i in [ident, *others]}
    assert len(paths) == 5 and all(p.parent == tmp_path for p in paths)


def test_the_start_up_bench_times_a_first_and_a_later_start(capsys, child_env):
    """backend/bench/crash_safe_start.py (the cost quoted in backend/README.md) runs without vLLM: a first
    start measures in a child and records, a later one reads the record."""
    import importlib.util

    path = HERE.parent / "bench" / "crash_safe_start.py"
    spec = importlib.util.spec_from_file_location("crash_safe_start", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--device", "cpu", "--max-qlen", "1"]) == 0
    out = capsys.readouterr().out
    assert "a child that only starts: " in out and "(exit 0)" in out, out
    assert "first start: " in out and "measured in a child process in " in out and "recorded in " in out, out
    assert "later start: " in out and "read from its record " in out and "serving {1: 'aiter'}" in out, out


# ---- the remedy in this process only where it would serve ----


def counting_remedy(counted: list) -> TritonDecode:
    """The remedy's CPU stand-in, noting the query length of each call made to it (six requests a call)."""
    right = remedy_standins.triton_standin()

    def wrap(function):
        def call(q, *args, **kwargs):
            counted.append(q.shape[0] // 6)
            return function(q, *args, **kwargs)
        return call

    return dataclasses.replace(right, decode_attention_fwd=wrap(right.decode_attention_fwd),
                               decode_attention_fwd_verify=wrap(right.decode_attention_fwd_verify))


@pytest.fixture
def exchanges(monkeypatch):
    """Each exchange's flags; the group answers with this rank's, plus ``exchanges.others_need``."""
    seen: list = []
    seen_need: set[int] = set()

    def agree(flags, qlens, group):
        seen.append(flags)
        return (flags[0] | frozenset(seen_need), *flags[1:])

    monkeypatch.setattr(measure, "agree_flags", agree)
    monkeypatch.setattr(crash_safe, "run_child", reporting(ALL_RIGHT))
    return seen, seen_need


@pytest.mark.parametrize("aiter, others_need, remedy_here, count", [
    (child_standins.REFERENCE, set(), set(), 1),  # AITER serves everywhere: the child's remedy outcome stands
    (child_standins.aiter_with({2: "raise"}), set(), {2}, 1),  # measured here where this rank needs it
    (child_standins.REFERENCE, {1}, {1}, 2),  # another rank needs it at 1: measured here too, a second exchange
], ids=["aiter-right", "aiter-raises-here", "another-rank-needs-it"])
def test_the_remedy_runs_here_only_where_some_rank_needs_it(tmp_path, exchanges, aiter, others_need, remedy_here,
                                                            count):
    seen, need = exchanges
    need.update(others_need)
    counted: list[int] = []
    found = crash_safe.measure_layer(aiter, counting_remedy(counted), calls(2), 4, CPU, "f:g",
                                     environ={crash_safe.RECORDS_ENV: str(tmp_path)})
    assert set(counted) == remedy_here, counted
    assert len(seen) == count, seen  # the second exchange: only where the agreed flags call for it
    assert all(found.remedy[q].outcome is Outcome.CORRECT for q in (1, 2)), found.remedy
    assert {q for q in (1, 2) if found.remedy[q] != RIGHT} == remedy_here  # the rest: the child's outcome
    chosen = measure.serving(found.measured, found.remedy, found.flags)
    assert {q for q, kernel in chosen.items() if kernel == "triton"} == remedy_here, chosen


def test_a_remedy_measured_wrong_where_another_rank_needs_it_refuses_on_every_rank(tmp_path, exchanges):
    seen, need = exchanges
    need.add(1)
    found = crash_safe.measure_layer(child_standins.REFERENCE, remedy_standins.triton_standin(factor=0.9), calls(2),
                                     4, CPU, "f:g", environ={crash_safe.RECORDS_ENV: str(tmp_path)})
    assert found.remedy[1].outcome is Outcome.WRONG and found.remedy[2] == RIGHT, found.remedy
    assert len(seen) == 2 and found.flags == (frozenset({1}), frozenset({1})), (seen, found.flags)
    assert measure.serving(found.measured, found.remedy, found.flags) == {1: None, 2: "aiter"}


# ---- a first measurement begun ahead ----


def test_a_first_measurement_begun_ahead_is_collected_once(monkeypatch, tmp_path, exchanges):
    seen, _ = exchanges
    child = reporting(ALL_RIGHT)
    monkeypatch.setattr(crash_safe, "run_child", child)
    environ = {crash_safe.RECORDS_ENV: str(tmp_path)}
    assert crash_safe.begin("f:g", calls(2), 4, CPU, environ)
    assert not crash_safe.begin("f:g", calls(2), 4, CPU, environ)  # begun already
    found = crash_safe.measure_layer(child_standins.REFERENCE, None, calls(2), 4, CPU, "f:g", environ=environ)
    assert child.started == 1 and found.first.startswith("measured in a child") and "begun ahead" in found.first
    assert all(m.outcome is Outcome.CORRECT for m in found.measured.values()) and len(seen) == 1
    again = crash_safe.measure_layer(child_standins.REFERENCE, None, calls(2), 4, CPU, "f:g", environ=environ)
    assert child.started == 1 and again.first.startswith("read from its record"), again.first  # nothing begun


def test_a_first_measurement_begun_under_other_settings_is_not_taken(monkeypatch, tmp_path, exchanges):
    child = reporting(ALL_RIGHT)
    monkeypatch.setattr(crash_safe, "run_child", child)
    assert crash_safe.begin("f:g", calls(2), 4, CPU, {crash_safe.RECORDS_ENV: str(tmp_path / "a")})
    found = crash_safe.measure_layer(child_standins.REFERENCE, None, calls(2), 4, CPU, "f:g",
                                     environ={crash_safe.RECORDS_ENV: str(tmp_path / "b")})
    assert "begun ahead" not in found.first and child.started >= 1
    late = crash_safe.measure_layer(child_standins.REFERENCE, None, calls(2), 4, CPU, "f:g",
                                    environ={crash_safe.RECORDS_ENV: str(tmp_path / "a")})
    assert "begun ahead" in late.first, late.first


def test_a_first_measurement_begun_ahead_that_fails_is_an_outcome(monkeypatch, tmp_path, exchanges):
    seen, _ = exchanges

    def broken(argv, timeout_s):
        raise RuntimeError("the child's supervisor broke")

    monkeypatch.setattr(crash_safe, "run_child", broken)
    environ = {crash_safe.RECORDS_ENV: str(tmp_path)}
    assert crash_safe.begin("f:g", calls(2), 4, CPU, environ)
    found = crash_safe.measure_layer(child_standins.REFERENCE, None, calls(2), 4, CPU, "f:g", environ=environ)
    assert len(seen) == 1 and not any(m.outcome.served for m in found.measured.values()), found
    assert "the child's supervisor broke" in found.measured[1].describe(), found.measured[1].describe()


def test_nothing_is_begun_where_no_child_measures(monkeypatch):
    monkeypatch.setattr(crash_safe, "run_child", no_child)
    assert not crash_safe.begin(measure_child.PRODUCTION, calls(1), 4, CPU, {"AITER_MLA_KERNELS": "reference"})
    assert not crash_safe.begin(measure_child.PRODUCTION, calls(1), 4, CPU, {"AITER_MLA_KERNELS": "nonsense"})


# ---- the remedy's kernels compiled side by side in the child ----


def _warming(tasks) -> str:
    return measure_child.LINE + json.dumps({"warm": [list(t) for t in tasks]})


def test_a_child_that_ends_compiling_side_by_side_is_measured_again_one_at_a_time(monkeypatch):
    started = []
    tasks = [("triton", 1), ("triton", 2)]

    def run(argv, timeout_s):
        started.append(argv)
        if len(started) == 1:
            return children.Output(_warming(tasks), "", -11)
        return reporting(ALL_RIGHT)(argv, timeout_s)

    run.started = 0
    monkeypatch.setattr(crash_safe, "run_child", run)
    found, _ = crash_safe.measure_in_children(measure_child.PRODUCTION, calls(2), 4, CPU, 5.0)
    assert len(started) == 2 and "--no-warm" not in started[0] and "--no-warm" in started[1], started
    assert found == ALL_RIGHT, found


def test_compiles_side_by_side_that_pass_the_limit_leave_aiters_calls_to_a_second_child(monkeypatch):
    started = []

    def run(argv, timeout_s):
        started.append(argv)
        if len(started) == 1:
            return children.Output(_warming([("triton", 1), ("triton", 2)]), "", None, timed_out=True)
        return reporting({t: m for t, m in ALL_RIGHT.items() if t[0] == "aiter"})(argv, timeout_s)

    run.started = 0
    monkeypatch.setattr(crash_safe, "run_child", run)
    found, _ = crash_safe.measure_in_children(measure_child.PRODUCTION, calls(2), 4, CPU, 5.0)
    assert len(started) == 2 and started[1].count("--task") == 2 and "aiter:1" in started[1], started
    assert {t: m.outcome for t, m in found.items()} == {
        ("triton", 1): Outcome.TIMED_OUT, ("triton", 2): Outcome.TIMED_OUT,
        ("aiter", 1): Outcome.CORRECT, ("aiter", 2): Outcome.CORRECT}, found
