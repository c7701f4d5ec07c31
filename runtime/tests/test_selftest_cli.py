"""The `selftest` CLI on stand-in suites: exit codes, summary, JSON and JUnit files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PASSING = "def test_ok():\n    assert True\n"
FAILING = "def test_ok():\n    assert True\n\ndef test_bad():\n    assert 1 == 2\n"
GPU_SKIP = ("import pytest\n\ndef test_kernel():\n"
            "    pytest.skip('no /dev/kfd: no AMD GPU in this container')\n")


def run(suites: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SELFTEST_SUITES=str(suites),
               PATH="/usr/bin:/bin")  # no amd-smi / rocminfo
    return subprocess.run([sys.executable, "-m", "rocm_vllm_runtime", *args], cwd=suites, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def suites(tmp_path: Path) -> Path:
    d = tmp_path / "suites"
    d.mkdir()
    (d / "test_selector.py").write_text(PASSING)
    (d / "test_smoke.py").write_text(GPU_SKIP)
    (d / "test_bench.py").write_text(GPU_SKIP)
    return d


def test_selector_passes_and_writes_json_and_junit(suites: Path, tmp_path: Path) -> None:
    proc = run(suites, "selector", "--json", str(tmp_path / "out/r.json"),
               "--junit", str(tmp_path / "out/r.xml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "out/r.json").read_text())
    assert doc["result"] == "passed" and doc["suites"][0]["counts"] == {"passed": 1}
    assert set(doc["versions"]) == {"vllm", "torch", "aiter", "backend"}
    assert "<testsuite" in (tmp_path / "out/r.xml").read_text()
    assert "[selector] PASSED (1 passed)" in proc.stdout
    assert "GPU archs: none found" in proc.stdout


def test_smoke_without_gpu_exits_non_zero_and_says_why(suites: Path, tmp_path: Path) -> None:
    proc = run(suites, "smoke", "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert "[smoke] NOT RUN" in proc.stdout
    assert "could not run: no /dev/kfd: no AMD GPU in this container" in proc.stdout
    assert json.loads((tmp_path / "r.json").read_text())["result"] == "not run"


def test_failure_exits_one_and_all_merges_junit(suites: Path, tmp_path: Path) -> None:
    (suites / "test_selector.py").write_text(FAILING)
    proc = run(suites, "all", "--junit", str(tmp_path / "all.xml"))
    assert proc.returncode == 1
    assert any(l.strip().startswith("FAIL") and "test_bad" in l for l in proc.stdout.splitlines())
    assert (tmp_path / "all.xml").read_text().count("<testsuite ") == 3


def test_missing_suite_file_could_not_run_and_names_setting(suites: Path) -> None:
    (suites / "test_smoke.py").unlink()
    proc = run(suites, "smoke")
    assert proc.returncode == 2 and "SELFTEST_SUITES" in proc.stdout
    assert "[smoke] NOT RUN" in proc.stdout


@pytest.mark.parametrize("option", ["--json", "--junit"])
def test_unwritable_output_path_stops_before_any_suite(suites: Path, tmp_path: Path,
                                                       option: str) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = blocker / "out" / "r.out"  # below a regular file: never writable, not even by root
    proc = run(suites, "selector", option, str(target))
    assert proc.returncode == 2
    assert "== selftest" not in proc.stdout and "PASSED" not in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and str(target) in lines[0]


def test_output_path_that_is_a_directory_stops_before_any_suite(suites: Path,
                                                                 tmp_path: Path) -> None:
    proc = run(suites, "selector", "--json", str(tmp_path))
    assert proc.returncode == 2 and "== selftest" not in proc.stdout
    assert "--json" in proc.stderr and "Traceback" not in proc.stderr


def test_pytest_args_pass_through(suites: Path) -> None:
    (suites / "test_selector.py").write_text(FAILING)
    proc = run(suites, "selector", "--", "-k", "ok")
    assert proc.returncode == 0, proc.stdout


def test_pytest_args_after_options(suites: Path, tmp_path: Path) -> None:
    """The argv ci/pipeline/amd-runner/selftest.sh builds: suite, options, then -- and pytest's arguments."""
    (suites / "test_selector.py").write_text(FAILING)
    proc = run(suites, "selector", "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"),
               "--", "-k", "ok")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["suites"][0]["counts"] == {"passed": 1}


# The route rows but the first two (each measures its layer's decode calls at start-up, with the reference
# kernel on the CPU: minutes in all) run in this repository's own session (runtime/suites/test_selector.py), on
# every track and in the image (tests/test_engine_integration.py); laid out as in the image, the first two
# show the route's path through the suite's helpers.
LAID_OUT_SELECTION = "not test_each_layer_runs_the_own_path_or_vllms_built_in or bf16-16-heads"


