"""The GitHub Actions workflows (.github/workflows): actionlint clean, every script they run
exists and is exercised by this repository's tests, secrets reach scripts only through the
environment, and every repository variable and secret they read is documented."""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
TEST_DIRS = (REPO / "tests", REPO / "ci" / "tests")


def actionlint() -> str:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("actionlint", path=path)
    if found is None:
        pytest.skip("actionlint not installed (pip install -r tests/requirements.txt)")
    return found


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    # shellcheck/pyflakes integration off: the result must not depend on what else the machine has
    files = sorted(str(p.relative_to(root)) for p in (root / ".github" / "workflows").glob("*.yml"))
    assert files
    return subprocess.run([actionlint(), "-no-color", "-oneline", "-shellcheck=", "-pyflakes=", *files], cwd=root,
                          capture_output=True, text=True, timeout=120)


def workflows() -> dict[str, dict]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(WORKFLOWS.glob("*.yml"))}


def triggers(doc: dict) -> dict:
    return doc.get("on", doc.get(True))  # YAML 1.1 reads the key `on` as true


def steps(doc: dict):
    for job_name, job in doc["jobs"].items():
        for step in job.get("steps", []):
            yield job_name, step


def test_actionlint_is_clean() -> None:
    proc = lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {"ci.yml", "images.yml", "pins.yml"} <= set(workflows())


def test_actionlint_reports_a_broken_workflow(tmp_path: Path) -> None:
    """The lint really reads these files: a wrong step id in a job output is reported."""
    broken = tmp_path / ".github" / "workflows"
    broken.mkdir(parents=True)
    for path in WORKFLOWS.glob("*.yml"):
        shutil.copy(path, broken / path.name)
    text = (broken / "images.yml").read_text()
    assert "steps.publish.outputs.tag" in text
    (broken / "images.yml").write_text(text.replace("steps.publish.outputs.tag", "steps.publsh.outputs.tag"))
    proc = lint(tmp_path)
    assert proc.returncode == 1
    assert "images.yml" in proc.stdout and "publsh" in proc.stdout, proc.stdout


SCRIPT = re.compile(r"\bbash\s+((?:\.ci|ci)/[\w./-]+)")
MODULE = re.compile(r"\bpython3\s+-m\s+((?:ci|tools)\.\w+)")


def test_every_script_the_workflows_run_exists_and_is_tested() -> None:
    scripts: set[str] = set()
    modules: set[str] = set()
    for doc in workflows().values():
        for _, step in steps(doc):
            scripts.update(SCRIPT.findall(step.get("run", "")))
            modules.update(MODULE.findall(step.get("run", "")))
    assert {"ci/pipeline/amd-runner/publish.sh", "ci/pipeline/amd-runner/selftest.sh",
            "ci/pipeline/amd-runner/login.sh", "ci/pipeline/propose-pins.sh", ".ci/run"} <= scripts
    assert modules == {"ci.pipeline", "tools.pins"}
    tests_text = "\n".join(p.read_text() for d in TEST_DIRS for p in d.glob("test_*.py"))
    for script in sorted(scripts):
        assert (REPO / script).is_file(), f"{script} is run by a workflow but does not exist"
        if script == ".ci/run":
            continue  # the test command itself
        assert script.removeprefix("ci/") in tests_text, f"no test runs {script}"
    for module in modules:
        assert (REPO / module.replace(".", "/") / "__main__.py").is_file()
        assert f'"-m", "{module}"' in tests_text, f"no test runs python3 -m {module}"


def test_secrets_reach_scripts_only_through_the_environment() -> None:
    for name, doc in workflows().items():
        for job_name, step in steps(doc):
            assert "secrets." not in step.get("run", ""), f"{name} {job_name}: a secret inside a run script"
    for script in ("ci/pipeline/amd-runner/login.sh", "ci/pipeline/amd-runner/publish.sh",
                   "ci/pipeline/amd-runner/build.sh", "ci/pipeline/amd-runner/selftest.sh",
                   "ci/pipeline/propose-pins.sh"):
        text = (REPO / script).read_text()
        assert not re.search(r"set\s+-\w*x|xtrace", text), f"{script} traces commands"


