"""Repository-wide test policy: under CI a skip is a failure, unless the test needs
something no CI machine has.

The repository installs everything its tests need on a CI machine (a Docker engine with
buildx and compose through `.ci/run`, hadolint and BuildKit's Dockerfile parser through
`ci/test.sh`). So when `CI` is set, a test that would skip for want of one of them fails
with the same reason. Allowed to skip under CI:

* tests marked `gpu`: they need an AMD GPU with AITER;
* tests marked `image`: they need the image manifest (they run inside the built image).

The terminal summary ends with one line saying what skipped and why.

Time: the run prints its slowest tests (pytest.ini: --durations) and the time spent per test
folder, and fails when the whole session takes longer than PYTEST_TIME_BUDGET seconds (default
1500, 25 minutes: whole sessions on the 2-core machine take about 1,000-1,170 s, cold or with their
environments kept; CI stops a run at 90; 0 turns
the budget off), so growth shows up as one named failure long before CI's limit, not as a run that never
lands.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

ALLOWED_SKIP_MARKERS = ("gpu", "image")
_SKIPS: Counter[str] = Counter()
REPORTS_ENV = "ROCM_VLLM_TEST_REPORTS"  # tests/report_lines.py
TIME_BUDGET_ENV = "PYTEST_TIME_BUDGET"
DEFAULT_TIME_BUDGET_S = 1500
_STARTED: list[float] = []
_AREA_SECONDS: Counter[str] = Counter()
_LANE_SECONDS: Counter[str] = Counter()
_DOCKER_SECONDS: Counter[str] = Counter()
_LANE_ATTR = "rocm_vllm_lane"


def time_budget(env=os.environ) -> float:
    """The session's time budget in seconds (0: none); a bad value stops the run naming it."""
    raw = env.get(TIME_BUDGET_ENV, "").strip() or str(DEFAULT_TIME_BUDGET_S)
    if not (raw.isascii() and raw.isdigit()):
        raise pytest.UsageError(f"{TIME_BUDGET_ENV}={raw!r} is not a whole number of seconds (0: no budget)")
    return float(raw)


def area_of(nodeid: str) -> str:
    """The folder a test lives in (backend/tests/engine, tests, ...), for the time per area."""
    return nodeid.split("::", 1)[0].rsplit("/", 1)[0] if "/" in nodeid else "."


def pytest_configure(config) -> None:
    """The folder the tests' summary lines go through (tests/report_lines.py), made by the
    controlling process before any lane starts, so that every worker writes to it."""
    if hasattr(config, "workerinput") or os.environ.get(REPORTS_ENV):
        return
    config._reports_dir = tempfile.mkdtemp(prefix="rocm-vllm-test-reports-")
    os.environ[REPORTS_ENV] = config._reports_dir


