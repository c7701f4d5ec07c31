"""A hash lock's contents have one owner, docker/lock_lines.py: a lock is a list of
`name==version` requirements, each with its `--hash=sha256:` entries (comments, blank lines and
`\\` continuations around them), and nothing else. An index option (--index-url,
--extra-index-url, --find-links, --trusted-host, --no-index), an include (-r, -c), a direct URL
(`name @ URL`), a range, a marker, an environment variable or an encoding declaration would make
pip read another index or install what the pin does not cover, whatever the lock's sha256.

The installer (docker/install_lock.sh, through which therock_sdk.sh, install_torch.sh and
aiter_requirements.sh install) and `python3 -m tools.pins verify` both use it and refuse such a lock
in one line naming the lock and the line; the architecture test at the end holds every reader of a
lock's body to the owner."""
from __future__ import annotations

import ast
import copy
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.build_scripts import load
from tools.pins import model, verify

lock_lines = load("lock_lines")
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docker/install_lock.sh"
HASH = "--hash=sha256:" + "a" * 64
GOOD = ("# a header\n"
        f"rocm==10.0.0 \\\n    {HASH} \\\n    --hash=sha256:{'b' * 64}\n    # via torch\n"
        "\n"
        f"torch==2.13.0+rocm10.0.0 {HASH}  # trailing comment\n"
        f"rocm-sdk-device-gfx942[extra]==10.0.0 \\\n    {HASH}\n")

# Each line a hostile lock may hold beside its good ones, and a word of the one-line refusal.
HOSTILE = {
    "--extra-index-url https://pypi.org/simple": "--extra-index-url",
    "--extra-index-url=https://user:s3cret@pypi.example/simple": "--extra-index-url",
    "--index-url https://evil.example/simple": "--index-url",
    "-i https://evil.example/simple": "-i",
    "--trusted-host evil.example": "--trusted-host",
    "--find-links https://evil.example/wheels/": "--find-links",
    "-f /tmp/wheels": "-f",
    "--no-index": "--no-index",
    "-r other.txt": "-r",
    "--requirement=other.txt": "--requirement",
    "-c constraints.txt": "-c",
    "-e git+https://evil.example/x.git#egg=x": "-e",
    "evil @ https://evil.example/evil-1.0-py3-none-any.whl": "a direct URL",
    f"evil @ https://evil.example/evil-1.0-py3-none-any.whl {HASH}": "a direct URL",
    "https://evil.example/evil-1.0-py3-none-any.whl": "not name==version",
    f"evil>=1.0 {HASH}": "not name==version",
    f"evil==1.* {HASH}": "not name==version",
    f"evil===1.0 {HASH}": "not name==version",
    f"evil==1.0 ; python_version >= '3' {HASH}": "marker",
    "evil==1.0": "no --hash",
    f"evil==1.0 {HASH} --config-settings=x=y": "--config-settings",
    f"evil==1.0 {HASH} --extra-index-url https://evil.example/simple": "--extra-index-url",
    f"evil==1.0 --hash=md5:{'a' * 32}": "no --hash",
    f"evil==${{VERSION}} {HASH}": "not name==version",
    f"# via x\x0c--extra-index-url https://evil.example/simple\nok==1.0 {HASH}": "control character",
    f"ok==1.0 {HASH}\r": "control character",
    # a version that is a file name: pip would build the archive in its working folder
    f"demo==1.0.zip {HASH}": "PEP 440",
    f"demo==1.0.tar.gz {HASH}": "PEP 440",
    f"demo==1.0.ZIP {HASH}": "PEP 440",
    f"demo==1.0-py3-none-any.whl {HASH}": "PEP 440",
    f"demo==./x {HASH}": "not name==version",
    f"demo==1.0/.. {HASH}": "not name==version",
    f"demo==1.0+x.tar.gz {HASH}": "archive",
    f"demo==1.0+local.zip {HASH}": "archive",
    f"demo==1.0+a.WHL {HASH}": "archive",
    f"demo==1.0+b.tgz {HASH}": "archive",
    f"demo==1.0.0.0x {HASH}": "PEP 440",
    f"demo==1.0+ {HASH}": "not name==version",
    f"demo==1.0++a {HASH}": "PEP 440",
    f"demo==1.0+a..b {HASH}": "PEP 440",
    f"demo==1.0_zip {HASH}": "PEP 440",
    f"# via caf\u00e9\nok==1.0 {HASH}": "not ASCII",
}


def refusal(text: str) -> str | None:
    return lock_lines.problem("docker/locks/x.txt", text.encode())