def test_jobs_do_what_the_readme_says() -> None:
    docs = workflows()
    ci, images, pins = docs["ci.yml"], docs["images.yml"], docs["pins.yml"]
    on = triggers(ci)
    assert "pull_request" in on and on["push"]["branches"] == ["main"] and on["push"]["tags"]
    assert "pull_request" in ci["jobs"]["tests"]["if"]
    assert [s["run"] for _, s in steps({"jobs": {"tests": ci["jobs"]["tests"]}}) if "run" in s] == ["bash .ci/run"]
    assert ci["jobs"]["images"]["uses"] == "./.github/workflows/images.yml"
    assert "pull_request" in ci["jobs"]["images"]["if"]

    build, selftest = images["jobs"]["build"], images["jobs"]["selftest"]
    assert selftest["needs"] == "build"
    runs = [s.get("run", "") for s in selftest["steps"]]
    assert any("ci/pipeline/amd-runner/selftest.sh" in r for r in runs)
    assert any("python3 -m ci.pipeline summary" in r and "GITHUB_STEP_SUMMARY" in r for r in runs)
    uploads = {s["with"]["path"] for s in selftest["steps"] if s.get("uses", "").startswith("actions/upload-artifact")}
    assert "selftest-results/bench.json" in uploads
    report = next(s for s in selftest["steps"] if s.get("uses", "").startswith("mikepenz/action-junit-report"))
    assert report["with"]["report_paths"] == f"{selftest['env']['RESULTS_DIR']}/selftest.xml"
    assert any("ci/pipeline/amd-runner/publish.sh" in s.get("run", "") for s in build["steps"])

    assert "schedule" in triggers(pins)
    assert pins["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert [s["run"] for _, s in steps(pins) if "run" in s] == [f"{UV_RUN} bash ci/pipeline/propose-pins.sh"]


# How a workflow runs the pin tool, or a script that runs it: under uv, in the tools' environment that uv
# makes from tools/uv.lock (the pin tool makes none of its own; a runner's python3 lacks its libraries).
UV_RUN = "uv run --locked --project tools"
RUNS_THE_PIN_TOOL = re.compile(r"python3 -m tools\.pins|ci/pipeline/amd-runner/publish\.sh"
                               r"|ci/pipeline/propose-pins\.sh")


def pin_tool_steps_outside_uv(docs: dict[str, dict]) -> list[str]:
    """Each step that runs the pin tool without uv, or in a job with no setup-uv step before it."""
    out = []
    for name, doc in docs.items():
        for job_name, job in doc["jobs"].items():
            have_uv = False
            for step in job.get("steps", []):
                have_uv = have_uv or step.get("uses", "").startswith("astral-sh/setup-uv@")
                for line in step.get("run", "").splitlines():
                    if RUNS_THE_PIN_TOOL.search(line) and not (have_uv and f"{UV_RUN} " in line):
                        out.append(f"{name} {job_name}: {line.strip()}")
    return out


def test_workflows_run_the_pin_tool_under_uv() -> None:
    docs = workflows()
    assert pin_tool_steps_outside_uv(docs) == []
    assert {n for n, doc in docs.items() for _, s in steps(doc) if RUNS_THE_PIN_TOOL.search(s.get("run", ""))} \
        == {"ci.yml", "images.yml", "pins.yml"}
    bare = {"jobs": {"j": {"steps": [{"run": "python3 -m tools.pins tracks --json"}]}}}
    assert pin_tool_steps_outside_uv({"x.yml": bare}) == ["x.yml j: python3 -m tools.pins tracks --json"]
    no_setup = {"jobs": {"j": {"steps": [{"run": f"{UV_RUN} bash ci/pipeline/propose-pins.sh"}]}}}
    assert len(pin_tool_steps_outside_uv({"x.yml": no_setup})) == 1
    # another project's folder under tools/ is not the tools' project
    elsewhere = {"jobs": {"j": {"steps": [{"uses": "astral-sh/setup-uv@v7"},
                                          {"run": f"{UV_RUN}/pins python3 -m tools.pins tracks --json"}]}}}
    assert len(pin_tool_steps_outside_uv({"x.yml": elsewhere})) == 1


def test_every_variable_secret_and_input_is_documented() -> None:
    section = (REPO / "docs" / "ci.md").read_text()
    text = "\n".join(p.read_text() for p in WORKFLOWS.glob("*.yml"))
    names = set(re.findall(r"\bvars\.(\w+)", text)) | set(re.findall(r"\bsecrets\.([\w-]+)", text))
    names -= {"GITHUB_TOKEN"}
    names |= set(triggers(workflows()["images.yml"])["workflow_call"]["inputs"])
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, f"not documented in docs/ci.md: {missing}"


def test_the_documented_gitlab_wrapper_calls_the_same_scripts() -> None:
    section = (REPO / "docs" / "ci.md").read_text()
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    pipeline = yaml.safe_load(block)
    lines = [l for job in pipeline.values() if isinstance(job, dict)
             for key in ("script", "after_script") for l in job.get(key, [])]
    called = {s for l in lines for s in SCRIPT.findall(l)}
    assert called == {"ci/pipeline/amd-runner/login.sh", "ci/pipeline/amd-runner/publish.sh",
                      "ci/pipeline/amd-runner/selftest.sh"}
    for script in called:
        assert (REPO / script).is_file()
    subcommands = {m for l in lines for m in re.findall(r"python3 -m ci\.pipeline (\w+)", l)}
    assert subcommands == {"summary"}
    # the selftest job's TAG: the file publish.sh writes into the build job's RESULTS_DIR
    build = pipeline["build"]
    assert build["artifacts"]["reports"]["dotenv"] == f"{build['variables']['RESULTS_DIR']}/tag.env"
    assert '"$results/tag.env"' in (REPO / "ci/pipeline/amd-runner/publish.sh").read_text()
    help_text = subprocess.run([sys.executable, "-m", "ci.pipeline", "--help"], cwd=REPO, capture_output=True,
                               text=True, timeout=60).stdout
    assert all(c in help_text for c in subcommands)
    assert pipeline["selftest"]["artifacts"]["reports"]["junit"] == "selftest-results/selftest.xml"


def test_build_and_selftest_name_the_same_registry() -> None:
    """Both jobs compute the registry the same way (not passed as a job output, which GitHub
    drops when it contains a secret's value)."""
    jobs = workflows()["images.yml"]["jobs"]
    computed = []
    for name in ("build", "selftest"):
        step = next(s for s in jobs[name]["steps"] if s.get("name") == "Registry")
        computed.append([l for l in step["run"].splitlines() if "REGISTRY" in l])
        assert jobs[name]["env"]["REGISTRY_INPUT"] == "${{ inputs.registry }}"
    assert computed[0] == computed[1] and len(computed[0]) == 2
    assert "image-prefix" not in str(jobs["selftest"])


# ------------------------------------------------------------------ Dependabot

DEPENDABOT = REPO / ".github" / "dependabot.yml"
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
INTERVALS = {"daily", "weekly", "monthly", "quarterly", "semiannually", "yearly", "cron"}


def action_dirs(root: Path) -> set[str]:
    """Where Dependabot's github-actions ecosystem must look: for a `.github/workflows` folder the
    folder holding `.github` ("/" for the repository root), for an action.yml its own folder."""
    def spelled(folder: Path) -> str:
        rel = folder.relative_to(root).as_posix()
        return "/" if rel == "." else f"/{rel}"

    found: set[str] = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".venv")]
        here = Path(folder)
        if here.name == "workflows" and here.parent.name == ".github" and \
                any(f.endswith((".yml", ".yaml")) for f in files):
            found.add(spelled(here.parent.parent))
        if {"action.yml", "action.yaml"} & set(files):
            found.add(spelled(here))
    return found


