"""The checkout's docker/ folder (the build stages' scripts) is never imported by its name: `import docker`
gives whichever `docker` Python finds first, and an installed docker-py (a regular package) beats the
folder (a namespace package). The pin tool and the tests load those scripts through tools/build_scripts.py,
by the folder's path, under a private package name."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from owner_scan import ROOT, python_files

from tools.build_scripts import PACKAGE, load


def _docker(name: str | None) -> bool:
    return name is not None and (name == "docker" or name.startswith("docker."))


def docker_imports(text: str, rel: str) -> list[str]:
    """`rel:line: ...` for each import of a module named docker (or docker.X): import statements, and
    importlib.import_module / __import__ of such a name."""
    found = []
    for node in ast.walk(ast.parse(text, rel)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if _docker(a.name)]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] if node.level == 0 and _docker(node.module) else []
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str) and \
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module" or
                 isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")):
            names = [node.args[0].value] if _docker(node.args[0].value) else []
        else:
            continue
        found += [f"{rel}:{node.lineno}: imports {name}" for name in names]
    return found


def test_no_python_file_imports_docker_by_name():
    files = python_files(ROOT)
    assert ROOT / "tools/pins/verify.py" in files and ROOT / "tests/test_docker_name.py" in files
    found = [line for path in files for line in docker_imports(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not found, "load docker/<name>.py with tools.build_scripts.load(name) instead:\n" + "\n".join(found)


@pytest.mark.parametrize("code", [
    "import docker\n",
    "import os, docker.lock_lines as ll\n",
    "from docker import lock_lines\n",
    "from docker.vllm_requirements import read_requirements\n",
    "import importlib\nimportlib.import_module('docker.vllm_requirements')\n",
    "from importlib import import_module\nimport_module('docker')\n",
    "__import__('docker.pinned_dists')\n",
])
def test_each_form_of_importing_docker_is_found(code):
    assert docker_imports(code, "x.py"), code


@pytest.mark.parametrize("code", [
    "import dockerfile\n", "from dockerfile_model import stages\n", "from . import docker\n",
    "import importlib\nimportlib.import_module('dockerfile')\n",
])
def test_other_names_pass(code):
    assert docker_imports(code, "x.py") == [], code


def test_a_file_in_a_hidden_folder_or_cache_is_not_the_repositorys(tmp_path):
    for rel in (".venv/lib/docker/api.py", "build/lib/x.py", "pkg/__pycache__/x.py", "pkg/mine.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("import docker\n")
    assert python_files(tmp_path) == [tmp_path / "pkg/mine.py"]


def test_the_loader_gives_the_checkouts_scripts_under_a_private_name():
    lock_lines = load("lock_lines")
    assert lock_lines.__name__ == f"{PACKAGE}.lock_lines" and load("lock_lines") is lock_lines
    assert Path(lock_lines.__file__) == ROOT / "docker/lock_lines.py"
    # a script's sibling import inside the private package: the same module, not a second copy
    assert load("vllm_requirements").logical_lines is lock_lines.logical_lines
    with pytest.raises(ValueError):
        load("../runtime/x")


def test_the_pin_tool_reads_the_checkouts_scripts_beside_an_installed_docker_package(tmp_path):
    """A regular package named docker first on the path (as docker-py installs one): the tool still
    reads docker/lock_lines.py and docker/pinned_dists.py of the checkout."""
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker/__init__.py").write_text("raise ImportError('docker-py, not the checkout')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", "from tools.pins import locks, verify; "
                           "print(verify.lock_lines.__file__); print(locks.pinned_dists.__file__)"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(ROOT / "docker/lock_lines.py"), str(ROOT / "docker/pinned_dists.py")]