def test_a_lock_of_pins_and_hashes_is_accepted():
    assert refusal(GOOD) is None
    assert lock_lines.requirements(GOOD.encode()) == [
        ("rocm", "10.0.0"), ("torch", "2.13.0+rocm10.0.0"), ("rocm-sdk-device-gfx942", "10.0.0")]


@pytest.mark.parametrize("line", list(HOSTILE))
def test_anything_but_pins_and_hashes_is_refused_in_one_line_naming_the_lock_and_line(line):
    text = GOOD + line + "\n"
    why = refusal(text)
    assert why is not None, line
    assert "\n" not in why and why.startswith("docker/locks/x.txt:"), why
    assert HOSTILE[line] in why, why
    assert "s3cret" not in why and "evil.example" not in why  # a line's values are never echoed


@pytest.mark.parametrize("version", ["1.0+local", "1.0+rocm7.0.0", "v1.0", "1!2.0.post1.dev3", "1.0rc1", "1.0-1",
                                     "1.0.RC1", "1.0+zip", "1.0+tar", "1.0+zip1.gz", "2.13.0+rocm10.0.0"])
def test_a_pep_440_version_near_a_file_name_is_accepted(version):
    assert refusal(f"demo=={version} {HASH}\n") is None, version


def test_a_continued_comment_does_not_hide_an_option():
    """pip ends a continuation at a comment line: the option after it is a line of its own."""
    text = f"ok==1.0 {HASH} \\\n# a comment \\\n--extra-index-url https://evil.example/simple\n"
    why = refusal(text)
    assert why and ":3:" in why and "--extra-index-url" in why, why


@pytest.mark.parametrize("head", [b"\xef\xbb\xbf", b"# -*- coding: utf-7 -*-\n"])
def test_an_encoding_pip_would_read_otherwise_is_refused(head):
    """pip decodes a lock by its BOM or a PEP 263 declaration (UTF-7 turns `+AAo-` into a line
    break): a lock is plain ASCII, read one way."""
    body = f"ok==1.0 {HASH}\n# via x +AAo---extra-index-url https://evil.example/simple\n".encode()
    assert lock_lines.problem("x.txt", head + body) is not None


def test_a_lock_without_requirements_is_refused():
    assert "holds no requirement" in refusal("# only comments\n\n")


# ------------------------------------------------------------------ properties

NAMES = st.from_regex(r"\A[A-Za-z0-9](?:[A-Za-z0-9._-]{0,10}[A-Za-z0-9])?\Z")
VERSIONS = st.from_regex(r"\A(?:[0-9]!)?[0-9]{1,3}(?:\.[0-9]{1,3}){0,3}(?:(?:a|b|rc|\.post|\.dev)[0-9])?"
                         r"(?:\+[a-z0-9]{1,6}(?:\.[a-z0-9]{1,2}){0,2})?\Z")  # (no archive ending)
HASHES = st.text("0123456789abcdef", min_size=64, max_size=64)
BOUNDED = settings(derandomize=True, database=None, max_examples=200, deadline=None)


@st.composite
def locks(draw):
    pins = draw(st.lists(st.tuples(NAMES, VERSIONS, st.lists(HASHES, min_size=1, max_size=3),
                                   st.booleans()), min_size=1, max_size=5))
    lines, wanted = [draw(st.sampled_from(["", "# header", "  # indented"]))], []
    for name, version, hashes, continued in pins:
        entries = [f"--hash=sha256:{h}" for h in hashes]
        if continued:
            lines.append(" \\\n    ".join([f"{name}=={version}", *entries]))
            lines.append(draw(st.sampled_from(["", "    # via someone"])))
        else:
            lines.append(" ".join([f"{name}=={version}", *entries]))
        wanted.append((name, version))
    return "\n".join(lines) + "\n", wanted


@BOUNDED
@given(locks())
def test_every_lock_of_pins_and_hashes_is_read_as_its_pins(lock):
    text, wanted = lock
    assert lock_lines.problem("l.txt", text.encode()) is None, text
    assert lock_lines.requirements(text.encode()) == wanted


@BOUNDED
@given(st.text("0123456789.+!-_vabcdeilnoprstuvwxzgzWHLTARZIP/", min_size=1, max_size=14))
def test_a_version_is_read_as_pep_440_reads_it_and_is_never_an_archive(version):
    """lock_lines.VERSION (standard library: the build stages run it before packaging is there)
    accepts what packaging.version.Version accepts, and no pin it accepts is an archive to pip."""
    from packaging.version import InvalidVersion, Version  # noqa: PLC0415
    from pip._internal.utils.filetypes import is_archive_file  # noqa: PLC0415

    try:
        Version(version)
        pep440 = True
    except InvalidVersion:
        pep440 = False
    assert bool(lock_lines.VERSION.fullmatch(version)) == pep440, version
    why = refusal(f"demo=={version} {HASH}\n")
    if why is None:
        assert pep440 and not is_archive_file(f"demo=={version}"), version
    else:
        assert "\n" not in why and why.startswith("docker/locks/x.txt:1:"), why


