"""One owner per kind of risky operation, and no other door.

The product's Python (runtime/src, runtime/suites, backend/src, ci/, docker/ and tools/, without tests) is read as
syntax trees, its shell line by line: the scripts (ci/, docker/, deploy/, runtime/bin, runtime/entrypoint.sh,
serve-cpu.sh, .ci/run), the Dockerfiles' RUN lines, and the YAML's commands (the workflows' run steps, compose's and
Kubernetes' command lists: owner_scan.yaml_shell); every call of a kind below must stand in its owner's function:

* deleting (shutil.rmtree, os.unlink/remove/rmdir, Path.unlink/rmdir, `rm` in shell):
  rocm_vllm_runtime.files._delete, behind files.remove_made (a folder this program made, inside a
  root it made), files.point_link and files.scratch; in shell ci/test-machine/test-cache.sh.
* replacing a file (os.replace/rename, Path.replace/rename): files.write_text (a result, atomically)
  and files.point_link (a link this program made).
* writing a file (open for writing, Path.write_text/write_bytes, tempfile.mkstemp): files.write_text
  for results; files.make_dir and files.scratch write their markers; children.started opens its
  child's log.
* starting a child process (subprocess, os.system/popen/spawn*/fork, pty, asyncio subprocesses):
  rocm_vllm_runtime.children._spawn.
* joining a path from data (`path / f"..."`, os.path.join of computed parts): files.inside.

The build tooling (docker/ runs in build stages without the runtime package), the pin tool (its
writes of versions.json, the build files and the locks, all or none; uv with its input on stdin) and
the backend (a package of its own) keep a few uses: each is counted in KNOWN below, per file and
kind with its reason, so that a further one fails as any other does, and a KNOWN entry whose uses
are gone fails until it is removed.
"""
from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from owner_scan import python_files, shell_scripts, unread_shell, yaml_files, yaml_shell

ROOT = Path(__file__).resolve().parents[1]
FILES_PY = "runtime/src/rocm_vllm_runtime/files.py"
CHILDREN_PY = "runtime/src/rocm_vllm_runtime/children.py"

OWNERS = {
    "delete": {(FILES_PY, "_delete")},
    "replace": {(FILES_PY, "write_text"), (FILES_PY, "point_link")},
    "write": {(FILES_PY, "write_text"), (FILES_PY, "make_dir"), (FILES_PY, "scratch"),
              (CHILDREN_PY, "started")},
    "spawn": {(CHILDREN_PY, "_spawn")},
    # inside: a name from data; _steps: the links a result path passes through (its own check)
    "join": {(FILES_PY, "inside"), (FILES_PY, "_steps")},
}
# What a failure says to use instead.
DOOR_NAMES = {
    "delete": "files.remove_made (a folder this program made), files.point_link or files.scratch",
    "replace": "files.write_text (a result) or files.point_link (a link this program made)",
    "write": "files.write_text (a result) or children.started (a child's log)",
    "spawn": "children.started, children.run or children.output",
    "join": "files.inside",
}
# Calls into the owners' modules are the door itself.
DOORS = ("files.", "children.")
# Kinds checked in all of the product's Python (a kind left out here is checked in IN_IMAGE only).
EVERYWHERE = ("delete", "replace", "spawn", "write", "join")
IN_IMAGE = ("runtime/src/", "backend/src/")

# (file, kind) -> (how many, why): uses outside the owners, each with its reason. A further use in
# these files fails the test as one in any other file does.
KNOWN = {
    ("tools/pins/model.py", "delete"): (1, "versions.json's writer drops its own temporary file on failure"),
    ("tools/pins/model.py", "replace"): (1, "versions.json and the lock files, renamed into place whole"),
    ("tools/pins/discover.py", "delete"): (1, "a download it made (.part) whose sha256 is wrong"),
    ("tools/pins/discover.py", "replace"): (1, "a checked download renamed into the sdist cache"),
    ("tools/pins/discover.py", "write"): (1, "an sdist's files, unpacked into the folder its caller names (a lock's "
                                          "scratch tree, the tests' sdist cache), each path joined by files.inside"),
    ("tools/pins/locks.py", "spawn"): (1, "uv pip compile, with its deadline (the pins job, outside the image)"),
    ("docker/check_aiter.py", "spawn"): (1, "ldd on a built module, in the aiter-wheel build stage"),
    ("docker/ray_layer.py", "spawn"): (1, "ray imported from the Ray layer it staged, in the ray-installed stage"),
    ("docker/ray_layer.py", "write"): (2, "the constraints and requirements pip installs the Ray layer with, in "
                                             "install_ray.sh's own work folder"),
    ("docker/pinned_dists.py", "join"): (1, "triton's dist-info folder in the image being built"),
    ("docker/pinned_dists.py", "write"): (5, "triton's alias metadata, the pin report, and torch's Triton "
                                                "requirement (therock), in a build stage"),
    ("tools/pins/resolve.py", "write"): (1, "a file of a fetched commit in its scratch tree (fetch_files)"),
    ("tools/pins/locks.py", "write"): (3, "a lock's input, override and preference files"),
    ("tools/pins/model.py", "write"): (1, "versions.json's writer: its temporary file (all files or none)"),
    ("backend/src/vllm_aiter_mla/cpu_dev.py", "write"): (1, "the CPU development mode's call counts (a file "
                                                           "under /tmp); the backend package does not depend "
                                                           "on the runtime"),
}