def uncovered(root: Path, config: dict) -> list[str]:
    covered: list[str] = []
    for entry in config["updates"]:
        if entry["package-ecosystem"] == "github-actions":
            covered += entry.get("directories", []) + ([entry["directory"]] if "directory" in entry else [])
    patterns = [c.rstrip("/") or "/" for c in covered]
    return sorted(d for d in action_dirs(root) if not any(fnmatch.fnmatchcase(d, p) for p in patterns))


def test_dependabot_config_is_version_2_and_well_formed() -> None:
    config = yaml.safe_load(DEPENDABOT.read_text())
    assert config["version"] == 2
    assert isinstance(config["updates"], list) and config["updates"]
    for entry in config["updates"]:
        assert set(entry) >= {"package-ecosystem", "schedule"}, entry
        assert ("directory" in entry) != ("directories" in entry), entry
        assert entry["schedule"]["interval"] in INTERVALS, entry
    ecosystems = [e["package-ecosystem"] for e in config["updates"]]
    assert "github-actions" in ecosystems
    # the locks are made by `python3 -m tools.pins lock`: a pip update would edit a generated file
    assert "pip" not in ecosystems


def test_dependabot_covers_every_folder_with_workflows_or_actions() -> None:
    config = yaml.safe_load(DEPENDABOT.read_text())
    assert "/" in action_dirs(REPO)  # this repository's own .github/workflows
    assert uncovered(REPO, config) == []


def test_dependabot_check_finds_an_uncovered_folder(tmp_path: Path) -> None:
    """The coverage check reads the tree: workflows or an action elsewhere are reported."""
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    (tmp_path / "tools" / "sub" / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / "tools" / "sub" / ".github" / "workflows" / "x.yaml").write_text("on: push\n")
    (tmp_path / "actions" / "setup").mkdir(parents=True)
    (tmp_path / "actions" / "setup" / "action.yml").write_text("runs: {using: composite, steps: []}\n")
    config = yaml.safe_load(DEPENDABOT.read_text())
    assert uncovered(tmp_path, config) == ["/actions/setup", "/tools/sub"]
    config["updates"].append({"package-ecosystem": "github-actions", "directories": ["/tools/*", "/actions/*"],
                              "schedule": {"interval": "weekly"}})
    assert uncovered(tmp_path, config) == []
