"""`selftest [selector|smoke|bench|accuracy|all] [--json PATH] [--junit PATH] [-- PYTEST_ARGS...]`

Runs the pytest suites under the suites directory (env SELFTEST_SUITES, default
/opt/rocm-vllm/suites, where the image keeps them), then prints each check with its outcome, the
installed versions and the GPU archs found, and writes the same as JSON
(--json) and JUnit XML (--junit, pytest's own). Exit status: 0 every suite
passed; 1 a check failed; 2 a suite could not run (its files are missing, or e.g.
`smoke` on a machine without an AMD GPU: a skipped GPU check is not a pass), or
an output path (--json, --junit) cannot be written: that is checked before any
suite runs.

Suites:
  selector  backend selection rules against the installed vLLM, plugin, image manifest (no GPU)
  smoke     AITER kernels against the reference, vLLM on the tiny MLA model (AMD GPU)
  bench     serving benchmark, this backend vs vLLM's AITER MLA vs TRITON_MLA (AMD GPU)
  accuracy  lm-eval on the same questions per backend, paired gate and log-likelihoods (AMD GPU;
            task data from ACCURACY_DATA: missing data is one line and exit 1)
  all       selector, smoke and bench (accuracy needs its data mounted: run it by name)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rocm_vllm_runtime import children, files, report
from rocm_vllm_runtime.guard import find_gpus, run_tool
from rocm_vllm_runtime.secret_values import shown
from rocm_vllm_runtime.versions import stack_versions

SUITES: dict[str, tuple[tuple[str, ...], bool]] = {  # name: (test files, needs an AMD GPU)
    "selector": (("test_selector.py",), False), "smoke": (("test_smoke.py",), True),
    "bench": (("test_bench.py",), True), "accuracy": (("test_accuracy.py",), True),
}
ORDER = ("selector", "smoke", "bench", "accuracy")
# `all`: every suite that needs nothing mounted; accuracy needs its task data and a model, so it runs by name.
ALL = ("selector", "smoke", "bench")
# Suite -> the file it writes next to the --json report (embedded there under the suite's name).
ARTIFACTS = {"bench": "bench.json", "accuracy": "accuracy.json"}
# Where the image keeps the suites (Dockerfile.rocm, app-files).
IMAGE_SUITES = "/opt/rocm-vllm/suites"


def suites_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where the suites are: SELFTEST_SUITES, else where the image keeps them."""
    return Path(env.get("SELFTEST_SUITES") or IMAGE_SUITES)


def run_suite(name: str, directory: Path, pytest_args: Sequence[str],
              workdir: Path) -> tuple[report.SuiteResult, str]:
    suite_files, needs_gpu = SUITES[name]
    present = [str(directory / f) for f in suite_files if (directory / f).is_file()]
    missing = [f for f in suite_files if not (directory / f).is_file()]
    if not present:
        return report.SuiteResult(name, report.NOT_RUN,
                                  f"suite files missing in {directory}: {', '.join(missing)} "
                                  "(set SELFTEST_SUITES)"), ""
    problem = preflight(name)
    if problem:
        print(f"selftest: error: {problem}", file=sys.stderr, flush=True)
        check = report.Check(f"{name}::preflight", "failed", problem)
        return report.SuiteResult(name, report.FAILED, problem, [check]), report.junit_of(name, [check])
    junit = files.inside(workdir, f"{name}.xml", "a suite's name")
    # -p rocm_vllm_runtime.children: a signal stops what the suite started too (its servers)
    command = [sys.executable, "-m", "pytest", *present, "-p", "no:cacheprovider", "-p", "rocm_vllm_runtime.children",
               "-rA", f"--junitxml={junit}", "-o", "junit_family=xunit2",
               "-o", f"junit_suite_name={name}", *pytest_args]
    print(f"\n== selftest {name}: {shown(command[1:])}", flush=True)
    rc = children.run(command)
    xml_text = junit.read_text() if junit.is_file() else ""
    try:
        checks = report.parse_junit(xml_text) if xml_text else []
    except report.ET.ParseError as exc:  # a suite killed while writing its report
        return report.SuiteResult(name, report.FAILED, f"its JUnit report is truncated or not XML ({exc}): "
                                  "see the output above"), ""
    result = report.judge(name, checks, needs_gpu, rc)
    if missing and result.status != report.FAILED:
        result.status = report.NOT_RUN
        result.reason = f"suite files missing in {directory}: {', '.join(missing)}"
    return result, xml_text