PY_CALLS = {
    "delete": {"shutil.rmtree", "os.unlink", "os.remove", "os.rmdir", "os.removedirs", ".unlink", ".rmdir"},
    "replace": {"os.replace", "os.rename", "os.renames", ".rename", ".replace/1"},
    "write": {".write_text", ".write_bytes", "tempfile.mkstemp", "tempfile.NamedTemporaryFile", "open/w",
              "os.open"},
    "spawn": {"subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output",
              "subprocess.Popen", "subprocess.getoutput", "subprocess.getstatusoutput", "os.system", "os.popen",
              "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp", "os.spawnv", "os.spawnve", "os.spawnvp",
              "os.spawnl", "os.spawnlp", "pty.spawn", "asyncio.create_subprocess_exec",
              "asyncio.create_subprocess_shell", "multiprocessing.Process"},
    "join": {"os.path.join/data", "/f-string"},
}
SHELL_DELETE = re.compile(r"(^|[\s;&|({!`'\"])(rm|rmdir|unlink|shred)\s+[-\"'$/~.\w]|\s-delete\b")
# os.open flags that create, truncate or write
WRITE_FLAGS = {"O_WRONLY", "O_CREAT", "O_TRUNC", "O_APPEND", "O_TMPFILE"}


@dataclass(frozen=True)
class Use:
    path: str
    line: int
    kind: str
    call: str
    function: str  # the outermost function (or class.method) it stands in; "" at module level


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else f".{node.attr}"
    return ""


def _call_names(node: ast.Call) -> set[str]:
    """What a call is, in the forms PY_CALLS names: `mod.func` for a module's function, `.method` for
    a method of any object, `.replace/1` for a one-argument replace (str.replace takes two),
    `open/w` for open() with a writing mode."""
    names = set()
    dotted = _dotted(node.func)
    if dotted.startswith(DOORS):
        return names
    if dotted == "os.open":
        flags = {n.attr for n in ast.walk(node.args[1])
                 if isinstance(n, ast.Attribute)} if len(node.args) > 1 else set()
        return {"os.open"} if flags & WRITE_FLAGS or not flags else set()
    if dotted:
        names.add(dotted)
        if isinstance(node.func, ast.Attribute):
            names.add(f".{node.func.attr}")
            if node.func.attr == "replace" and len(node.args) + len(node.keywords) == 1:
                names.add(".replace/1")
            if node.func.attr == "join" and dotted == "os.path.join" and not all(
                    isinstance(a, ast.Constant) for a in node.args[1:]):
                names.add("os.path.join/data")
    if isinstance(node.func, (ast.Name, ast.Attribute)) and dotted in ("open", "io.open", ".open"):
        mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
            names.add("open/w")
        elif mode is not None and not isinstance(mode, ast.Constant):
            names.add("open/w")  # a mode computed at run time: counted as a write
    return names


def python_uses(text: str, path: str) -> list[Use]:
    """Every risky call in a module's source, with the function it stands in."""
    tree = ast.parse(text)
    uses: list[Use] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not function:
                inner = child.name
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and function and "." not in function \
                    and isinstance(node, ast.ClassDef):
                inner = f"{function}.{child.name}"
            if isinstance(child, ast.Call):
                names = _call_names(child)
                for kind, calls in PY_CALLS.items():
                    hit = sorted(names & calls)
                    if hit:
                        uses.append(Use(path, child.lineno, kind, hit[0], function))
            if isinstance(child, ast.BinOp) and isinstance(child.op, ast.Div) \
                    and isinstance(child.right, ast.JoinedStr):
                uses.append(Use(path, child.lineno, "join", "/f-string", function))
            visit(child, inner)

    visit(tree, "")
    return uses


def shell_uses(text: str, path: str) -> list[Use]:
    """Every deletion command in a shell script, each of a line's (comments left out)."""
    uses = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        uses += [Use(path, number, "delete", "rm", "") for _ in SHELL_DELETE.finditer(code)]
    return uses


