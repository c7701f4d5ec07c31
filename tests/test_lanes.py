"""The suite's lanes (conftest.py, pytest-xdist's loadgroup distribution, as ci/test.sh runs it):
the Docker tests (marked docker) run in two units, each in one worker, in collection order, handed
out first (a file joins the second with docker(unit="second")); the
tests that use a costly session fixture (engine_runs) share one worker, which makes it once; every
other test file goes to whichever worker is free, those with a long test first; the time of each
lane is reported, naming those that ran Docker tests; skips and the tests' summary lines
(tests/report_lines.py) reach the controller's summary. Driven on a small session of its own, with
the repository's conftest.py and pytest.ini."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="pytest-xdist is not installed (tests/requirements.lock installs it)")

ROOT = Path(__file__).resolve().parents[1]

RECORDING = '''
import os, pytest

def record(name):
    with open(os.environ["LANE_RECORD"], "a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {name}\\n")
'''


def module(marked: bool | str, names: list[str]) -> str:
    marker = "docker" if marked is True else marked  # or a marker with its arguments
    body = RECORDING + (f"pytestmark = pytest.mark.{marker}\n" if marker else "")
    return body + "".join(f"\ndef test_{n}():\n    record('{n}')\n" for n in names)


def in_three_lanes(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """The suite under tmp_path/suite run as ci/test.sh runs it (three lanes): the process and the
    recorded [worker, test] pairs, in the order the tests ran."""
    record = tmp_path / "record.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "CI", "PYTEST_XDIST_WORKER")}
    env["LANE_RECORD"] = str(record)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup",
                           "suite"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc, [line.split() for line in record.read_text().splitlines()]


def test_docker_units_take_a_lane_each_first_and_in_order_and_the_rest_spread(tmp_path):
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text((ROOT / "pytest.ini").read_text().replace("testpaths =", "# testpaths ="))
    suite = tmp_path / "suite"
    suite.mkdir()
    # Docker tests in three modules (the middle one in the second unit), the others between and after
    # them, as in the real collection;
    # each test takes a moment, so that the lanes run side by side
    pause = "\nimport time\n\n@pytest.fixture(autouse=True)\ndef _a_moment():\n    time.sleep(0.2)\n"
    (suite / "test_a_docker.py").write_text(module(True, ["d1", "d2"]) + pause)
    (suite / "test_b_plain.py").write_text(module(False, [f"p{i}" for i in range(3)]) + pause)
    (suite / "test_c_docker.py").write_text(module('docker(unit="second")', ["d3", "d4", "d6"]) + pause)
    (suite / "test_d_plain.py").write_text(module(False, [f"q{i}" for i in range(3)]) + pause +
                                           "\ndef test_skips():\n    pytest.skip('for the count')\n")
    (suite / "test_e_docker.py").write_text(module(True, ["d5"]) + pause)
    (suite / "test_g_plain.py").write_text(module(False, ["g0", "g1"]) + pause)
    # collected last, but a test that takes minutes: handed out before the short files; an engine test's
    # file, collected after it, before it
    (suite / "test_z_long.py").write_text(module("long", ["z0"]) + pause)
    (suite / "test_zz_engine.py").write_text(module("engine", ["y0"]))
    # two files sharing a session fixture of their folder: made once, by one lane
    engine = suite / "engine"
    engine.mkdir()
    (engine / "conftest.py").write_text(
        "import os, pytest\n\n@pytest.fixture(scope='session')\ndef engine_runs():\n"
        "    with open(os.environ['LANE_RECORD'], 'a') as f:\n"
        "        f.write(f\"{os.environ.get('PYTEST_XDIST_WORKER', '-')} made-engine-runs\\n\")\n")
    for name in ("test_h_engine", "test_i_engine"):
        (engine / f"{name}.py").write_text(RECORDING + "".join(
            f"\ndef test_{name[5]}{i}(engine_runs):\n    record('{name[5]}{i}')\n" for i in range(2)))
    # a summary line written in a worker, from a folder whose conftest the controller never loads
    (suite / "nested").mkdir()
    shutil.copy(ROOT / "tests/report_lines.py", suite / "nested" / "report_lines.py")
    (suite / "nested" / "conftest.py").write_text("")
    (suite / "nested" / "test_f_lines.py").write_text(
        "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\n"
        "from report_lines import ReportLines\n\n"
        "def test_writes_a_summary_line():\n    ReportLines('nested section').append('a line from a lane')\n")
    proc, ran = in_three_lanes(tmp_path)
    first = [(w, n) for w, n in ran if n in ("d1", "d2", "d5")]
    second = [(w, n) for w, n in ran if n in ("d3", "d4", "d6")]
    plain = [(w, n) for w, n in ran if n[0] in "pqg"]  # y0 and z0 aside
    shared = [(w, n) for w, n in ran if n[0] in "hi" or n == "made-engine-runs"]
    assert [n for _, n in first] == ["d1", "d2", "d5"] and [n for _, n in second] == ["d3", "d4", "d6"], ran  # in order
    (first_lane,), (second_lane,) = {w for w, _ in first}, {w for w, _ in second}
    assert first_lane != second_lane, ran
    for lane, unit in ((first_lane, first), (second_lane, second)):
        assert next(n for w, n in ran if w == lane) == unit[0][1], ran  # handed out first
        assert lane not in {w for w, _ in plain[:2]}, ran  # beside the others, not after them
    assert len({w for w, _ in plain}) >= 2, ran  # the plain files spread over the free lanes
    assert len({w for w, _ in shared}) == 1 and [n for _, n in shared].count("made-engine-runs") == 1, ran
    (engine_lane,) = {w for w, n in ran if n == "y0"}
    assert next(n for w, n in ran if w == engine_lane) == "y0", ran  # the first its lane ran
    (long_lane,) = {w for w, n in ran if n == "z0"}
    assert [n for _, n in ran if n[0] in "pqgz"][0] == "z0", ran  # before the short files
    assert [n for _, n in ran].index("y0") < [n for _, n in ran].index("z0"), ran  # the engine's unit first
    lanes = proc.stdout.split("time per lane", 1)[1].split("\n=", 1)[0].splitlines()[1:]
    assert sorted(line.split()[1] for line in lanes) == sorted({w for w, _ in ran}), proc.stdout[-2000:]
    assert [line for line in lanes if "(Docker tests " in line] == \
        [line for line in lanes if line.split()[1] in (first_lane, second_lane)], proc.stdout[-2000:]
    assert "skipped: 1 (1 x [skip: for the count])" in proc.stdout, proc.stdout[-2000:]
    assert " nested section =" in proc.stdout and "\na line from a lane\n" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("marker", ['docker(unit="third")', 'docker("second")', 'docker(unit="second", lane=2)'])
def test_a_docker_marker_naming_no_unit_stops_the_session_at_collection(tmp_path, marker):
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text((ROOT / "pytest.ini").read_text().replace("testpaths =", "# testpaths ="))
    (tmp_path / "test_marked.py").write_text(f"import pytest\n\n@pytest.mark.{marker}\ndef test_x():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "CI", "PYTEST_XDIST_WORKER")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_marked.py"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "test_marked.py::test_x: the docker marker takes only unit= one of first, second" in proc.stderr, \
        proc.stderr[-2000:]


def test_a_line_of_progress_while_the_lanes_collect(tmp_path):
    """pytest-xdist prints nothing between starting its workers and their item count: the controller
    says how long collection has taken every COLLECT_LINE_EVERY_S seconds, and stops once every lane
    has collected."""
    conftest = (ROOT / "conftest.py").read_text()
    assert "COLLECT_LINE_EVERY_S = 15.0" in conftest
    (tmp_path / "conftest.py").write_text(conftest.replace("COLLECT_LINE_EVERY_S = 15.0", "COLLECT_LINE_EVERY_S = 0.5"))
    (tmp_path / "pytest.ini").write_text((ROOT / "pytest.ini").read_text().replace("testpaths =", "# testpaths ="))
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_slow_import.py").write_text("import time\ntime.sleep(3)\n\ndef test_one():\n    time.sleep(2)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "CI", "PYTEST_XDIST_WORKER")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           str(suite)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    progress = [i for i, line in enumerate(lines) if line.startswith("collecting: ")]
    (items,) = [i for i, line in enumerate(lines) if line.startswith("2 workers [")]
    assert len(progress) >= 3, proc.stdout
    assert max(progress) < items, f"a progress line after collection ended:\n{proc.stdout}"


def test_each_docker_unit_starts_with_its_lead_file(tmp_path):
    """DOCKER_LEADS: the files a Docker unit starts with, in every worker's collection alike (the
    first unit's lead makes the CPU vLLM image at once, the second's needs only the Debian base)."""
    conftest = (ROOT / "conftest.py").read_text()
    real = ('DOCKER_LEADS = ("tests/test_docker_engine_prune.py", "tests/test_engine_integration.py", '
            '"tests/test_therock_docker.py")')
    assert real in conftest
    (tmp_path / "conftest.py").write_text(conftest.replace(real, 'DOCKER_LEADS = ("suite/test_e_docker.py", '
                                                                 '"suite/test_z_docker.py")'))
    (tmp_path / "pytest.ini").write_text((ROOT / "pytest.ini").read_text().replace("testpaths =", "# testpaths ="))
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_a_docker.py").write_text(module(True, ["d1", "d2"]))
    (suite / "test_b_plain.py").write_text(module(False, ["p0", "p1"]))
    (suite / "test_c_docker.py").write_text(module('docker(unit="second")', ["d3"]))
    (suite / "test_e_docker.py").write_text(module(True, ["d5"]))
    (suite / "test_z_docker.py").write_text(module('docker(unit="second")', ["d9"]))
    proc, ran = in_three_lanes(tmp_path)
    assert [n for _, n in ran if n in ("d1", "d2", "d5")] == ["d5", "d1", "d2"], ran
    assert [n for _, n in ran if n in ("d3", "d9")] == ["d9", "d3"], ran


def test_the_docker_leads_are_docker_files_one_of_each_unit():
    """The real DOCKER_LEADS name files that exist and hold Docker tests, and each unit has one."""
    import ast  # noqa: PLC0415

    tree = ast.parse((ROOT / "conftest.py").read_text())
    (leads,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["DOCKER_LEADS"]]
    units = []
    for path in leads:
        text = (ROOT / path).read_text()
        assert "pytest.mark.docker" in text, path
        units.append("second" if 'pytestmark = pytest.mark.docker(unit="second")' in text else "first")
    assert set(units) == {"first", "second"}, dict(zip(leads, units))  # each unit starts with a lead