OPTIONS = st.sampled_from(["--extra-index-url", "--index-url", "-i", "--trusted-host", "--find-links", "-f",
                           "-r", "-c", "--requirement", "--constraint", "--pre", "--no-index", "-e",
                           "--prefer-binary", "--only-binary", "--use-feature"])


@BOUNDED
@given(locks(), st.integers(0, 50), OPTIONS, st.sampled_from([" ", "=", ""]),
       st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=20))
def test_an_option_anywhere_is_refused_naming_its_line(lock, where, option, sep, value):
    text, _ = lock
    lines = text.splitlines()
    at = where % (len(lines) + 1)
    # at a line's start, or after a requirement's hashes on the same line
    if at < len(lines) and re.match(r"[A-Za-z0-9]", lines[at]) and not lines[at].endswith("\\"):
        lines[at] = f"{lines[at]} {option}{sep}{value}"
    else:
        lines.insert(at, f"{option}{sep}{value}")
    why = lock_lines.problem("l.txt", ("\n".join(lines) + "\n").encode())
    assert why is not None and "\n" not in why and why.startswith("l.txt:"), why


@BOUNDED
@given(st.text(max_size=200))
def test_any_text_is_accepted_as_pins_or_refused_in_one_line(text):
    try:
        data = text.encode()
    except UnicodeEncodeError:
        return
    why = lock_lines.problem("l.txt", data)
    if why is None:
        pins = lock_lines.requirements(data)
        assert pins and all(re.fullmatch(r"[A-Za-z0-9._-]+", n) and "==" not in v for n, v in pins)
    else:
        assert "\n" not in why and why.startswith("l.txt")


# ------------------------------------------------------------------ the installer

@pytest.fixture(scope="module")
def python_without_pip(tmp_path_factory):
    """A Python whose `-m pip` records that it ran: the lock must be refused before pip runs."""
    folder = tmp_path_factory.mktemp("py")
    ran = folder / "ran"
    fake = folder / "python"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = -m ]; then echo \"$@\" >> {ran}; exit 0; fi\n"
                    f"exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    return fake, ran