def product_python() -> list[Path]:
    found = []
    for base in ("runtime/src", "runtime/suites", "backend/src", "ci", "docker", "tools"):
        for path in sorted(python_files(ROOT / base)):
            rel = path.relative_to(ROOT).as_posix()
            if "/tests/" in rel or path.name.startswith("test_") or path.name in ("conftest.py", "rocm_fake.py"):
                continue
            found.append(path)
    return found


# Scanned for deletions: the shell scripts of owner_scan.SHELL_AREAS (at any depth), these files, and the YAML's
# commands (owner_scan.yaml_files).
SHELL_SCRIPTS = (".ci/run", "runtime/entrypoint.sh", "serve-cpu.sh", "Dockerfile.rocm", "Dockerfile.rocm_base")


def product_shell() -> list[Path]:
    return shell_scripts(SHELL_SCRIPTS)


# The shell scripts' deletions besides the test cache's: each removes what the same script made a
# moment before (a mktemp folder, a pid file its daemon wrote) or trims an image layer it built.
SHELL_KNOWN = {
    "ci/test-machine/test-cache.sh": (1, "the owner: a test venv .ci/run made, under its lock"),
    "docker/aiter_source.sh": (2, "git's logs and index in the AITER clone this stage made"),
    "docker/vllm_source.sh": (1, "its own mktemp folder"),
    "docker/build_project_wheel.sh": (1, "__pycache__/egg-info in the source copy of this build stage"),
    "docker/build_aiter.sh": (1, "its own mktemp work folder"),
    "docker/install_python.sh": (1, "apt's lists in the image layer it installs into"),
    "ci/test-machine/debian-test-image.sh": (2, "the rootfs folder it debootstrapped, and apt caches inside it"),
    "docker/install_ray.sh": (1, "its own mktemp work folder"),
    "docker/build_vllm.sh": (2, "the pins file it wrote"),
    "docker/install_vllm.sh": (1, "its own mktemp work folder"),
    "docker/install_amdsmi.sh": (1, "its own mktemp work folder"),
    "ci/test-machine/docker-engine.sh": (2, "the pid file of the engine it started"),
    "Dockerfile.rocm": (1, "compiled Python in the copy of the app this stage made"),
    "Dockerfile.rocm_base": (1, "the constraints and pins files the same RUN wrote in /tmp"),
    "ci/test-machine/registry.sh": (4, "the pid file, mktemp storage and credentials of the registry it started, "
                                       "the policy-rc.d it wrote for the install"),
}


def violations(uses: list[Use], known: dict | None = None, shell_known: dict | None = None) -> list[str]:
    """Each use outside its owner and beyond what KNOWN counts, one line each."""
    known = KNOWN if known is None else known
    shell_known = SHELL_KNOWN if shell_known is None else shell_known
    out = []
    counted: Counter = Counter()
    for use in uses:
        if use.call == "rm":
            counted[(use.path, "shell")] += 1
            allowed = shell_known.get(use.path, (0, ""))[0]
            if counted[(use.path, "shell")] > allowed:
                out.append(f"{use.path}:{use.line}: a deletion outside ci/test-machine/test-cache.sh")
            continue
        if use.kind not in EVERYWHERE and not use.path.startswith(IN_IMAGE):
            continue
        if (use.path, use.function.split(".")[0]) in OWNERS[use.kind]:
            continue
        counted[(use.path, use.kind)] += 1
        if counted[(use.path, use.kind)] > known.get((use.path, use.kind), (0, ""))[0]:
            out.append(f"{use.path}:{use.line}: {use.call} ({use.kind}) in {use.function or 'module level'}: "
                       f"go through {DOOR_NAMES[use.kind]}")
    return out


def all_uses() -> list[Use]:
    uses = []
    for path in product_python():
        uses += python_uses(path.read_text(), path.relative_to(ROOT).as_posix())
    for path in product_shell():
        uses += shell_uses(path.read_text(errors="replace"), path.relative_to(ROOT).as_posix())
    for path in yaml_files():
        uses += shell_uses(yaml_shell(path), path.relative_to(ROOT).as_posix())
    return uses


# ------------------------------------------------------------------------------------ tests

def test_every_risky_operation_goes_through_its_owner() -> None:
    found = violations(all_uses())
    assert not found, "risky operations outside their owner:\n" + "\n".join(found)


def test_each_known_exception_is_still_there() -> None:
    """A KNOWN entry whose uses are gone must go too (else it would hide a new one)."""
    counted = Counter((u.path, u.kind) for u in all_uses() if u.call != "rm" and
                      (u.path, u.function.split(".")[0]) not in OWNERS[u.kind])
    shell = Counter(u.path for u in all_uses() if u.call == "rm")
    stale = [f"{k}: {n} known, {counted[k]} found" for k, (n, _) in KNOWN.items() if counted[k] != n]
    stale += [f"{k}: {n} known, {shell[k]} found" for k, (n, _) in SHELL_KNOWN.items() if shell[k] != n]
    assert not stale, "\n".join(stale)


