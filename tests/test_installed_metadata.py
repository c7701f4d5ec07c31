"""One owner per kind of risky operation: reading installed metadata (versions, Requires-Dist,
entry points of installed distributions).

Owners: rocm_vllm_runtime.distributions (the image's runtime: its manifest steps, self-test report and
bench; the plugin asks through it) and, for the build scripts that run in the base image's Python
without it, docker/pinned_dists.py (`version`, `torch_triton_requirement`). No other shipped code
imports importlib.metadata (or pkg_resources), in Python files, shell scripts or Dockerfiles. (The Ray
stage reads every installed distribution through docker/ray_layer.py, which asks pinned_dists.)"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWNERS = {"runtime/src/rocm_vllm_runtime/distributions.py", "docker/pinned_dists.py"}
SHIPPED = ("backend/src", "runtime/src", "runtime/bin", "runtime/entrypoint.sh", "runtime/suites", "ci", "docker",
           "tools", "deploy", "Dockerfile.rocm", "Dockerfile.rocm_base")
READS = re.compile(r"\bimportlib(?:\.metadata\b|\s+import\s+[^\n]*\bmetadata\b)|\bimportlib_metadata\b|"
                   r"\bpkg_resources\b")


def is_test(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py" or "tests" in path.parts


def readers(root: Path) -> set[str]:
    """The files of the shipped code under root that read installed metadata themselves."""
    found = set()
    for top in SHIPPED:
        base = root / top
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            rel = path.relative_to(root)
            hidden = any(part.startswith(".") for part in rel.parts)  # an environment such as tools/.venv
            script = path.suffix in ("", ".py", ".sh") or path.name.startswith("Dockerfile")
            if is_test(rel) or hidden or not script:
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            if READS.search(text):
                found.add(rel.as_posix())
    return found


def test_only_the_owners_read_installed_metadata():
    others = readers(ROOT) - OWNERS
    assert not others, (f"{', '.join(sorted(others))}: read installed metadata through "
                        "rocm_vllm_runtime.distributions (build scripts: docker/pinned_dists.py)")
    assert OWNERS <= readers(ROOT), "an owner no longer reads installed metadata: update OWNERS"


def test_the_owner_check_can_fail(tmp_path):
    for rel, text in (("runtime/src/pkg/probe.py", "from importlib import metadata\n"),
                      ("docker/probe.sh", "python3 -c 'import importlib.metadata as m'\n"),
                      ("backend/src/pkg/other.py", "import importlib_metadata\n"),
                      ("tools/pins/probe.py", "from importlib import resources, metadata\n")):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "runtime/src/pkg/test_probe.py").write_text("from importlib import metadata\n")
    (tmp_path / "tools/pins/fine.py").write_text("from importlib import resources\n")
    assert readers(tmp_path) == {"runtime/src/pkg/probe.py", "docker/probe.sh", "backend/src/pkg/other.py",
                                 "tools/pins/probe.py"}
