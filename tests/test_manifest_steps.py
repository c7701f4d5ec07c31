"""The build steps that write the image manifest: each runs the runtime's manifest model
(rocm_vllm_runtime.manifest, runtime/) from its source files, bind-mounted for that step
alone, so the base and the vLLM image write one model and nothing else writes the file."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dockerfile_model import buildkit_parser, stages

ROOT = Path(__file__).resolve().parents[1]
SRC = "runtime/src"
PACKAGE = "rocm_vllm_runtime"
# (Dockerfile, stage, part of the manifest the step writes)
STEPS = [("Dockerfile.rocm_base", "aiter-installed", "base"), ("Dockerfile.rocm", "serve-files", "vllm")]


def package_imports(src: str, package: str, module: str) -> set[tuple[str, str]]:
    """(package, module) of the modules of the runtime package that `module` imports."""
    tree = ast.parse((ROOT / src / package / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    found = set()
    for name in names:
        parts = name.split(".")
        if len(parts) == 2 and parts[0] == PACKAGE and (ROOT / SRC / PACKAGE / f"{parts[1]}.py").is_file():
            found.add((PACKAGE, parts[1]))
    return found


def files_the_model_needs() -> set[str]:
    """manifest.py, the package modules it imports (transitively, the one reader of installed metadata
    among them) and the package's __init__."""
    needed, todo = {(PACKAGE, "__init__")}, [(PACKAGE, "manifest")]
    while todo:
        item = todo.pop()
        if item not in needed:
            needed.add(item)
            todo += sorted(package_imports(SRC, *item))
    return {f"{SRC}/{p}/{m}.py" for p, m in needed}


def bind_mounts(run) -> dict[str, str]:
    """{source: target} of the bind mounts of the build context (no from=)."""
    out = {}
    for f in run.flags:
        if f.startswith("--mount=") and "type=bind" in f and "from=" not in f:
            opts = dict(part.split("=", 1) for part in f[len("--mount="):].split(",") if "=" in part)
            out[opts["source"]] = opts["target"]
    return out


@pytest.mark.parametrize("dockerfile, stage, part", STEPS)
def test_manifest_step_runs_the_model_from_its_source_files(dockerfile, stage, part):
    parsed = buildkit_parser().parse_string((ROOT / dockerfile).read_text())
    cmds = next(c for name, _, c in stages(parsed) if name == stage)
    runs = [c for c in cmds if c.cmd.upper() == "RUN" and f"-m {PACKAGE}.manifest" in " ".join(c.value)]
    assert len(runs) == 1, f"{dockerfile} {stage}: one RUN writes the manifest through {PACKAGE}.manifest"
    text = " ".join(runs[0].value)
    m = re.search(rf"PYTHONPATH=(\S+) python3? -B -m {PACKAGE}\.manifest {part} ", text)
    assert m, f"{dockerfile} {stage}: PYTHONPATH set for the manifest command alone, part {part}"
    mounts = {s: t for s, t in bind_mounts(runs[0]).items() if s.startswith(("runtime/", "backend/"))}
    assert set(mounts) == files_the_model_needs()
    for source, target in mounts.items():
        assert target == f"{m.group(1)}/{source[len(SRC) + 1:]}", source


def test_the_file_check_can_fail():
    """A module the model starts importing must be mounted too."""
    needed = files_the_model_needs()
    assert f"{SRC}/{PACKAGE}/versions.py" in needed and f"{SRC}/{PACKAGE}/manifest.py" in needed
    assert f"{SRC}/{PACKAGE}/distributions.py" in needed
    assert f"{SRC}/{PACKAGE}/guard.py" not in needed


def test_nothing_else_writes_the_manifest():
    """The build scripts carry no manifest writer of their own, and the Dockerfiles name the
    file only in the model's command and labels."""
    assert not sorted((ROOT / "docker").glob("*manifest*")), "docker/: write the manifest through the model"
    for dockerfile, _, _ in STEPS:
        for line in (ROOT / dockerfile).read_text().splitlines():
            if "manifest.json" in line and not line.lstrip().startswith("#"):
                assert re.search(r"--(out|base) /\S*manifest\.json|io\.rocm-vllm\.manifest=", line), line