def preflight(name: str) -> str:
    """'' when suite `name` can start, else the one line that says what is missing (a failed suite)."""
    if name == "accuracy":
        from rocm_vllm_runtime import accuracy  # noqa: PLC0415

        return accuracy.data_problem(os.environ)
    return ""


def _artifact(name: str, results_dir: str | None = None) -> Path:
    return Path(results_dir or os.environ.get("SELFTEST_RESULTS_DIR") or ".") / ARTIFACTS[name]


def artifact_problem(names: Sequence[str], outputs: dict[str, str | None]) -> str:
    """'' unless an output names the file a suite of this run writes itself (bench.json of the bench
    suite, beside --json unless SELFTEST_RESULTS_DIR is set): the summary would replace it."""
    results_dir = os.environ.get("SELFTEST_RESULTS_DIR") or (
        str(Path(outputs["--json"]).resolve().parent) if outputs.get("--json") else None)
    for name in names:
        if name not in ARTIFACTS:
            continue
        own = files.target_of(_artifact(name, results_dir))
        for option, path in outputs.items():
            if path and files.target_of(path) == own:
                return (f"{option} {path} is the file the {name} suite writes its own results to: give "
                        f"{option} another name")
    return ""


def detect_gpus() -> tuple[list[dict[str, object]], str]:
    gpus, tool, _ = find_gpus([run_tool(["amd-smi", "static", "--asic"]), run_tool(["rocminfo"])])
    return [{"index": g.index, "target": g.target, "name": g.name} for g in gpus], tool


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="selftest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", nargs="?", default="all", choices=(*ORDER, "all"))
    parser.add_argument("--json", metavar="PATH", help="write the summary as JSON")
    parser.add_argument("--junit", metavar="PATH", help="write pytest's JUnit XML")
    parser.epilog = "Arguments after -- go to pytest (e.g. selftest smoke --json r.json -- -x)."
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first -- is pytest's, wherever the options stand (argparse alone
    # refuses `SUITE --json X -- ARGS`).
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)

    outputs = {"--json": args.json, "--junit": args.junit}
    names = ALL if args.suite == "all" else (args.suite,)
    problem = files.outputs_problem(outputs) or artifact_problem(names, outputs)
    if problem:
        print(f"selftest: error: {problem}", file=sys.stderr, flush=True)
        return report.EXIT_NOT_RUN
    children.forward_signals()
    directory = suites_dir()
    if args.json and not os.environ.get("SELFTEST_RESULTS_DIR"):
        # suites that write artifacts (bench) put them next to the summary
        os.environ["SELFTEST_RESULTS_DIR"] = str(Path(args.json).resolve().parent)
    # Only this run's artifacts are reported; files already there (an earlier run's, or a user's
    # file of that name) are left as they are: what the suites do not rewrite is not embedded.
    before = {name: files.stamp(_artifact(name)) for name in names if name in ARTIFACTS}
    with files.scratch("selftest-") as tmp:
        ran = [run_suite(name, directory, pytest_args, tmp) for name in names]
    results, xml_texts = [result for result, _ in ran], [xml_text for _, xml_text in ran if xml_text]

    gpus, source = detect_gpus()
    extra: dict[str, object] = {}
    for name, stamp in before.items():  # bench.json, accuracy.json: embedded in the report
        artifact = _artifact(name)
        if artifact.is_file() and files.stamp(artifact) != stamp:
            try:
                extra[name] = files.read_json(artifact)
            except (ValueError, OSError) as exc:  # the other results are still written
                extra[name] = {"error": f"{artifact} is truncated or not JSON ({exc.__class__.__name__})"}
    doc = report.to_json(results, stack_versions(), gpus, source, extra)
    print(report.render(doc), flush=True)
    written = True  # each output is attempted, whatever became of the other
    if args.json:
        written &= files.write_result("selftest", "--json", args.json, json.dumps(doc, indent=2) + "\n")
    if args.junit:
        junit = xml_texts[0] if len(xml_texts) == 1 else report.merge_junit(xml_texts)
        written &= files.write_result("selftest", "--junit", args.junit, junit)
    return int(doc["exit_code"]) if written else report.EXIT_NOT_RUN  # type: ignore[call-overload]


if __name__ == "__main__":
    sys.exit(main())