def pytest_unconfigure(config) -> None:
    folder = getattr(config, "_reports_dir", None)
    if folder:
        os.environ.pop(REPORTS_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


def pytest_sessionstart(session) -> None:
    time_budget()  # a bad setting stops here, before any test
    _STARTED.append(time.monotonic())
    if session.config.pluginmanager.hasplugin("dsession"):  # the lanes' controller (pytest-xdist)
        _COLLECTING.start(session.config)


class _CollectionProgress:
    """A line every COLLECT_LINE_EVERY_S seconds while the lanes collect: pytest-xdist's controller
    prints nothing between starting its workers and their item count (each lane imports every test
    module: about 20 s alone, a minute or more on a busy 2-core machine)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lanes: set[str] = set()
        self._total = 1

    def start(self, config) -> None:
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is None:
            return
        lanes = getattr(config.option, "numprocesses", None)
        self._total = lanes if isinstance(lanes, int) and lanes > 0 else 1
        started = time.monotonic()

        def tell() -> None:
            while not self._done.wait(COLLECT_LINE_EVERY_S):
                reporter.write_line(f"collecting: {time.monotonic() - started:.0f}s, "
                                    f"{len(self._lanes)} lane(s) done")

        threading.Thread(target=tell, name="collection-progress", daemon=True).start()

    def lane_collected(self, lane: str) -> None:
        self._lanes.add(lane)
        if len(self._lanes) >= self._total:
            self._done.set()

    def stop(self) -> None:
        self._done.set()


COLLECT_LINE_EVERY_S = 15.0
_COLLECTING = _CollectionProgress()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    _COLLECTING.lane_collected(node.gateway.id)


def pytest_sessionfinish(session, exitstatus) -> None:
    _COLLECTING.stop()
    if hasattr(session.config, "workerinput"):  # a lane's worker: the controller judges the session
        return
    budget = time_budget()
    if _STARTED and budget and time.monotonic() - _STARTED[0] > budget and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    # the lane (the worker that ran it, and whether it was a Docker unit): a plain attribute of
    # the report travels with it from a lane's worker to the controller, which counts the time per
    # lane (kept out of user_properties, which JUnit files would carry)
    worker = getattr(item.config, "workerinput", {}).get("workerid", "main")  # not the environment: a
    # session started by a test inherits its worker's PYTEST_XDIST_WORKER
    setattr(report, _LANE_ATTR, (worker, docker_unit(item) is not None))
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    allowed = next((m for m in ALLOWED_SKIP_MARKERS if item.get_closest_marker(m)), None)
    if under_ci() and allowed is None:
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI, but the repository installs what this test needs "
                           f"(.ci/run, ci/test.sh): {_skip_reason(report)}")


def pytest_runtest_logreport(report) -> None:
    """Counted where reports arrive (the controller, when the run is split into lanes)."""
    _AREA_SECONDS[area_of(report.nodeid)] += report.duration
    worker, docker = getattr(report, _LANE_ATTR, ("main", False))
    _LANE_SECONDS[worker] += report.duration
    if docker:
        _DOCKER_SECONDS[worker] += report.duration
    if report.skipped and not hasattr(report, "wasxfail"):
        allowed = next((m for m in ALLOWED_SKIP_MARKERS if m in report.keywords), None)
        _SKIPS[f"{allowed or 'skip'}: {_skip_reason(report)}"] += 1


# ------------------------------------------------------------------------------------ lanes
# ci/test.sh runs the suite in several processes at once (pytest-xdist, -n N --dist loadgroup; N is
# TEST_LANES, default 3 on the 2-core CI machine: while one lane waits on a build, a server or a
# time limit, the others use the cores). Work goes out in units, each to one worker whole, in
# collection order within it:
# * the Docker tests (marked docker) are two units of about equal time, handed out first, each to a
#   worker of its own: the tests of one file share its images and servers, and a file joins the
#   second unit with `docker(unit="second")`. Both units use one engine: what they make first (the
#   Debian base, the CPU vLLM image) is made under a lock, and no Docker test changes what the other
#   unit uses (the engine's prune is tested on an engine of its own);
# * tests that use a costly session fixture of their folder (SHARED_SESSION_FIXTURES) are one unit,
#   so that one worker makes it once;
# * every other test file is a unit of its own, handed to whichever worker is free next; units with a
#   test that takes minutes (marked engine, then long) before the others, so that no lane ends the
#   session on one.
# Each worker names each test's unit in a file of the reports folder; the controller's scheduler
# reads them. (xdist's own loadgroup reads groups from test ids, which pytest 9 no longer lets a
# plugin change.) Without xdist nothing changes.
_LANE_FILE = "lanes-units-{worker}.txt"
DOCKER_UNIT = "docker"
DOCKER_UNITS = ("first", "second")
# Session fixtures that start something costly (engine_runs: vLLM engines on CPU, one process per
# backend serving every declared run): every test that uses one shares the worker that made it.
SHARED_SESSION_FIXTURES = ("engine_runs",)


# The files each Docker unit starts with (in this order, the rest of a unit in collection order): both
# units need the Debian base (built once, under a lock) and most of their tests the CPU vLLM image
# (likewise). The first unit builds that image at once (the integration test's first fixture), while
# the second starts with tests that need only the Debian base (TheRock's stand-in builds) instead of
# waiting for the image with a core idle (about 60 s of a cold run's first minutes). The prune test goes
# before the integration test: it starts and stops an engine of its own (seconds), and its dockerd took
# more than 60 s to stop when it ran later, beside the other lane's builds and servers (3 s alone).
DOCKER_LEADS = ("tests/test_docker_engine_prune.py", "tests/test_engine_integration.py", "tests/test_therock_docker.py")


def docker_unit(item: pytest.Item) -> str | None:
    """The Docker unit of a test marked docker (`docker` or `docker(unit="second")`), else None."""
    marker = item.get_closest_marker("docker")
    if marker is None:
        return None
    unit = marker.kwargs.get("unit", DOCKER_UNITS[0])
    if unit not in DOCKER_UNITS or marker.args or set(marker.kwargs) - {"unit"}:
        raise pytest.UsageError(f"{item.nodeid}: the docker marker takes only unit= one of {', '.join(DOCKER_UNITS)} "
                                f"(got {marker.args} {marker.kwargs})")
    return f"{DOCKER_UNIT} {unit}"


def unit_of(item: pytest.Item) -> str:
    """The unit of work a test belongs to (see above)."""
    if docker := docker_unit(item):
        return docker
    shared = [name for name in SHARED_SESSION_FIXTURES if name in getattr(item, "fixturenames", ())]
    return f"session fixture {shared[0]}" if shared else item.nodeid.split("::", 1)[0]


def is_docker_unit(unit: str) -> bool:
    return unit in {f"{DOCKER_UNIT} {name}" for name in DOCKER_UNITS}


# Markers of a test that takes minutes, in the order their units are handed out: the engine tests' units
# (CPU all along) before the other long ones (which wait on the network or on time limits in part), so
# that a lane free while the Docker lanes download their first images has CPU work to do.
LONG_MARKERS = ("engine", "long")


def long_rank(item: pytest.Item) -> int:
    """0 for a short test, else how early its unit goes out: len(LONG_MARKERS) for the first marker."""
    return next((len(LONG_MARKERS) - n for n, m in enumerate(LONG_MARKERS) if item.get_closest_marker(m)), 0)


def _units() -> tuple[dict[str, str], dict[str, int]]:
    """Each test's unit, and the units that hold a long test with their rank (as the workers wrote them)."""
    folder = Path(os.environ[REPORTS_ENV])
    units, long = {}, {}
    for path in folder.glob(_LANE_FILE.format(worker="*")):
        for line in path.read_text().splitlines():
            nodeid, unit, flag = line.rsplit("\t", 2)  # the last two fields: a test id may hold a tab
            units[nodeid] = unit
            if rank := int(flag):
                long[unit] = max(long.get(unit, 0), rank)
    return units, long


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:  # a docker marker with another unit or other arguments stops the session here
        docker_unit(item)
    # every worker the same order (xdist compares them): the leads first, the others as collected
    lead = {path: n for n, path in enumerate(DOCKER_LEADS)}
    items.sort(key=lambda item: lead.get(item.nodeid.split("::", 1)[0], len(lead)))
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker and os.environ.get(REPORTS_ENV):
        lines = "".join(f"{item.nodeid}\t{unit_of(item)}\t{long_rank(item)}\n" for item in items)
        (Path(os.environ[REPORTS_ENV]) / _LANE_FILE.format(worker=worker)).write_text(lines)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 - only with xdist

    class LaneScheduling(LoadScopeScheduling):
        """Units of work (unit_of), each to one worker whole; the Docker units first."""

        _units: dict[str, str] | None = None
        _long: dict[str, int] = {}

        def _split_scope(self, nodeid: str) -> str:
            if self._units is None:  # read once, after every worker has collected
                self._units, self._long = _units()
            return self._units.get(nodeid, nodeid.split("::", 1)[0])

        def _assign_work_unit(self, node) -> None:
            # the longest chains of the session (the Docker units) first, then the units with a long test
            # (LONG_MARKERS' order; in collection order within a rank)
            long = [unit for unit in self.workqueue if unit in self._long]
            first = next((unit for unit in self.workqueue if is_docker_unit(unit)), None) or (
                max(long, key=lambda unit: self._long[unit]) if long else None)
            if first is not None:
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return LaneScheduling(config, log)


def _report_sections() -> list[tuple[str, list[str]]]:
    """The tests' summary sections (tests/report_lines.py: one file each, named after its title)."""
    folder = os.environ.get(REPORTS_ENV)
    if not folder or not Path(folder).is_dir():
        return []
    return [(p.stem, p.read_text().splitlines()) for p in sorted(Path(folder).glob("*.txt"))
            if not p.name.startswith("lanes-")]


def pytest_terminal_summary(terminalreporter) -> None:
    # Printed here, by the root conftest, which the controlling process always loads (a lane's
    # tests, and the conftest files beside them, are loaded by the workers only).
    for title, lines in _report_sections():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
    if not _SKIPS:
        line = "skipped: none"
    else:
        parts = [f"{n} x [{reason}]" for reason, n in sorted(_SKIPS.items(), key=lambda kv: (-kv[1], kv[0]))]
        line = f"skipped: {sum(_SKIPS.values())} ({'; '.join(parts)})"
    if _AREA_SECONDS:
        terminalreporter.section("time per test folder (summed over lanes)")
        for area, seconds in sorted(_AREA_SECONDS.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{seconds:8.1f}s  {area}")
        # the session's wall time is about its longest lane: the one to make faster
        terminalreporter.section("time per lane (the worker that ran the Docker tests says how long they took)")
        for lane, seconds in sorted(_LANE_SECONDS.items(), key=lambda kv: -kv[1]):
            docker = f" (Docker tests {_DOCKER_SECONDS[lane]:.1f}s)" if _DOCKER_SECONDS.get(lane) else ""
            terminalreporter.write_line(f"{seconds:8.1f}s  {lane}{docker}")
    if _STARTED:
        took, budget = time.monotonic() - _STARTED[0], time_budget()
        terminalreporter.section("time budget")
        if budget and took > budget:
            terminalreporter.write_line(
                f"FAILED: the session took {took:.0f}s, over its budget of {budget:.0f}s ({TIME_BUDGET_ENV}): "
                "make the slowest tests above faster, or share their images and servers")
        else:
            terminalreporter.write_line(f"the session took {took:.0f}s of its {budget:.0f}s budget ({TIME_BUDGET_ENV})"
                                        if budget else f"the session took {took:.0f}s (no budget: {TIME_BUDGET_ENV}=0)")
    terminalreporter.section("skips")
    terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def ci_dir() -> Path:
    """The repository's ci/ folder (the CI pipeline's scripts), for tests that run its files."""
    return Path(__file__).resolve().parent / "ci"


@pytest.fixture(scope="session")
def runtime_dir() -> Path:
    """The repository's runtime/ folder (the image's entrypoint, selftest command, runtime package and
    self-test suites)."""
    return Path(__file__).resolve().parent / "runtime"
