"""The pin tool on bad input: every command refuses a versions file of the wrong shape or type,
or one it cannot read, in one line naming the file or the field, with exit status 1, never a
traceback, and never renders null as "None" into a build argument."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.pins import model

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (["verify"], ["args"], ["tracks"], ["resolve", "wheels"])


def _set(path: list, value):
    def apply(d):
        node = d
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return apply


# name -> (mutation, text the error names)
TYPES = {
    "archs list of lists": (_set(["gpu_archs"], [["gfx942"]]), "gpu_archs"),
    "archs null element": (_set(["gpu_archs"], [None]), "gpu_archs"),
    "epoch true": (_set(["source_date_epoch"], True), "source_date_epoch"),
    "epoch float": (_set(["source_date_epoch"], 1.5), "source_date_epoch"),
    "modules null element": (_set(["aiter", "required_modules"], [None]), "aiter.required_modules"),
    "modules number": (_set(["aiter", "required_modules"], [3]), "aiter.required_modules"),
    "unresolved number": (_set(["base_image", "unresolved"], [1]), "base_image.unresolved"),
    "unresolved list of lists": (_set(["base_image", "unresolved"], [["digest"]]), "base_image.unresolved"),
    "track aiter list": (_set(["tracks", "0.32", "aiter"], ["v0.1.24.post1"]), "tracks.0.32.aiter"),
    "tracks a list": (_set(["tracks"], []), "tracks"),
    "pins null": (_set(["aiter", "pins"], None), "aiter.pins"),
    "pin null": (_set(["aiter", "pins", "v0.1.26"], None), "aiter.pins.v0.1.26"),
    "track null": (_set(["tracks", "0.32"], None), "tracks.0.32"),
    "sdist sha256 true": (_set(["tracks", "0.32", "vllm", "sdist", "sha256"], True), "tracks.0.32.vllm.sdist.sha256"),
    "wheel version number": (_set(["pytorch", "torch", "torch"], 2.13), "pytorch.torch.torch: must be a string"),
    "wheel version object": (_set(["pytorch", "torch", "torchaudio"], {"version": "2.11.0"}), "pytorch.torch"),
    "lock sha256 number": (_set(["pytorch", "lock_sha256"], 5), "pytorch.lock_sha256"),
    "python version number": (_set(["python", "version"], 3.12), "python.version"),
    "default track number": (_set(["default_track"], 0.33), "default_track"),
    "platform null": (_set(["platform"], None), "platform: must be an object, not null"),
    "index url true": (_set(["vllm", "index_url"], True), "vllm.index_url"),
    "commit prefix number": (_set(["tracks", "0.32", "vllm", "commit_prefix"], 5), "tracks.0.32.vllm.commit_prefix"),
    "schema text": (_set(["schema"], "2"), "schema"),
    "schema true": (_set(["schema"], True), "schema"),
    "about number": (_set(["about"], 1), "about: must be a string"),
    "rocm version null": (_set(["rocm", "version"], None), "rocm.version"),
    "triton_kernels null": (_set(["vllm", "triton_kernels"], None), "vllm.triton_kernels"),
    "vllm repository null": (_set(["vllm", "repository"], None), "vllm.repository"),
    "track vllm a list": (_set(["tracks", "0.33", "vllm"], []), "tracks.0.33.vllm"),
    "torch versions null": (_set(["pytorch", "torch"], None), "pytorch.torch"),
    "torch versions a list": (_set(["pytorch", "torch"], ["torch==2.13.0"]), "pytorch.torch"),
    "pin tag null": (_set(["aiter", "pins", "v0.1.26", "tag"], None), "aiter.pins.v0.1.26.tag"),
    "deeply nested about": (_set(["tracks", "0.32", "about"], [[[[[]]]]]), "tracks.0.32.about"),
    "track name not a release line": (lambda d: d["tracks"].update({"latest": d["tracks"]["0.32"]}),
                                      "tracks.latest"),
    "version that is no Docker tag": (_set(["tracks", "0.32", "vllm", "version"], "0.32.0 beta"),
                                      "tracks.0.32.vllm.version"),
}


@pytest.fixture(scope="module")
def data() -> dict:
    return model.load(ROOT / "versions.json")


def run_tool(*args):
    return subprocess.run([sys.executable, "-m", "tools.pins", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_wrong_types_are_refused_by_every_command(name, data, tmp_path):
    mutate, where = TYPES[name]
    bad = copy.deepcopy(data)
    mutate(bad)
    path = tmp_path / "versions.json"
    path.write_text(model.canonical(bad))
    for command in COMMANDS:
        proc = run_tool("--file", path, *command)
        assert proc.returncode == 1, f"{command}: accepted\n{proc.stdout}"
        assert "Traceback" not in proc.stderr, proc.stderr
        assert where in proc.stderr, f"{command}: {proc.stderr}"
        assert "None" not in proc.stdout


def _unreadable(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / "versions.json"
    if kind == "not UTF-8":
        path.write_bytes(b"\xff\xfe{}")
    elif kind == "nested too deeply":
        path.write_text("[" * 100000 + "]" * 100000)
    elif kind == "a JSON list":
        path.write_text("[1]\n")
    elif kind == "a directory":
        path.mkdir()
    elif kind == "a symlink loop":
        (tmp_path / "other").symlink_to(path)
        path.symlink_to(tmp_path / "other")
    elif kind == "empty":
        path.write_text("")
    return path


@pytest.mark.parametrize("kind", ["not UTF-8", "nested too deeply", "a JSON list", "a directory", "a symlink loop",
                                  "empty"])
def test_files_that_are_no_versions_file_fail_in_one_line(kind, tmp_path):
    path = _unreadable(kind, tmp_path)
    for command in COMMANDS:
        proc = run_tool("--file", path, *command)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "versions.json" in lines[0], lines


HOSTILE_STRINGS = ["7.2.3\nALLOW_UNRESOLVED=1", "--upload-pack=touch pwned", "-x", "a b", "a'b", 'a"b', "x\n",
                   " x", "x\\y", "ext::sh -c touch% pwned"]


def _string_leaves(node, path=()):
    """(path, value) of every string of the versions file but the "about" texts."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key != "about":
                yield from _string_leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _string_leaves(value, (*path, i))
    elif isinstance(node, str):
        yield path, node


