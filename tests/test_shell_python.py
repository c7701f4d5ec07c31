"""Shell for commands, Python for logic: the build, pipeline, test-machine and deployment scripts (docker/*.sh,
ci/**/*.sh, deploy/**/*.sh and the shell scripts there without the ending, .ci/run, serve-cpu.sh, the image's
runtime/entrypoint.sh and runtime/bin commands) and the Dockerfiles' RUN lines run no
Python written inline, neither a heredoc (`python3 - ARGS <<'PY'`, `python3 <<EOF`) nor `python3 -c`.
Such Python escapes the architecture tests of the owners, which read .py files (tests/test_one_owner.py,
tests/test_one_json_reader.py, tests/test_one_reader.py): what it decides goes into a module that they
read (ci/pipeline/publish.py, docker/ray_layer.py, rocm_vllm_runtime.ray_cluster), and the script runs it.

What remains is counted in ALLOWED, per file and form with its reason, so that a further one fails, and an
entry whose uses are gone fails until it is removed. The scanner is checked against planted uses."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from owner_scan import shell_scripts, unread_shell, yaml_files, yaml_shell

ROOT = Path(__file__).resolve().parents[1]
# A Python interpreter as scripts name it: python, python3, "$python", ${PYTHON:-python3}, "$VENV/bin/python".
PYTHON = r"""(?:(?<![\w./-])python3?\b|"?\$\{?[A-Za-z_]*(?:python|PYTHON)[^\s"]*"?|\S*/bin/python3?\b"?)"""
FLAGS = r"(?:\s+-[A-Za-z]+)*"
# The program read from a heredoc: `-` as the program (its arguments after it), or no program at all.
HEREDOC = re.compile(PYTHON + FLAGS + r"(?:\s+-(?:\s+[^<\n]*?)?)?\s*<<(?!<)")
INLINE = re.compile(PYTHON + FLAGS + r"\s+-c\b")

# (file, form) -> (how many, why)
ALLOWED = {
    ("docker/build_vllm.sh", "inline"): (1, "a probe of the base image: is its torch a ROCm build "
                                               "(torch.version.hip), the exit status the answer"),
    ("docker/install_torch.sh", "inline"): (1, "prints the torch and HIP versions installed: an import that "
                                                  "proves them, no decision"),
    ("docker/install_therock_triton.sh", "inline"): (1, "prints the torch, HIP and Triton versions installed: "
                                                           "an import that proves them, no decision"),
    ("docker/therock_sdk.sh", "inline"): (1, "prints the torch and HIP versions installed: an import that proves "
                                                "them, no decision"),
    ("docker/therock_links.sh", "inline"): (1, "asks the image's Python for its site-packages folder (sysconfig)"),
    ("Dockerfile.rocm", "inline"): (3, "asks the image's Python for its site-packages folder (sysconfig), "
                                       "where a stage stages its files"),
    ("Dockerfile.rocm_base", "inline"): (1, "asks the image's Python for its site-packages folder (sysconfig)"),
    ("ci/test-machine/registry.sh", "inline"): (2, "a free local port and a random password for the test registry "
                                                   "(the standard library's socket and secrets), no decision"),
}


# Scanned: the shell scripts of owner_scan.SHELL_AREAS (at any depth, tests/ folders left out) and these files.
SCRIPTS = (".ci/run", "serve-cpu.sh", "runtime/entrypoint.sh", "Dockerfile.rocm", "Dockerfile.rocm_base")


def scripts() -> list[Path]:
    return shell_scripts(SCRIPTS, tests=False)


def uses(text: str) -> list[tuple[str, int]]:
    """(form, line) of each inline Python: heredoc or inline (-c). Comment lines are left out."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        if HEREDOC.search(line):
            found.append(("heredoc", number))
        if INLINE.search(line):
            found.append(("inline", number))
    return found


def counted() -> tuple[Counter, dict[tuple[str, str], list[int]]]:
    count: Counter = Counter()
    lines: dict[tuple[str, str], list[int]] = {}
    texts = [(path, path.read_text(errors="replace")) for path in scripts()]
    texts += [(path, yaml_shell(path)) for path in yaml_files()]
    for path, text in texts:
        rel = path.relative_to(ROOT).as_posix()
        for form, line in uses(text):
            count[(rel, form)] += 1
            lines.setdefault((rel, form), []).append(line)
    return count, lines


def test_no_python_is_written_inline_in_a_script() -> None:
    count, lines = counted()
    wrong = [f"{path}:{lines[(path, form)]}: {n} {form} Python, {ALLOWED.get((path, form), (0, ''))[0]} allowed"
             for (path, form), n in sorted(count.items()) if n > ALLOWED.get((path, form), (0, ""))[0]]
    assert not wrong, ("move the logic into a Python module the owners' tests read, and run it from the script:\n"
                       + "\n".join(wrong))