def test_the_owners_exist() -> None:
    for kind, owners in OWNERS.items():
        for path, function in owners:
            names = {n.name for n in ast.walk(ast.parse((ROOT / path).read_text()))
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            assert function in names, f"{kind}: {path} has no function {function}"


PLANTED = {
    "delete": "import shutil\n\ndef tidy(p):\n    shutil.rmtree(p, ignore_errors=True)\n",
    "delete-path": "def tidy(p):\n    p.unlink(missing_ok=True)\n",
    "replace": "import os\n\ndef save(a, b):\n    os.replace(a, b)\n",
    "write": "def save(p, text):\n    with open(p, 'w') as f:\n        f.write(text)\n",
    "write-path": "def save(p, text):\n    p.write_text(text)\n",
    "spawn": "import subprocess\n\ndef go():\n    subprocess.run(['true'])\n",
    "spawn-popen": "from subprocess import Popen\nimport subprocess\n\nclass A:\n    def go(self):\n"
                   "        return subprocess.Popen(['true'])\n",
    "join": "def where(root, commit):\n    return root / f'aiter-{commit}'\n",
}


def test_a_planted_use_of_each_kind_is_caught() -> None:
    for name, text in PLANTED.items():
        found = violations(python_uses(text, "runtime/src/rocm_vllm_runtime/planted.py"))
        assert len(found) == 1 and name.split("-")[0] in found[0], (name, found)
    # the same call inside its owner's function is allowed, and str.replace is no file operation
    owner = "import shutil\n\ndef _delete(p):\n    shutil.rmtree(p)\n\ndef f(s):\n    return s.replace('a', 'b')\n"
    assert violations(python_uses(owner, FILES_PY)) == []


def test_a_planted_use_in_a_real_module_is_caught() -> None:
    """A copy of the runtime's guard with one deletion and one spawn added (in memory)."""
    text = (ROOT / "runtime/src/rocm_vllm_runtime/guard.py").read_text()
    planted = text + ("\n\ndef sneak(p):\n    import shutil, subprocess\n    shutil.rmtree(p)\n"
                      "    subprocess.call(['x'])\n")
    path = "runtime/src/rocm_vllm_runtime/guard.py"
    assert violations(python_uses(text, path)) == []
    found = violations(python_uses(planted, path))
    assert len(found) == 2 and all("in sneak" in f for f in found), found
    # a further use in a file with known ones fails too
    pins = (ROOT / "tools/pins/locks.py").read_text()
    assert violations(python_uses(pins, "tools/pins/locks.py")) == []
    more = pins + "\n\ndef more():\n    import subprocess\n    subprocess.run(['git'])\n"
    assert len(violations(python_uses(more, "tools/pins/locks.py"))) == 1


def test_the_shell_scan_reads_every_area() -> None:
    """Each folder holds a script the scan reads, and each named file exists (a rename would leave it unread)."""
    found = product_shell()
    assert not unread_shell(found, SHELL_SCRIPTS), unread_shell(found, SHELL_SCRIPTS)
    found = {p.relative_to(ROOT).as_posix() for p in found}
    assert {"deploy/ray/ray-node.sh", "runtime/bin/selftest", "runtime/entrypoint.sh", "serve-cpu.sh",
            "Dockerfile.rocm", "Dockerfile.rocm_base"} <= found


def test_a_deletion_in_a_workflow_step_or_a_yaml_command_is_caught(tmp_path) -> None:
    workflow = tmp_path / "w.yml"
    workflow.write_text("jobs:\n  a:\n    steps:\n      - run: |\n          echo hi\n          rm -rf ~/.cache\n")
    compose = tmp_path / "compose.yaml"
    compose.write_text('services:\n  a:\n    command: ["sh", "-c", "rm -f /data/x && serve"]\n')
    for path in (workflow, compose):
        assert violations(shell_uses(yaml_shell(path), ".github/workflows/ci.yml")) != [], path.name
    assert ".github/workflows/ci.yml" in {p.relative_to(ROOT).as_posix() for p in yaml_files()}


def test_a_planted_shell_deletion_is_caught() -> None:
    assert violations(shell_uses('x=1\nrm -rf "$HOME/venv-old"\n', ".ci/run")) != []
    assert violations(shell_uses('find "$d" -name x -delete\n', "ci/test-machine/disk-space.sh")) != []
    assert violations(shell_uses("# rm -rf in a comment\necho rm\n", ".ci/run")) == []
    assert len(violations(shell_uses('rm -f "$a" && rm -rf "$b"\n', ".ci/run"))) == 2  # each of a line's
    text = (ROOT / "docker/build_aiter.sh").read_text()
    assert violations(shell_uses(text + '\nrm -rf "$HOME"\n', "docker/build_aiter.sh")) != []