def install(lock: Path, python: Path) -> subprocess.CompletedProcess:
    pinned = hashlib.sha256(lock.read_bytes()).hexdigest()
    return subprocess.run(["bash", SCRIPT, lock, "https://index.example/simple", pinned],
                          env={**os.environ, "PYTHON": str(python)}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("line", ["--extra-index-url https://pypi.org/simple", "--trusted-host evil.example",
                                  "--find-links https://evil.example/", "-r other.txt", "-c file.txt",
                                  "evil @ https://evil.example/evil-1.0-py3-none-any.whl",
                                  "--index-url https://evil.example/simple", f"demo==1.0.zip {HASH}",
                                  f"demo==1.0+x.tar.gz {HASH}"])
def test_the_installer_refuses_a_pinned_lock_that_holds_more_than_pins(tmp_path, python_without_pip, line):
    python, ran = python_without_pip
    lock = tmp_path / "therock-0.34.txt"
    lock.write_text(GOOD + line + "\n")
    proc = install(lock, python)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("install_lock: ERROR: ") and f"{lock}:" in lines[0], lines
    assert not ran.exists(), ran.read_text()  # pip never ran


def test_the_installer_hands_a_lock_of_pins_to_pip(tmp_path, python_without_pip):
    python, ran = python_without_pip
    lock = tmp_path / "lock.txt"
    lock.write_text(GOOD)
    proc = install(lock, python)
    assert proc.returncode == 0, proc.stderr
    assert "pip install" in ran.read_text() and "--require-hashes" in ran.read_text()
    ran.unlink()


# ------------------------------------------------------------------ verify

def test_verify_refuses_a_pinned_lock_that_holds_more_than_pins(tmp_path):
    data = model.load(ROOT / "versions.json")
    d = copy.deepcopy(data)
    where, node, key, path, _ = verify.pinned_locks(d)[0]
    (tmp_path / path).parent.mkdir(parents=True)
    text = GOOD + "--extra-index-url https://pypi.org/simple\n"
    (tmp_path / path).write_text(text)
    node[key] = hashlib.sha256(text.encode()).hexdigest()
    errors = verify.check_locks(d, tmp_path)
    assert len(errors) == 1 and f"{path}:10:" in errors[0] and "--extra-index-url" in errors[0], errors
    text = GOOD + f"demo==1.0.zip {HASH}\n"
    (tmp_path / path).write_text(text)
    node[key] = hashlib.sha256(text.encode()).hexdigest()
    errors = verify.check_locks(d, tmp_path)
    assert len(errors) == 1 and f"{path}:10:" in errors[0] and "PEP 440" in errors[0], errors
    (tmp_path / path).write_text(GOOD)
    node[key] = hashlib.sha256(GOOD.encode()).hexdigest()
    assert verify.check_locks(d, tmp_path) == []


def test_verify_reads_every_committed_lock_pip_installs():
    """The locks of locks.json that the build installs with --require-hashes are pins and hashes
    alone too (verify reads them with the same owner)."""
    data = model.load(ROOT / "versions.json")
    assert verify.check_locks(data, ROOT) == []
    checked = verify.committed_locks(ROOT, data)
    assert Path("docker/requirements-build.txt") in checked and Path("docker/locks/vllm-0.34-rocm.txt") in checked


# ------------------------------------------------------------------ one owner

INSTALLER = "docker/install_lock.sh"
# What pip is handed with --require-hashes besides install_lock.sh's lock: committed locks of
# locks.json (verify reads each with the owner: committed_locks) and files made from them.
MADE_FROM_COMMITTED = {
    ("docker/install_vllm.sh", '"$wheels/requirements-lock.txt"'):
        "docker/locks/vllm-<track>-rocm.txt, copied by build_vllm.sh",
    ("docker/install_ray.sh", '"$work/requirements.txt"'):
        "the blocks of docker/requirements-ray.txt the image lacks, cut out by install_ray.sh",
    ("ci/test.sh", "<(printf"): "the entries of uv, setuptools and wheel in tests/requirements.lock, each read by "
                                "lock_lines.py entry"}


def _unchecked_lock_installs(installs: list[tuple[str, str]]) -> list[str]:
    """Each pip install of a hash lock (--require-hashes -r FILE) whose lock the owner does not
    read: not install_lock.sh's (which runs lock_lines.py first), not a committed lock verify reads,
    not one made from such a lock."""
    committed = {p.name for p in verify.committed_locks(ROOT, model.load(ROOT / "versions.json"))}
    out = []
    for path, line in installs:
        command = line[re.search(r"\bpip3? install\b", line).start():]
        if "--require-hashes" not in command:
            continue
        files = re.findall(r"(?:-r|--requirement)[ =]+(\S+)", command)
        for file in files:
            name = file.strip("\"'").rsplit("/", 1)[-1]
            if path == INSTALLER and file == '"$lock"':
                continue
            if name in committed or any(path == p and file.startswith(k) for p, k in MADE_FROM_COMMITTED):
                continue
            out.append(f"{path}: {command[:120]}")
    return out


def test_every_lock_pip_installs_is_read_by_the_owner():
    from test_locks import pip_installs

    installs = pip_installs()
    assert any(p == INSTALLER for p, _ in installs)
    assert _unchecked_lock_installs(installs) == []
    planted = [("docker/install_x.sh", 'python -m pip install --require-hashes --no-deps -r "$locks/x.txt"')]
    assert _unchecked_lock_installs(planted) != []


def _checks_before_pip(text: str) -> bool:
    check = text.find('"$here/lock_lines.py" "$lock"')
    pip = text.find("-m pip install")
    return 0 <= check < pip


def test_the_installer_checks_the_lock_before_pip_reads_it():
    text = SCRIPT.read_text()
    assert _checks_before_pip(text), "install_lock.sh must run lock_lines.py on the lock before pip"
    without = "\n".join(line for line in text.splitlines() if "lock_lines.py" not in line)
    assert not _checks_before_pip(without)


def test_the_lock_scripts_install_through_the_installer():
    """therock_sdk.sh, install_torch.sh and aiter_requirements.sh hand their pinned locks to
    install_lock.sh (each lock verify.pinned_locks names)."""
    for name in ("therock_sdk.sh", "install_torch.sh", "aiter_requirements.sh"):
        assert re.search(r'install_lock\.sh" "\$', (ROOT / "docker" / name).read_text()), name


def test_verify_takes_lock_contents_from_the_owner():
    tree = ast.parse((ROOT / "tools/pins/verify.py").read_text())
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "lock_lines.problem" in calls, calls


# ------------------------------------------------------------------ the questions scripts ask

READER = ROOT / "docker/lock_lines.py"


def ask(*argv: str) -> subprocess.CompletedProcess:
    """lock_lines.py run as the build steps and ci/test.sh run it: a script of the standard library."""
    return subprocess.run([sys.executable, "-B", READER, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_the_reader_answers_the_scripts_questions(tmp_path):
    lock = tmp_path / "l.txt"
    lock.write_text(f"# input requirements.txt sha256:{'c' * 64}\n" + GOOD)
    entry = ask("entry", str(lock), "rocm")
    assert entry.returncode == 0 and entry.stdout == f"rocm==10.0.0 {HASH} --hash=sha256:{'b' * 64}\n", entry
    # names compared as pip does; an extra stays on the entry, not on the version
    assert ask("version", str(lock), "Rocm_SDK.Device-gfx942").stdout == "10.0.0\n"
    assert ask("entry", str(lock), "rocm-sdk-device-gfx942").stdout.startswith("rocm-sdk-device-gfx942[extra]==")
    assert ask("pins", str(lock)).stdout.splitlines() == [
        "rocm==10.0.0", "torch==2.13.0+rocm10.0.0", "rocm-sdk-device-gfx942==10.0.0"]
    assert ask("input-sha256", str(lock), "requirements.txt").stdout == "c" * 64 + "\n"


def test_each_refusal_is_one_line_naming_the_lock_and_what_it_lacks(tmp_path):
    lock = tmp_path / "l.txt"
    lock.write_text(GOOD)
    fifo = tmp_path / "fifo.txt"  # no writer ever comes: read, it would wait for ever
    os.mkfifo(fifo)
    cases = {
        # the lock lacks what was asked: exit 1
        ("entry", str(lock), "uv"): (1, f"{lock} has no entry for uv"),
        ("version", str(lock), "ray"): (1, f"{lock} has no entry for ray"),
        ("input-sha256", str(lock), "requirements.txt"):
            (1, f"{lock} records no requirements.txt sha256 (# input requirements.txt sha256:<64 hex>)"),
        # no lock, not a lock, a wrong command: exit 2
        ("version", str(tmp_path / "none.txt"), "ray"): (2, f"{tmp_path / 'none.txt'}: cannot read the lock"),
        ("pins", str(tmp_path)): (2, f"{tmp_path}: cannot read the lock"),
        ("pins", "/dev/null"): (2, "/dev/null: cannot read the lock: not a regular file"),
        ("pins", str(fifo)): (2, f"{fifo}: cannot read the lock: not a regular file"),
        ("version", str(lock)): (2, "usage: lock_lines.py version LOCK NAME"),
    }
    for argv, (status, line) in cases.items():
        proc = ask(*argv)
        assert (proc.returncode, proc.stdout) == (status, ""), (argv, proc)
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(line), (argv, proc.stderr)
    bad = tmp_path / "bad.txt"
    bad.write_text(GOOD + "--extra-index-url https://evil.example/simple\n")
    for argv in (("entry", str(bad), "rocm"), ("pins", str(bad)), ("input-sha256", str(bad), "requirements.txt")):
        proc = ask(*argv)
        assert proc.returncode == 2 and proc.stdout == "" and "--extra-index-url" in proc.stderr, (argv, proc)
    twice = tmp_path / "twice.txt"
    twice.write_text(GOOD + f"ROCM==10.0.1 {HASH}\n" + f"# input requirements.txt sha256:{'d' * 64}\n"
                     + f"# input requirements.txt sha256:{'e' * 64}\n")
    assert ask("version", str(twice), "rocm").returncode == 2
    assert ask("input-sha256", str(twice), "requirements.txt").returncode == 2
    # the check of a whole lock keeps its form: exit 0 or one line and exit 1
    assert ask(str(lock)).returncode == 0 and ask(str(bad)).returncode == 1


def test_the_committed_locks_answer_what_their_readers_ask():
    """What ci/test.sh and the serve-files step ask of the committed locks."""
    for name in ("uv", "setuptools", "wheel"):
        entry = ask("entry", "tests/requirements.lock", name)
        assert entry.returncode == 0, entry
        assert re.fullmatch(rf"{name}==\S+( --hash=sha256:[0-9a-f]{{64}})+\n", entry.stdout), entry
    ray = ask("version", "docker/requirements-ray.txt", "ray")
    assert ray.returncode == 0 and lock_lines.VERSION.fullmatch(ray.stdout.strip()), ray