def test_each_allowed_use_is_still_there() -> None:
    count, _ = counted()
    stale = [f"{key}: {n} allowed, {count[key]} found" for key, (n, _) in ALLOWED.items() if count[key] != n]
    assert not stale, "\n".join(stale)


def test_every_area_and_script_is_read() -> None:
    """Each folder holds a script the scan reads, and each named file exists (a rename would leave it unread)."""
    found = scripts()
    assert not unread_shell(found, SCRIPTS), unread_shell(found, SCRIPTS)
    found = {p.relative_to(ROOT).as_posix() for p in found}
    assert {"deploy/ray/ray-node.sh", "runtime/bin/selftest", "runtime/entrypoint.sh", "serve-cpu.sh"} <= found


def test_every_workflow_step_and_yaml_command_is_read() -> None:
    """The workflows' run steps and the compose and Kubernetes commands are read; a step with inline
    Python is caught there as in a script."""
    files = {p.relative_to(ROOT).as_posix(): yaml_shell(p) for p in yaml_files()}
    assert {".github/workflows/ci.yml", ".github/workflows/images.yml", ".github/workflows/pins.yml",
            "compose.yaml", "deploy/kubernetes/overlays/multinode/leaderworkerset.yaml"} <= set(files)
    assert "bash .ci/run" in files[".github/workflows/ci.yml"]
    assert "python3 -m rocm_vllm_runtime.health --timeout 8" in files["compose.yaml"]
    assert "rocm_vllm_runtime.health --generate" in files["deploy/kubernetes/overlays/multinode/leaderworkerset.yaml"]


def test_a_workflow_step_or_a_command_list_with_inline_python_is_caught(tmp_path) -> None:
    workflow = tmp_path / "w.yml"
    workflow.write_text("jobs:\n  a:\n    steps:\n      - run: |\n          echo hi\n"
                        "          python3 -c 'import json; print(1)'\n"
                        "      - run: python3 - <<'PY'\n")
    compose = tmp_path / "compose.yaml"
    compose.write_text("services:\n  a:\n    command: [\"python3\", \"-c\", \"print(1)\"]\n")
    assert uses(yaml_shell(workflow)) == [("inline", 2), ("heredoc", 3)]
    assert uses(yaml_shell(compose)) == [("inline", 1)]


def test_the_scanner_catches_each_form() -> None:
    planted = """
x=$(python3 - "$graph" <<'PY'
python3 -B - "$work/c.txt" <<'PY' || exit 1
if "$python" - <<'PY'
python <<EOF
  python3 -c 'import json, sys; print(json.load(sys.stdin)[0])'
python3 -B -c 'import importlib.metadata as m; m.version("msgpack")'
"${PYTHON:-python3}" -c 'print(1)'
"$VENV/bin/python" -c 'print(1)'
# python3 -c 'in a comment'
python3 -m tools.pins tracks --names
python3 -m ci.pipeline tag "$graph" "$metadata" <<<"$input"
read -r a b <<<"$plan"
cat <<EOF
python3 -B "$here/ray_layer.py" plan "$lock" "$work"
"""
    assert uses(planted) == [("heredoc", 2), ("heredoc", 3), ("heredoc", 4), ("heredoc", 5), ("inline", 6),
                             ("inline", 7), ("inline", 8), ("inline", 9)], uses(planted)


def test_the_scripts_moved_into_modules_hold_none() -> None:
    """What moved: publish.sh and tag.sh (ci/pipeline/publish.py), install_ray.sh (docker/ray_layer.py),
    propose-pins.sh (python3 -m tools.pins tracks --names), the LeaderWorkerSet leader's wait for its
    group's Ray nodes (python3 -m rocm_vllm_runtime.ray_cluster wait --lws)."""
    for rel in ("ci/pipeline/amd-runner/publish.sh", "ci/pipeline/amd-runner/tag.sh", "docker/install_ray.sh",
                "ci/pipeline/propose-pins.sh"):
        assert uses((ROOT / rel).read_text()) == [], rel
        assert not any(key[0] == rel for key in ALLOWED), rel
    lws = "deploy/kubernetes/overlays/multinode/leaderworkerset.yaml"
    assert uses(yaml_shell(ROOT / lws)) == [] and not any(key[0] == lws for key in ALLOWED)
    assert "rocm_vllm_runtime.ray_cluster wait --lws" in yaml_shell(ROOT / lws)