@pytest.mark.long  # the selector suite in a child pytest
def test_real_selector_suite_runs_laid_out_as_in_the_image(runtime_dir: Path, tmp_path: Path) -> None:
    """The repository's suites copied as the image lays them out (/opt/rocm-vllm/suites, no
    pytest.ini above them, no package above them): `selftest selector` imports its helpers and passes."""
    import shutil  # noqa: PLC0415

    suites = tmp_path / "opt/rocm-vllm/suites"
    shutil.copytree(runtime_dir / "suites", suites, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # the tiny model's config as the image holds it, and its TINY_MLA_MODEL (Dockerfile.rocm)
    model = tmp_path / "opt/rocm-vllm/models/tiny-mla"
    model.mkdir(parents=True)
    shutil.copy(runtime_dir / "models/tiny-mla/config.json", model / "config.json")
    # run from elsewhere: `python -m pytest` makes its working directory importable
    env = dict(os.environ, SELFTEST_SUITES=str(suites), PATH="/usr/bin:/bin", TINY_MLA_MODEL=str(model))
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime", "selector", "--", "-k", LAID_OUT_SELECTION],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[selector] PASSED" in proc.stdout and "test_selector::test_decision_table" in proc.stdout
    assert "test_each_layer_runs_the_own_path_or_vllms_built_in[bf16-16-heads]" in proc.stdout


def test_two_outputs_into_one_file_are_refused_before_any_suite(suites: Path, tmp_path: Path) -> None:
    (tmp_path / "target.json").write_text("keep")
    (tmp_path / "link.xml").symlink_to(tmp_path / "target.json")
    for json_path, junit_path in ((tmp_path / "r.out", tmp_path / "r.out"), (tmp_path / "target.json",
                                                                             tmp_path / "link.xml")):
        proc = run(suites, "selector", "--json", str(json_path), "--junit", str(junit_path))
        assert proc.returncode == 2 and "name the same file" in proc.stderr, proc.stderr
        assert "== selftest selector" not in proc.stdout
    assert (tmp_path / "target.json").read_text() == "keep"


def test_results_are_written_through_a_symlink(suites: Path, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real/r.json").write_text("old")
    (tmp_path / "r.json").symlink_to(tmp_path / "real/r.json")
    proc = run(suites, "selector", "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r.json").is_symlink()  # the link stays, its target has the results
    assert json.loads((tmp_path / "real/r.json").read_text())["result"] == "passed"
    assert not [p for p in (tmp_path / "real").iterdir() if p.name.startswith(".")]


BENCH_WRITES = ("import json, os, pathlib\n\ndef test_bench():\n"
                "    out = pathlib.Path(os.environ['SELFTEST_RESULTS_DIR']) / 'bench.json'\n"
                "    out.write_text(os.environ.get('BENCH_TEXT', '{\"runs\": []}'))\n")


def test_a_bench_json_an_earlier_run_left_is_never_reported(suites: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench.json").write_text('{"runs": [{"backend": "stale", "output_throughput": 1e9}]}')
    proc = run(suites, "bench", "--json", str(results / "r.json"))  # bench cannot run (no GPU)
    doc = json.loads((results / "r.json").read_text())
    assert "bench" not in doc and "stale" not in proc.stdout
    # and it is left where it was, as it was (it may be a user's file of that name)
    assert "stale" in (results / "bench.json").read_text()


@pytest.mark.parametrize("suite,artifact", [("bench", "bench.json"), ("accuracy", "accuracy.json")])
def test_a_run_without_json_leaves_a_file_of_its_artifacts_name_alone(suites: Path, suite: str,
                                                                      artifact: str) -> None:
    """`selftest accuracy` / `selftest bench` in a folder holding accuracy.json / bench.json (the
    suite cannot run here): the file is neither deleted nor changed nor reported."""
    (suites / "test_accuracy.py").write_text(GPU_SKIP)
    mine = suites / artifact
    mine.write_text('{"mine": true}\n')
    before = mine.stat()
    proc = run(suites, suite)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert mine.read_text() == '{"mine": true}\n' and mine.stat().st_mtime_ns == before.st_mtime_ns
    assert '"mine"' not in proc.stdout


def test_the_artifact_this_run_writes_is_reported(suites: Path, tmp_path: Path) -> None:
    (suites / "test_bench.py").write_text(BENCH_WRITES)
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench.json").write_text('{"runs": [{"backend": "stale"}]}')
    subprocess.run([sys.executable, "-m", "rocm_vllm_runtime", "bench", "--json", str(results / "r.json")],
                   cwd=suites, capture_output=True, text=True, timeout=300,
                   env=dict(os.environ, SELFTEST_SUITES=str(suites), PATH="/usr/bin:/bin",
                            BENCH_TEXT='{"runs": [{"backend": "fresh"}]}'))
    doc = json.loads((results / "r.json").read_text())
    assert doc["bench"] == {"runs": [{"backend": "fresh"}]}


def test_a_truncated_bench_json_is_reported_as_such_and_the_rest_written(suites: Path,
                                                                        tmp_path: Path) -> None:
    (suites / "test_bench.py").write_text(BENCH_WRITES)
    results = tmp_path / "results"
    env_text = '{"runs": [{"backend": "ROCM_AITER_MLA", "output_th'
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime", "bench", "--json", str(results / "r.json"),
                           "--junit", str(results / "r.xml")], cwd=suites, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, SELFTEST_SUITES=str(suites), PATH="/usr/bin:/bin",
                                                BENCH_TEXT=env_text))
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads((results / "r.json").read_text())
    assert "truncated or not JSON" in doc["bench"]["error"]
    assert "<testsuite" in (results / "r.xml").read_text()


def test_a_truncated_junit_report_fails_its_suite_in_one_line(suites: Path, tmp_path: Path) -> None:
    # a suite whose report is cut short (the process killed while writing it)
    (suites / "conftest.py").write_text(
        "import os\n\ndef pytest_unconfigure(config):\n"
        "    path = config.option.xmlpath\n"
        "    if path and os.path.exists(path):\n"
        "        text = open(path).read()\n"
        "        open(path, 'w').write(text[: len(text) // 2])\n")
    proc = run(suites, "selector", "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["suites"][0]["status"] == "failed" and "truncated" in doc["suites"][0]["reason"]