def _dotted(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def test_every_string_of_the_versions_file_refuses_hostile_values(data):
    """Each string field (repositories, URLs, names, versions, tags, paths, list items), set to a
    value with a line break, a leading '-', a space, a quote or a backslash, fails the schema
    check every command runs first, naming the field."""
    from tools.pins import verify

    leaves = list(_string_leaves(data))
    assert len(leaves) > 40
    for path, _ in leaves:
        if path[-1] in ("unresolved",) or (len(path) > 1 and path[-2] == "unresolved"):
            continue
        for bad in HOSTILE_STRINGS:
            changed = copy.deepcopy(data)
            _set(list(path), bad)(changed)
            errors = verify.check_schema(changed)
            named = _dotted(path[:-1] if isinstance(path[-1], int) else path)  # a list item: the list
            assert any(named in e for e in errors), (path, bad, errors)


@pytest.mark.parametrize("field,bad", [
    (["aiter", "repository"], "--upload-pack=touch pwned"),
    (["vllm", "triton_kernels", "repository"], "ext::sh -c touch% pwned"),
    (["rocm", "version"], "7.2.3\nALLOW_UNRESOLVED=1"),
    (["aiter", "pins", "v0.1.20.post1", "commit"], "de07f3885ee5f2030ba72b6cc5940d674fd457cf\n"),
    (["tracks", "0.33", "vllm", "tag"], "v0.33.0 --build-arg X=1"),
])
def test_hostile_strings_stop_every_command_and_git_never_runs(field, bad, data, tmp_path):
    changed = copy.deepcopy(data)
    _set(field, bad)(changed)
    path = tmp_path / "versions.json"
    path.write_text(model.canonical(changed))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'git-ran'}\nexit 1\n")
    (bin_dir / "git").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for command in (*COMMANDS, ["resolve", "aiter"], ["resolve", "vllm"]):
        proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", str(path), *command], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 1, (command, proc.stdout)
        assert ".".join(field) in proc.stderr and "Traceback" not in proc.stderr, (command, proc.stderr)
        assert "ALLOW_UNRESOLVED" not in proc.stdout
    assert not (tmp_path / "git-ran").exists(), (tmp_path / "git-ran").read_text()
    assert not (tmp_path / "pwned").exists() and not (ROOT / "pwned").exists()


def test_git_is_handed_a_double_dash_before_every_repository(monkeypatch):
    """Even a repository that got past the schema cannot be read as an option by git."""
    from tools.pins import discover, resolve

    seen = []
    monkeypatch.setattr(resolve, "_git", lambda *args, **kw: seen.append(args) or "")
    for call in (lambda: resolve.tag_commit("https://x.invalid/a.git", "v1"),
                 lambda: resolve.fetch_commit("https://x.invalid/a.git", "0" * 40, "/nonexistent"),
                 lambda: discover.aiter_tags("https://x.invalid/a.git")):
        try:
            call()
        except model.PinError:
            pass
    with_url = [a for a in seen if "https://x.invalid/a.git" in a]
    assert len(with_url) >= 2
    for args in with_url:
        assert args[args.index("https://x.invalid/a.git") - 1] == "--" or args[:3] == ("remote", "add", "--"), args


def _merged_twice(data: dict) -> str:
    """versions.json as a hand merge leaves it: the default track's vLLM pinned twice, both sides kept."""
    text = model.canonical(data)
    track = data["default_track"]
    version = data["tracks"][track]["vllm"]["version"]
    line = f'"version": "{version}"'
    assert text.count(line) >= 1
    return text.replace(line, f'{line},\n        "version": "0.0.1"', 1)


@pytest.mark.parametrize("command", [["format"], *COMMANDS])
def test_a_key_given_twice_is_refused_naming_it(command, data, tmp_path):
    path = tmp_path / "versions.json"
    merged = _merged_twice(data)
    path.write_text(merged)
    proc = run_tool("--file", path, *command)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0] \
        and "the key 'version' appears twice" in lines[0], lines
    assert path.read_text() == merged  # format kept both sides for the user to choose


@pytest.mark.parametrize("schema_file,document", [("versions.schema.json", "versions.json"),
                                                   ("docker/locks/locks.schema.json", "docker/locks/locks.json")])
def test_the_schemas_are_draft_2020_12_and_hold_the_committed_files(schema_file, document):
    """The shapes verify checks are JSON Schema files an editor can use: valid Draft 2020-12 schemas
    that the committed files meet, checked here with the library directly."""
    import json

    import jsonschema

    schema = json.loads((ROOT / schema_file).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads((ROOT / document).read_text()))


def test_a_pattern_ends_at_the_string_s_end_not_before_a_line_break():
    """Python's $ also matches before a last line break: the schema's patterns end in $(?!\\n)."""
    import json

    import jsonschema

    name = jsonschema.Draft202012Validator(json.loads((ROOT / "versions.schema.json").read_text())["$defs"]["name"])
    assert name.is_valid("v0.1.26") and not name.is_valid("v0.1.26\n")
