"""versions.json and the pin tool (python3 -m tools.pins)."""
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.pins import model, resolve, verify
from git_repo import commit_all, git, new_repo

ROOT = Path(__file__).resolve().parents[1]
KNOWN_AITER = "de07f3885ee5f2030ba72b6cc5940d674fd457cf"
KNOWN_CK = "f33252cebe5a52362ec1ee12c124dde7800dda3a"
HIPKITTENS = "d3cd9b31cb0ff611ff64b5701f57ccdeb7712f39"


@pytest.fixture()
def data():
    return model.load(ROOT / "versions.json")


@pytest.fixture()
def tree(tmp_path):
    """A copy of the versions file and Dockerfiles to mutate."""
    for name in ("versions.json", *model.DOCKERFILES):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def run_tool(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "tools.pins", *args], cwd=cwd, capture_output=True, text=True)


def test_repository_versions_file_verifies():
    proc = run_tool("verify")
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout


def test_strict_fails_on_unresolved_and_names_each(data):
    unresolved = model.unresolved_pins(data, track_name_=data["default_track"])
    proc = run_tool("verify", "--strict", "--track", data["default_track"])
    if unresolved:
        assert proc.returncode == 1
        for path in unresolved:
            assert path in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr


def test_known_aiter_pair_is_recorded(data):
    pins = {p["tag"]: p for p in data["aiter"]["pins"].values()}
    assert pins["v0.1.20.post1"]["commit"] == KNOWN_AITER
    assert pins["v0.1.20.post1"]["ck_commit"] == KNOWN_CK
    assert data["gpu_archs"] == ["gfx942", "gfx950"]


def test_tracks_newest_first_and_the_default_is_the_newest_that_can_be_built(data):
    names = model.track_names(data)
    built = [n for n in names if model.track_stack(data, n) in model.BUILT_STACKS]
    assert built[0] == data["default_track"] and len(names) >= 2
    versions = [data["tracks"][n]["vllm"]["version"] for n in names]
    assert [tuple(map(int, v.split("."))) for v in versions] == sorted(
        (tuple(map(int, v.split("."))) for v in versions), reverse=True)


def test_each_track_builds_its_own_vllm_and_aiter(data):
    for name in model.track_names(data):
        args = model.build_args(data, track_name_=name)
        own = data["tracks"][name]
        assert args["VLLM_TRACK"] == name and args["VLLM_VERSION"] == own["vllm"]["version"]
        assert args["AITER_TAG"] == data["aiter"]["pins"][own["aiter"]]["tag"]
        assert args["VLLM_TAG"] == own["vllm"]["tag"]
        assert args["VLLM_VERSION"].startswith(name + ".")
    assert model.build_args(data) == model.build_args(data, track_name_=data["default_track"])
    with pytest.raises(model.PinError, match="no release track '0.1'.*set TRACK"):
        model.build_args(data, track_name_="0.1")


def test_a_track_may_carry_its_own_rocm_stack(data):
    """A track on another ROCm release replaces a shared section; the other tracks keep the shared one."""
    d = copy.deepcopy(data)
    old = model.track_names(d)[-1]
    d["tracks"][old]["base_image"] = {"name": "rocm/dev-ubuntu-22.04", "tag": "7.1-complete", "digest": None,
                                      "unresolved": ["digest"]}
    d["tracks"][old]["rocm"] = {"version": "7.1"}
    assert verify.check_schema(d) == []
    assert model.build_args(d, track_name_=old)["ROCM_IMAGE"].startswith("rocm/dev-ubuntu-22.04:7.1-complete@")
    assert model.build_args(d, track_name_=old)["ROCM_VERSION"] == "7.1"
    shared = next(n for n in model.track_names(d) if n != old and model.track_stack(d, n) == model.ROCM_IMAGE_STACK)
    assert model.build_args(d, track_name_=shared)["ROCM_VERSION"] == d["rocm"]["version"]
    assert f"tracks.{old}.base_image.digest" in model.unresolved_pins(d, track_name_=old)
    assert "base_image.digest" not in model.unresolved_pins(d, track_name_=old)


def test_tracks_command_lists_them_newest_first(data):
    proc = run_tool("tracks", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == model.track_names(data)
    proc = run_tool("tracks", "--json", "--built")  # the CI image matrix: tracks whose stack is built here
    assert proc.returncode == 0 and json.loads(proc.stdout) == model.built_track_names(data)
    assert data["default_track"] in model.built_track_names(data)
    assert all(model.track_stack(data, t) in model.BUILT_STACKS for t in model.built_track_names(data))
    proc = run_tool("tracks")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"{model.track_names(data)[0]}") and len(lines) == len(model.track_names(data)) + 1
    assert [line for line in lines if "(default)" in line] == [
        next(line for line in lines if line.startswith(f"{data['default_track']} (default): vLLM "))]
    declared = model.backend_supported_vllm(ROOT)[1]
    assert lines[-1].startswith(f"backend supports vLLM {declared}")
    aside = model.stepped_aside(data, declared)
    assert (f"; it steps aside on track {', '.join(aside)} " in lines[-1]) == bool(aside), lines[-1]


def test_backend_range_is_derived_from_the_tracks(data, tree):
    """The plugin's SUPPORTED_VLLM runs from the oldest track up to a track: the newest, or an older
    one while the plugin steps aside on a newer track it was not compared with yet; verify fails
    on any other range."""
    assert model.backend_supported_vllm(ROOT)[1] in model.backend_ranges(data).values()
    d = copy.deepcopy(data)
    newest = d["tracks"][model.track_names(d)[0]]
    major, minor, _ = newest["vllm"]["version"].split(".")
    d["tracks"][f"{major}.{int(minor) + 1}"] = {**copy.deepcopy(newest), "vllm": {
        **newest["vllm"], "version": f"{major}.{int(minor) + 1}.0"}}
    assert model.supported_vllm(d).endswith(f",<{major}.{int(minor) + 2}")
    init = tree / model.BACKEND_INIT
    init.parent.mkdir(parents=True)
    shutil.copy(ROOT / model.BACKEND_INIT, init)
    declared = model.backend_supported_vllm(tree)[1]
    # a newer track than the range: allowed, the plugin steps aside on it
    assert verify.check_backend_range(d, tree) == []
    assert model.stepped_aside(d, declared)[0] == f"{major}.{int(minor) + 1}"
    assert verify.check_backend_range(data, tree) == []
    covered = model.covered_track(data, declared)
    assert model.stepped_aside(data, declared) == model.track_names(data)[:model.track_names(data).index(covered)]
    # a range past the newest track, or not from the oldest one: refused
    for wrong in (model.supported_vllm(d), declared.replace(">=", ">=9.")):
        init.write_text(init.read_text().replace(model.backend_supported_vllm(tree)[1], wrong))
        errors = verify.check_backend_range(data, tree)
        assert len(errors) == 1 and "change SUPPORTED_VLLM to one of" in errors[0], errors
    # the pin tool never widens it: a range that no longer fits (its end track gone) is moved back
    assert model.backend_range_update(d, tree) != {}
    init.write_text(init.read_text().replace(model.backend_supported_vllm(tree)[1], declared))
    assert model.backend_range_update(d, tree) == {}


def test_unresolved_pins_are_null_never_placeholders(data):
    seen = []

    def walk(node):
        if isinstance(node, dict):
            for field in node.get("unresolved", []):
                assert node[field] is None, field
                seen.append(field)
            for value in node.values():
                walk(value)
        elif isinstance(node, str):
            assert node != model.UNRESOLVED, "the sentinel belongs in build files, null in versions.json"

    walk(data)
    assert len(seen) == len(model.unresolved_pins(data))


def _mutations():
    def setp(path, value):
        def apply(d):
            node = d
            *parents, last = path
            for p in parents:
                node = node[p]
            node[last] = value
        return apply
    return {
        "short commit": (setp(["aiter", "pins", "v0.1.20.post1", "commit"], "de07f38"), "40-hex"),
        "uppercase commit": (setp(["aiter", "pins", "v0.1.20.post1", "ck_commit"], KNOWN_CK.upper()), "40-hex"),
        "bad sha256": (lambda d: (d["pytorch"].update(lock_sha256="abc"),
                                  d["pytorch"]["unresolved"].clear()), "pytorch.lock_sha256: must be 64 lowercase hex"),
        "lock null not listed": (lambda d: d["pytorch"]["unresolved"].clear(),
                                 "pytorch.lock_sha256 is null but not listed"),
        "pytorch http index": (setp(["pytorch", "index_url"], "http://download.pytorch.org/whl/rocm7.2"),
                               "pytorch.index_url"),
        "bad digest": (lambda d: (d["base_image"].update(digest="sha256:1234"),
                                  d["base_image"]["unresolved"].clear()), "sha256:<64"),
        "unknown arch": (setp(["gpu_archs"], ["gfx942", "gfx90a"]), "gpu_archs[1]: must be one of 'gfx942'"),
        "empty archs": (setp(["gpu_archs"], []), "gpu_archs: holds fewer than 1 entries"),
        "null not listed": (lambda d: d["tracks"]["0.32"]["vllm"]["unresolved"].clear(),
                            "tracks.0.32.vllm.commit is null but not listed"),
        "set but listed": (lambda d: d["aiter"]["pins"]["v0.1.20.post1"]["unresolved"].append("commit"),
                           "still listed"),
        "track pin missing": (setp(["tracks", "0.32", "aiter"], "v9"), "tracks.0.32.aiter: v9 is not a key"),
        "default track missing": (setp(["default_track"], "0.9"), "default_track: 0.9 is not a key of tracks"),
        "no tracks": (setp(["tracks"], {}), "tracks: holds fewer than 1 entries"),
        "track of another line": (setp(["tracks", "0.32", "vllm", "version"], "0.31.0"), "not of release line 0.32"),
        "track name": (lambda d: d["tracks"].update({"v0.34": d["tracks"]["0.32"]}), "tracks.v0.34: must be a vLLM"),
        "track override": (setp(["tracks", "0.32", "base_image"], {"name": "x", "tag": "latest", "digest": None,
                                                                   "unresolved": ["digest"]}),
                           "tracks.0.32.base_image.tag: must not be 'latest'"),
        "track unknown key": (setp(["tracks", "0.32", "python"], {"version": "3.11"}),
                              "tracks.0.32.python: holds a name that does not belong"),
        "old schema": (setp(["schema"], 1), "schema: must be 2"),
        "latest tag": (setp(["base_image", "tag"], "latest"), "latest"),
        "missing section": (lambda d: d.pop("vllm"), "vllm: is missing"),
        "vllm prefix mismatch": (lambda d: (d["tracks"]["0.32"]["vllm"].update(commit="f" * 40),
                                            d["tracks"]["0.32"]["vllm"]["unresolved"].clear()), "commit_prefix"),
        "ck without commit": (lambda d: (d["aiter"]["pins"]["v0.1.24.post1"].update(ck_commit=KNOWN_CK),
                                         d["aiter"]["pins"]["v0.1.24.post1"]["unresolved"].remove("ck_commit")),
                              "ck_commit is set but commit is not"),
        "platform glibc": (setp(["platform", "glibc"], "2.35.1"), "platform.glibc"),
        "missing rocm": (lambda d: d.pop("rocm"), "rocm: is missing"),
        "pytorch unknown wheel": (setp(["pytorch", "torch", "torchcodec"], "0.9.0+rocm7.2"),
                                  "pytorch.torch.torchcodec: holds a name that does not belong"),
        "pytorch wheel missing": (lambda d: d["pytorch"]["torch"].pop("torchaudio"),
                                  "pytorch.torch.torchaudio: is missing"),
        "pytorch wheel pinned by hand": (setp(["pytorch", "wheels"], {}), "pytorch.wheels: holds a name"),
        "pytorch version empty": (setp(["pytorch", "torch", "torch"], ""), "pytorch.torch.torch: must be a name"),
    }


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_verify_rejects(name, data, tree):
    mutate, message = _mutations()[name]
    bad = copy.deepcopy(data)
    mutate(bad)
    errors, _ = verify.verify(bad, root=tree)
    assert errors, f"{name}: accepted"
    assert any(message in e for e in errors), errors
    # and through the command line, with a non-zero exit
    (tree / "versions.json").write_text(json.dumps(bad))
    proc = run_tool("--file", str(tree / "versions.json"), "verify")
    assert proc.returncode == 1 and message in proc.stderr


def test_global_arg_default_drift_is_caught(tree):
    """verify checks the Dockerfiles' global ARG defaults (the only ones) against versions.json;
    the writer of resolve --write puts the versions file's value back, on that line only."""
    path = tree / "Dockerfile.rocm_base"
    text = path.read_text()
    assert text.count("ARG GPU_ARCHS=gfx942;gfx950\n") == 1
    drifted = text.replace("ARG GPU_ARCHS=gfx942;gfx950\n", "ARG GPU_ARCHS=gfx942\n")
    path.write_text(drifted)
    proc = run_tool("--file", str(tree / "versions.json"), "verify")
    line = drifted[:drifted.index("ARG GPU_ARCHS=gfx942\n")].count("\n") + 1
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.splitlines()[0] == (f"error: Dockerfile.rocm_base:{line}: ARG GPU_ARCHS defaults to 'gfx942' "
                                           "but versions.json gives 'gfx942;gfx950' (default track "
                                           f"{model.load(tree / 'versions.json')['default_track']}): change that ARG "
                                           "default")
    changes, texts = model.global_arg_updates(model.load(tree / "versions.json"), tree)
    assert changes == [f"Dockerfile.rocm_base:{line}: ARG GPU_ARCHS=gfx942;gfx950"]
    assert texts[path] == text and texts[tree / "Dockerfile.rocm"] == (tree / "Dockerfile.rocm").read_text()


def test_only_global_arg_lines_are_read_and_written():
    """An ARG inside a stage is neither a default the pin tool reads nor a line it rewrites."""
    text = "ARG A=1\nARG Q=\"x y\"\nARG E=\nARG N\nARG J='{\"a\":[1]}'\nFROM scratch AS s\nARG A=2\nARG A\n"
    assert model.global_arg_defaults(text) == {"A": (1, "1"), "Q": (2, "x y"), "E": (3, ""), "N": (4, None),
                                               "J": (5, '{"a":[1]}')}


def test_a_json_default_is_written_in_single_quotes():
    """A component's pins are JSON: the ARG line holds them in single quotes (BuildKit keeps the
    double quotes inside); a value with both quote characters is refused in one line."""
    assert model._quote('{"a":null}') == "'{\"a\":null}'" and model._quote("x y") == '"x y"'
    assert model._quote("gfx942;gfx950") == "gfx942;gfx950"
    with pytest.raises(model.PinError, match="cannot hold both quote characters: change the pin"):
        model._quote('{"a":"it\'s"}')


def test_each_pin_is_one_build_arg_named_after_it(data):
    """One build arg per pin, named after it: versions.json's value, UNRESOLVED for null, a list
    space-joined; a rocm-image track's TheRock args are empty."""
    shared = rocm_image_track(data)
    args = model.build_args(data, "v0.1.24.post1", track_name_=shared)
    pin, own = data["aiter"]["pins"]["v0.1.24.post1"], data["tracks"][shared]["vllm"]
    assert pin["commit"] is None and args["AITER_COMMIT"] == model.UNRESOLVED
    assert (args["AITER_TAG"], args["AITER_REQUIREMENTS_LOCK"]) == ("v0.1.24.post1", "aiter-v0.1.24.post1.txt")
    assert args["CK_SUBMODULE_PATH"] == data["aiter"]["ck_submodule_path"]
    assert args["AITER_REQUIRED_MODULES"] == " ".join(data["aiter"]["required_modules"])
    assert (args["PYTORCH_INDEX_URL"], args["PYTORCH_LOCK"]) == (data["pytorch"]["index_url"], "pytorch.txt")
    assert args["PYTORCH_LOCK_SHA256"] == model.render(data["pytorch"]["lock_sha256"])
    assert [args[f"{w.upper()}_VERSION"] for w in model.TORCH_WHEELS] == \
        [data["pytorch"]["torch"][w] for w in model.TORCH_WHEELS]
    assert all(args[k] == "" for k in ("THEROCK_INDEX_URL", "THEROCK_LOCK", "THEROCK_LOCK_SHA256",
                                       "TRITON_REPOSITORY", "TRITON_COMMIT", "TRITON_VERSION"))
    assert args["TRITON_KERNELS_COMMIT"] == own["triton_kernels_commit"]
    assert args["VLLM_REPOSITORY"] == data["vllm"]["repository"] and args["VLLM_TAG"] == own["tag"]
    assert all(isinstance(v, str) and "\n" not in v and "{" not in v for v in args.values())


def test_every_versions_build_arg_is_declared_in_dockerfile(data):
    declared = {name for dockerfile in model.DOCKERFILES
                for name in model.global_arg_defaults((ROOT / dockerfile).read_text())}
    needed = set(model.build_args(data))
    assert needed <= declared, needed - declared


def rocm_image_track(data) -> str:
    """The newest track on the rocm-image stack (the shared base_image, rocm and pytorch sections)."""
    return next(n for n in model.track_names(data) if model.track_stack(data, n) == model.ROCM_IMAGE_STACK)


def test_a_therock_track_passes_its_therock_section_and_no_pytorch_section(data):
    name = model.therock_track_names(data)[0]
    args = model.build_args(data, track_name_=name)
    therock = data["tracks"][name]["therock"]
    assert args["ROCM_STACK"] == model.THEROCK_STACK
    assert all(args[k] == "" for k in ("PYTORCH_INDEX_URL", "PYTORCH_LOCK", "PYTORCH_LOCK_SHA256", "TORCH_VERSION",
                                       "TORCHVISION_VERSION", "TORCHAUDIO_VERSION"))
    assert (args["THEROCK_INDEX_URL"], args["THEROCK_LOCK"], args["THEROCK_LOCK_SHA256"]) == \
        (therock["index_url"], f"therock-{name}.txt", model.render(therock["lock_sha256"]))
    assert [args[f"TRITON_{k.upper()}"] for k in ("repository", "commit", "version")] == \
        [model.render(therock["triton"][k]) for k in ("repository", "commit", "version")]
    # the shared pytorch section is not this track's: its unresolved wheels are not this track's pins
    assert not any(p.startswith("pytorch.") for p in model.unresolved_pins(data, track_name_=name))
    assert any(p.startswith("pytorch.") for p in model.unresolved_pins(data, track_name_=rocm_image_track(data)))


def test_args_render_unresolved_and_allow(data):
    shared = rocm_image_track(data)
    args = model.build_args(data, track_name_=shared)
    if data["base_image"]["digest"] is None:
        assert args["ROCM_IMAGE"].endswith("@sha256:UNRESOLVED")
        assert "@" not in model.build_args(data, allow_unresolved=True, track_name_=shared)["ROCM_IMAGE"]
    known = model.build_args(data, "v0.1.20.post1")
    assert known["AITER_COMMIT"] == KNOWN_AITER and known["CK_COMMIT"] == KNOWN_CK
    assert args["GPU_ARCHS"] == "gfx942;gfx950"


def test_strict_for_the_known_aiter_pin_ignores_other_aiter_pins(data, tree):
    """Only the known pin's own unresolved field counts: the lock of its requirements, which needs
    GitHub (its commit's requirements.txt) to be made."""
    errors, unresolved = verify.verify(data, strict=True, root=tree, aiter_name="v0.1.20.post1")
    assert [p for p in unresolved if p.startswith("aiter.")] == ["aiter.pins.v0.1.20.post1.requirements_lock_sha256"]
    assert not any("aiter.pins" in e and "v0.1.20.post1.requirements_lock_sha256" not in e for e in errors)


def test_verify_refuses_a_pin_or_track_that_is_not_in_the_file(data, tree):
    """A caller other than the CLI (which checks them first) gets one line for each, never a silent pass."""
    errors, unresolved = verify.verify(data, root=tree, aiter_name="v9.9.9")
    assert errors == ["AITER pin 'v9.9.9' is not a key of aiter.pins"] and unresolved == []
    errors, unresolved = verify.verify(data, root=tree, track="9.9")
    assert len(errors) == 1 and errors[0].startswith("track '9.9' is not a key of tracks (") and unresolved == []


# ---- resolve, against local git repositories -------------------------------------------------

@pytest.fixture()
def upstream(tmp_path):
    """A repository with a CK submodule and tags, like AITER."""
    ck = new_repo(tmp_path / "ck")
    (ck / "ck.h").write_text("1\n")
    ck_commit = commit_all(ck, "ck")
    repo = new_repo(tmp_path / "aiter")
    (repo / "setup.py").write_text("\n")
    # AITER names the HipKittens commit its prebuild clones in aiter/jit/core.py
    (repo / "aiter" / "jit").mkdir(parents=True)
    (repo / "aiter" / "jit" / "core.py").write_text(
        'info = {\n    "url": "https://github.com/HazyResearch/HipKittens.git",\n'
        f'    "commit": "{HIPKITTENS}",\n}}\n')
    git("add", ".", cwd=repo)
    git("submodule", "add", "-q", ck.as_uri(), "3rdparty/composable_kernel", cwd=repo)
    git("commit", "-qm", "aiter", cwd=repo)
    git("tag", "-a", "v1.0", "-m", "release", cwd=repo)
    return {"url": repo.as_uri(), "commit": git("rev-parse", "HEAD", cwd=repo), "ck": ck_commit, "path": repo}


def _aiter_data(data, upstream, commit=None, ck=None):
    d = copy.deepcopy(data)
    d["aiter"]["repository"] = upstream["url"]
    d["aiter"]["pins"]["test"] = {"tag": "v1.0", "commit": commit, "ck_commit": ck, "hipkittens_commit": None,
                                  "requirements_lock_sha256": None,
                                  "unresolved": [k for k, v in (("commit", commit), ("ck_commit", ck)) if v is None]
                                  + ["hipkittens_commit", "requirements_lock_sha256"]}
    return d


def test_resolve_aiter_tag_and_ck_submodule(data, upstream):
    d = _aiter_data(data, upstream)
    changes = resolve.resolve_aiter(d, "test")
    pin = d["aiter"]["pins"]["test"]
    assert pin["commit"] == upstream["commit"]  # the annotated tag is peeled to its commit
    assert pin["ck_commit"] == upstream["ck"]
    assert pin["hipkittens_commit"] == HIPKITTENS  # read from the AITER commit's aiter/jit/core.py
    # the lock of its requirements is made after the commit (__main__.resolve_aiter_lock)
    assert pin["unresolved"] == ["requirements_lock_sha256"] and len(changes) == 3
    assert not verify.check_schema(d)


def test_resolve_refuses_a_moved_tag_without_force(data, upstream):
    d = _aiter_data(data, upstream, commit="1" * 40, ck=upstream["ck"])
    with pytest.raises(model.PinError, match="the pin moved"):
        resolve.resolve_aiter(d, "test")
    resolve.resolve_aiter(d, "test", force=True)
    assert d["aiter"]["pins"]["test"]["commit"] == upstream["commit"]


def test_resolve_unknown_tag_names_it(data, upstream):
    d = _aiter_data(data, upstream)
    d["aiter"]["pins"]["test"]["tag"] = "v9.9"
    with pytest.raises(model.PinError, match="no tag 'v9.9'"):
        resolve.resolve_aiter(d, "test")


def test_resolve_vllm_checks_the_known_prefix(data, upstream):
    d = copy.deepcopy(data)
    d["vllm"]["repository"] = upstream["url"]
    own = d["tracks"]["0.32"]["vllm"]
    own.update(tag="v1.0", commit=None, unresolved=["commit"])
    own["commit_prefix"] = "0000000"
    with pytest.raises(model.PinError, match="does not start with tracks.0.32.vllm.commit_prefix"):
        resolve.resolve_vllm(d, "0.32")
    own["commit_prefix"] = upstream["commit"][:9]
    resolve.resolve_vllm(d, "0.32")
    assert own["commit"] == upstream["commit"] and own["unresolved"] == []


def test_resolve_write_updates_file_and_dockerfiles(tree, upstream):
    _with_test_pin(tree, upstream)
    proc = run_tool("--file", str(tree / "versions.json"), "resolve", "aiter", "--write")
    assert proc.returncode == 0, proc.stderr
    after = model.load(tree / "versions.json")
    assert after["aiter"]["pins"]["test"]["commit"] == upstream["commit"]
    text = (tree / "Dockerfile.rocm_base").read_text()
    assert text.count(f"ARG AITER_COMMIT={upstream['commit']}\n") == 1  # the global default, once
    assert text.count(f"ARG CK_COMMIT={upstream['ck']}\n") == 1
    def declared(dockerfile):  # the stages' declarations of AITER_COMMIT, unchanged
        return [line for line in dockerfile.splitlines() if line.startswith("ARG ") and "AITER_COMMIT" in line.split()]
    assert declared(text) == declared((ROOT / "Dockerfile.rocm_base").read_text()) != []
    assert run_tool("--file", str(tree / "versions.json"), "verify").returncode == 0


# ---- writing, faults and bad input ------------------------------------------------------------

def _with_test_pin(tree, upstream):
    """The tree's versions file with an AITER pin `test`, every track's, on the local upstream."""
    d = model.load(tree / "versions.json")
    d["aiter"]["repository"] = upstream["url"]
    d["aiter"]["pins"]["test"] = {"tag": "v1.0", "commit": None, "ck_commit": None, "hipkittens_commit": None,
                                  "requirements_lock_sha256": None,
                                  "unresolved": ["commit", "ck_commit", "hipkittens_commit",
                                                 "requirements_lock_sha256"]}
    for own in d["tracks"].values():
        own["aiter"] = "test"
    model.dump(d, tree / "versions.json")
    return tree / "versions.json"


def test_resolve_write_keeps_the_canonical_layout(tree, upstream):
    """resolve --write of one pin (a track's vllm.commit: a value and its unresolved list) is a
    two-line change of versions.json in its one layout; nothing else moves."""
    import difflib

    path = tree / "versions.json"
    d = model.load(path)
    track = d["default_track"]
    d["vllm"]["repository"] = upstream["url"]
    d["tracks"][track]["vllm"].update(tag="v1.0", commit_prefix=upstream["commit"][:9])
    model.dump(d, path)
    text = path.read_text()
    assert text == model.canonical(d)
    proc = run_tool("--file", str(path), "resolve", "vllm", "--track", track, "--write")
    assert proc.returncode == 0, proc.stderr
    new = path.read_text()
    assert json.loads(new)["tracks"][track]["vllm"]["commit"] == upstream["commit"]
    assert new == model.canonical(json.loads(new))
    changed = [line for line in difflib.unified_diff(text.splitlines(), new.splitlines(), n=0, lineterm="")
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(changed) == 6, changed  # commit null -> hex; the one-entry unresolved list (3 lines) -> []


def test_verify_rejects_any_other_layout_and_format_fixes_it(tree):
    path = tree / "versions.json"
    data = model.load(path)
    assert run_tool("--file", str(path), "verify").returncode == 0
    for other in (json.dumps(data), json.dumps(data, indent=4, sort_keys=True) + "\n",
                  model.canonical(data).rstrip("\n"), model.canonical(data).replace("\n", "\r\n")):
        path.write_text(other, newline="")
        proc = run_tool("--file", str(path), "verify")
        assert proc.returncode == 1 and "not in the canonical layout" in proc.stderr, proc.stderr
        assert "python3 -m tools.pins format" in proc.stderr
        proc = run_tool("--file", str(path), "format")
        assert proc.returncode == 0 and path.read_bytes() == model.canonical(data).encode()
        assert run_tool("--file", str(path), "verify").returncode == 0
    proc = run_tool("--file", str(path), "format")
    assert "already in the canonical layout" in proc.stdout


def test_write_is_all_or_nothing_when_the_disk_fills(tree, upstream):
    """A file-size limit (a full disk) stops the write part-way: neither versions.json nor any
    Dockerfile changes, and the error is one line naming the file."""
    import resource

    path = _with_test_pin(tree, upstream)
    before = {p.name: p.read_text() for p in tree.iterdir() if p.is_file()}
    # versions.json fits under the limit, Dockerfile.rocm_base does not
    limit = (len(before["versions.json"]) + len(before["Dockerfile.rocm_base"])) // 2
    assert len(before["Dockerfile.rocm_base"]) > limit + 400 and len(before["versions.json"]) < limit - 400

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", str(path), "resolve", "aiter", "--write"],
                          cwd=ROOT, capture_output=True, text=True, preexec_fn=cap)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "nothing was written" in proc.stderr, proc.stderr
    after = {p.name: p.read_text() for p in tree.iterdir() if p.is_file()}
    assert after == before
    assert not [p for p in tree.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_nothing_changed_writes_nothing(tree, upstream):
    path = _with_test_pin(tree, upstream)
    assert run_tool("--file", str(path), "resolve", "aiter", "--write").returncode == 0
    stamps = {p.name: p.stat().st_mtime_ns for p in tree.iterdir()}
    proc = run_tool("--file", str(path), "resolve", "aiter", "--write")
    assert proc.returncode == 0 and "nothing changed" in proc.stdout
    assert {p.name: p.stat().st_mtime_ns for p in tree.iterdir()} == stamps


@pytest.fixture()
def silent_server():
    """A TCP server that accepts connections and never answers."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize("what", ["aiter", "base-image", "wheels"])
def test_network_calls_are_bounded_and_fail_in_one_line_per_item(what, tree, silent_server):
    """A server that accepts the connection and never answers: each item fails after PINS_TIMEOUT,
    in one line naming the server, then one summary line."""
    import time

    d = model.load(tree / "versions.json")
    d["aiter"]["repository"] = f"http://{silent_server}/aiter.git"
    d["pytorch"]["index_url"] = f"https://{silent_server}/whl"
    model.dump(d, tree / "versions.json")
    args = ["--file", str(tree / "versions.json"), "resolve", what]
    if what == "base-image":
        buildx()
        args += ["--registry", silent_server]
    env = {**os.environ, "PINS_TIMEOUT": "2", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tools.pins", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode == 1
    *lines, summary = proc.stderr.strip().splitlines()
    assert lines and all(silent_server in line and "PINS_TIMEOUT" in line for line in lines), proc.stderr
    if what == "wheels":  # uv's reads, bounded by PINS_TIMEOUT (UV_HTTP_TIMEOUT)
        assert "operation timed out" in lines[0], lines[0]
    pins = {own["aiter"] for own in d["tracks"].values()}
    assert len(lines) == (len(pins) if what == "aiter" else 1)  # aiter: each track's pin; one rocm-image base
    assert summary.startswith(f"error: resolve: {len(lines)} of {len(lines)} item(s) not resolved"), summary


@pytest.fixture(params=["body"])
def trickling_server(tmp_path, request):
    """An HTTPS server (its own certificate, trusted through SSL_CERT_FILE) that answers at once
    and then sends its body one byte every 0.2 s (10 minutes' worth); with the parameter
    "headers", it sends its status line and then its headers that way (an endless header line,
    each read answered well within any per-read timeout)."""
    import socket
    import ssl
    import threading

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                           "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def serve(raw):
        try:
            conn = context.wrap_socket(raw, server_side=True)
        except OSError:
            raw.close()
            return
        with conn:
            try:
                conn.recv(65536)
                if request.param == "headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3000\r\n\r\n")
                for _ in range(3000):
                    if stop.wait(0.2):
                        return
                    conn.sendall(b"x" if request.param == "headers" else b" ")
            except OSError:
                return

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}", cert
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize("trickling_server", ["body", "headers"], indirect=True)
@pytest.mark.parametrize("args", [["discover", "--list"]], ids=["discover"])
def test_a_trickling_server_is_cut_off_at_the_deadline(args, tree, trickling_server):
    """PINS_TIMEOUT bounds a request of resolve's own HTTP client as a whole, headers included: a
    server that keeps sending a byte every 0.2 s (each read answered well within the timeout), of
    its body or of its headers, does not hold the command for its 10 minutes. (The wheel sets'
    index reads are uv's: each read bounded by PINS_TIMEOUT, the whole by _uv_compile's limit.)"""
    import time

    address, cert = trickling_server
    d = model.load(tree / "versions.json")
    d["vllm"]["index_url"] = f"https://{address}/pypi"
    d["pytorch"]["index_url"] = f"https://{address}/whl"
    model.dump(d, tree / "versions.json")
    env = {**os.environ, "PINS_TIMEOUT": "2", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
           "SSL_CERT_FILE": str(cert)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", str(tree / "versions.json"), *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=120)
    assert time.monotonic() - start < 20, proc.stderr  # 2 s, and the connection (PINS_CONNECT_TIMEOUT)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == (2 if args[0] == "resolve" else 1), proc.stderr  # resolve: the item, then its summary
    assert address in lines[0] and "PINS_TIMEOUT" in lines[0], proc.stderr


@pytest.mark.parametrize("port", ["70000", str(443 + 65536), "0", "x"])
def test_a_url_port_that_is_no_tcp_port_is_one_line_never_showing_a_password(port, tree):
    """A source URL whose port is no TCP port (read by the one reading of URLs): each item that
    needs it fails in one line (a URL with credentials is refused before: tests/test_urls_parsed.py)."""
    d = model.load(tree / "versions.json")
    d["pytorch"]["index_url"] = f"https://127.0.0.1:{port}/whl"
    model.dump(d, tree / "versions.json")
    env = {**os.environ, "PINS_TIMEOUT": "5", "PINS_CONNECT_TIMEOUT": "2"}
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", str(tree / "versions.json"), "resolve",
                           "wheels"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    first, summary = proc.stderr.strip().splitlines()
    assert "not a TCP port" in first and "pytorch" in first, first


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "soon", "99999999", "1e10", "86401"])
def test_pins_timeout_must_be_a_positive_finite_number(value, tree, silent_server):
    d = model.load(tree / "versions.json")
    d["vllm"]["index_url"] = f"https://{silent_server}/pypi"
    model.dump(d, tree / "versions.json")
    env = {**os.environ, "PINS_TIMEOUT": value, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", str(tree / "versions.json"), "discover",
                           "--list"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"error: PINS_TIMEOUT={value!r} is not a number of seconds more than 0 and at "
                                   "most 86400")


def _bad(data, mutate):
    bad = copy.deepcopy(data)
    mutate(bad)
    return bad


@pytest.mark.parametrize("command", [["verify"], ["args"], ["resolve", "vllm"]])
@pytest.mark.parametrize("case", ["short commit", "unknown key comit", "unknown key sha265"])
def test_every_subcommand_checks_the_schema(command, case, data, tree):
    mutate, message = {
        "short commit": (lambda d: d["aiter"]["pins"]["v0.1.20.post1"].update(commit="de07f38"), "40-hex"),
        "unknown key comit": (lambda d: d["tracks"]["0.32"]["vllm"].update(comit="x"),
                              "tracks.0.32.vllm.comit: holds a name that does not belong"),
        "unknown key sha265": (lambda d: d["pytorch"].update(lock_sha265="x"),
                               "pytorch.lock_sha265: holds a name that does not belong"),
    }[case]
    (tree / "versions.json").write_text(json.dumps(_bad(data, mutate), indent=2))
    before = {p.name: p.read_text() for p in tree.iterdir()}
    proc = run_tool("--file", str(tree / "versions.json"), *command)
    assert proc.returncode == 1 and message in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and '"commit":"de07f38"' not in proc.stdout
    assert {p.name: p.read_text() for p in tree.iterdir()} == before


@pytest.mark.parametrize("command", [["resolve", "--aiter-pin", "v9.9", "--write"], ["args", "--aiter-pin", "v9.9"],
                                     ["verify", "--aiter-pin", "v9.9"], ["resolve", "nothing"],
                                     ["args", "--track", "v9.9"], ["verify", "--track", "v9.9"],
                                     ["resolve", "--track", "v9.9", "--write"]])
def test_unknown_names_are_rejected(command, tree):
    proc = run_tool("--file", str(tree / "versions.json"), *command)
    assert proc.returncode == 1, proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1 and ("v9.9" in proc.stderr or "nothing" in proc.stderr)
    assert "nothing changed" not in proc.stdout


def _child_commands(pid: int) -> str:
    """The command lines of a process's children, space-joined (Linux /proc)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return ""
    out = []
    for child in children:
        try:
            out.append(Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return " ".join(out)


def test_ctrl_c_is_one_line_and_writes_nothing(tree, silent_server):
    import signal
    import time

    d = model.load(tree / "versions.json")
    d["aiter"]["repository"] = f"http://{silent_server}/aiter.git"
    model.dump(d, tree / "versions.json")
    before = (tree / "versions.json").read_text()
    env = {**os.environ, "PINS_TIMEOUT": "60", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    # Started as from a terminal, SIGINT at its default: a test run started in the background (a
    # non-interactive shell's `cmd &`, nohup) inherits SIGINT ignored, and an ignored signal stays
    # ignored across exec, so the tool (rightly) would not hear Ctrl-C. The wrapper resets it, then
    # becomes the tool (exec: same process, same group).
    tool = [sys.executable, "-m", "tools.pins", "--file", str(tree / "versions.json"), "resolve", "aiter", "--write"]
    as_from_a_terminal = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                          "os.execv(sys.argv[1], sys.argv[1:])", *tool]
    proc = subprocess.Popen(as_from_a_terminal, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    # interrupted while git waits on the silent server (not while Python starts: a loaded machine
    # can take seconds to get there, so a fixed pause is no measure)
    deadline = time.monotonic() + 120
    while "ls-remote" not in _child_commands(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.5)
    # as a terminal's Ctrl-C: to the whole process group (git and its helpers too)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err.strip().splitlines() == ["error: interrupted; nothing was written"], err
    assert (tree / "versions.json").read_text() == before


# ---- resolve on a machine that cannot reach its sources: every item named, within seconds -------

@pytest.fixture()
def blackhole():
    """127.0.0.1:PORT, where a connection is neither accepted nor refused: a listening socket
    whose accept queue is full drops every further SYN, as a network that drops packets does."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    queued = []
    for _ in range(64):  # fill the queue; the first connection that times out shows it is full
        conn = socket.socket()
        conn.settimeout(0.5)
        try:
            conn.connect(server.getsockname())
        except OSError:
            conn.close()
            break
        queued.append(conn)
    else:
        pytest.fail("could not fill a listening socket's accept queue")
    yield f"127.0.0.1:{server.getsockname()[1]}"
    for conn in queued:
        conn.close()
    server.close()


@pytest.fixture()
def refused():
    """127.0.0.1:PORT, where every connection is refused (a port bound but not listening)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def offline_env(**extra):
    """The environment without proxies, git configuration or time limits of the caller's: resolve's
    defaults, on this machine alone."""
    env = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and k not in ("PINS_TIMEOUT", "PINS_CONNECT_TIMEOUT")}
    return {**env, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", **extra}


def sources_at(path, host):
    """Every source resolve reads (git remotes, the wheel index) moved to host."""
    d = model.load(path)
    d["aiter"]["repository"] = f"http://{host}/ROCm/aiter.git"
    d["vllm"]["repository"] = f"http://{host}/vllm-project/vllm.git"
    d["pytorch"]["index_url"] = f"https://{host}/whl/rocm7.2"
    for track in model.therock_track_names(d):
        d["tracks"][track]["therock"]["index_url"] = f"https://{host}/rocm/whl-next/"
    model.dump(d, path)
    return d


def resolve_all(path, *args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "tools.pins", "--file", str(path), "resolve", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_resolve_names_every_item_it_cannot_reach(tree, blackhole):
    """No host answers (the SYN is dropped): `resolve --write` names every item in one line each,
    naming the host (each track's AITER pin and vLLM, the base image, the wheels), each ended by its
    client's own bounds (PINS_CONNECT_TIMEOUT, PINS_TIMEOUT), then one line with the count and what
    resolve needs to reach (the git remotes, the container registry, the PyTorch wheel index);
    nothing is written."""
    path = tree / "versions.json"
    d = sources_at(path, blackhole)
    before = {p.name: p.read_text() for p in tree.iterdir()}
    proc = resolve_all(path, "--registry", blackhole, "--write",
                       env=offline_env(NO_PROXY="*", PINS_TIMEOUT="1", PINS_CONNECT_TIMEOUT="0.5"))
    assert proc.returncode == 1
    *lines, summary = proc.stderr.strip().splitlines()
    tracks = model.track_names(d)
    items = [f"aiter.pins.{d['tracks'][t]['aiter']}" for t in tracks] + [f"tracks.{t}.vllm" for t in tracks] + \
        ["base_image", "pytorch"] + [f"tracks.{t}.therock" for t in model.therock_track_names(d)]
    assert [line.split(": ", 2)[1] for line in lines] == items, proc.stderr
    for line in lines:
        assert line.startswith("error: ") and blackhole in line, line
    assert summary.startswith(f"error: resolve: {len(items)} of {len(items)} item(s) not resolved ("), summary
    for needed in (f"the git remote http://{blackhole}/ROCm/aiter.git (commits)",
                   f"the git remote http://{blackhole}/vllm-project/vllm.git (commits)",
                   f"the container registry of {blackhole}/rocm/dev-ubuntu-22.04:",
                   f"the PyTorch wheel index https://{blackhole}/whl/rocm7.2 (the PyTorch lock)",
                   f"TheRock's wheel index https://{blackhole}/rocm/whl-next/ (the TheRock lock)",
                   "run python3 -m tools.pins resolve --write on a machine that reaches them"):
        assert needed in summary, summary
    assert {p.name: p.read_text() for p in tree.iterdir()} == before


def test_resolve_writes_what_it_reaches_and_names_the_rest(tree, upstream, refused):
    """The AITER remote answers, the others refuse: the AITER pins are resolved and written
    (versions.json and the Dockerfiles), the vLLM, base image and wheel items are named, one line
    each, and resolve exits 1."""
    path = _with_test_pin(tree, upstream)
    d = model.load(path)
    d["vllm"]["repository"] = f"http://{refused}/vllm.git"
    d["pytorch"]["index_url"] = f"https://{refused}/whl"
    for track in model.therock_track_names(d):
        d["tracks"][track]["therock"]["index_url"] = f"https://{refused}/rocm/whl-next/"
    model.dump(d, path)
    proc = resolve_all(path, "--registry", refused, "--write", env=offline_env(NO_PROXY="*"))
    assert proc.returncode == 1
    *lines, summary = proc.stderr.strip().splitlines()
    tracks = model.track_names(d)
    assert [line.split(": ", 2)[1] for line in lines] == [f"tracks.{t}.vllm" for t in tracks] + \
        ["base_image", "pytorch"] + [f"tracks.{t}.therock" for t in model.therock_track_names(d)], \
        proc.stderr
    assert all(refused in line for line in lines), lines
    assert summary.startswith(f"error: resolve: {len(lines)} of {len(lines) + 1} item(s) not resolved"), summary
    after = model.load(path)
    assert after["aiter"]["pins"]["test"]["commit"] == upstream["commit"]
    assert after["aiter"]["pins"]["test"]["ck_commit"] == upstream["ck"]
    assert f'ARG AITER_COMMIT={upstream["commit"]}\n' in (tree / "Dockerfile.rocm_base").read_text()
    assert f"aiter.pins.test.commit: None -> {upstream['commit']}" in proc.stdout
    assert after["tracks"][tracks[0]]["vllm"]["commit"] is None


def test_a_proxy_that_refuses_the_host_is_named_for_each_item(tree):
    """Behind an HTTP proxy (https_proxy) that answers CONNECT with 403, as one that does not let
    the machine reach GitHub does: each item names the host and the proxy's answer (git's)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    asked = []

    def answer():
        while True:
            try:
                conn = server.accept()[0]
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                asked.append(request.split(b"\r\n", 1)[0].decode())
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    proxy = f"127.0.0.1:{server.getsockname()[1]}"
    path = tree / "versions.json"
    d = model.load(path)
    d["aiter"]["repository"] = "https://git.example.org/ROCm/aiter.git"
    model.dump(d, path)
    try:
        proc = resolve_all(path, "aiter", env=offline_env(https_proxy=f"http://{proxy}",
                                                          HTTPS_PROXY=f"http://{proxy}"))
    finally:
        server.close()
    assert proc.returncode == 1
    *lines, summary = proc.stderr.strip().splitlines()
    assert len(lines) == len({own["aiter"] for own in d["tracks"].values()}), proc.stderr
    for line in lines:
        assert "git.example.org" in line and "CONNECT" in line and "403" in line, line
    assert set(asked) == {"CONNECT git.example.org:443 HTTP/1.1"}
    assert "the git remote https://git.example.org/ROCm/aiter.git (commits)" in summary


@pytest.mark.parametrize("value", ["nan", "0", "soon", "99999999", "1e10"])
def test_pins_connect_timeout_must_be_a_positive_finite_number(value, tree, refused):
    d = model.load(tree / "versions.json")
    d["vllm"]["index_url"] = f"https://{refused}/pypi"
    model.dump(d, tree / "versions.json")
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", str(tree / "versions.json"), "discover",
                           "--list"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=offline_env(PINS_CONNECT_TIMEOUT=value))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"error: PINS_CONNECT_TIMEOUT={value!r} is not a number of seconds more than 0 "
                                   "and at most 86400")


# ---- the base image digest, read by the real `docker buildx imagetools inspect` -----------------

def buildx() -> None:
    if shutil.which(os.environ.get("DOCKER") or "docker") is None:
        pytest.skip("no docker client in PATH (bash ci/test-machine/docker-engine.sh start installs one)")
    if subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker buildx plugin not found "
                    "(eval \"$(bash ci/test-machine/docker-engine.sh env)\" sets DOCKER_CONFIG)")


@pytest.fixture()
def registry():
    """A v2 registry on 127.0.0.1 serving one image index (one linux/amd64 manifest and its config),
    content-addressed; `lie` makes it answer the tag with another document than its digest names."""
    import http.server
    import threading

    blobs: dict[str, bytes] = {}
    types: dict[str, str] = {}

    def put(doc: dict, media_type: str = "application/octet-stream") -> tuple[str, int]:
        body = json.dumps(doc).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        blobs[digest], types[digest] = body, media_type
        return digest, len(body)

    cfg = put({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}, "config": {}})
    man = put({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": [],
               "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg[0], "size": cfg[1]}},
              "application/vnd.oci.image.manifest.v1+json")
    index = put({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man[0], "size": man[1],
         "platform": {"architecture": "amd64", "os": "linux"}}]}, "application/vnd.oci.image.index.v1+json")
    state = {"lie": False, "tags": {"7.2.3-complete": index[0]}}

    class Registry(http.server.BaseHTTPRequestHandler):
        def answer(self, body: bool) -> None:
            ref = self.path.rsplit("/", 1)[-1]
            digest = state["tags"].get(ref, ref)
            if digest not in blobs or not self.path.startswith("/v2/rocm/dev-ubuntu-22.04/"):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = blobs[digest] + (b" " if state["lie"] else b"")
            self.send_response(200)
            self.send_header("Content-Type", types[digest])
            self.send_header("Docker-Content-Digest", digest)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_HEAD(self) -> None:
            self.answer(False)

        def do_GET(self) -> None:
            self.answer(True)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"host": f"127.0.0.1:{server.server_address[1]}", "digest": index[0], "state": state}
    server.shutdown()
    server.server_close()


def resolve_base_image(tree, host: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PINS_TIMEOUT": "60", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    return subprocess.run([sys.executable, "-m", "tools.pins", "--file", str(tree / "versions.json"), "resolve",
                           "base-image", "--registry", host, "--write"], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120)


def test_base_image_digest_is_the_index_the_registry_serves(tree, registry):
    buildx()
    proc = resolve_base_image(tree, registry["host"])
    assert proc.returncode == 0, proc.stderr
    written = model.load(tree / "versions.json")["base_image"]
    assert written["digest"] == registry["digest"]
    assert "digest" not in written["unresolved"]


def test_base_image_content_that_does_not_match_its_digest_is_refused(tree, registry):
    buildx()
    registry["state"]["lie"] = True
    proc = resolve_base_image(tree, registry["host"])
    assert proc.returncode == 1
    line, summary = proc.stderr.strip().splitlines()
    assert line.startswith("error: base_image: ") and registry["host"] in line and "unexpected digest" in line, line
    assert summary.startswith("error: resolve: 1 of 1 item(s) not resolved (base_image)"), summary
    assert model.load(tree / "versions.json")["base_image"]["digest"] is None


def test_base_image_unknown_tag_fails_in_one_line_naming_the_pin(tree, registry):
    buildx()
    registry["state"]["tags"].clear()
    proc = resolve_base_image(tree, registry["host"])
    assert proc.returncode == 1
    line, summary = proc.stderr.strip().splitlines()
    assert "versions.json base_image" in line, proc.stderr
    assert f"the container registry of {registry['host']}" in summary, summary


def test_image_ref_on_another_registry():
    assert resolve.image_ref("rocm/dev-ubuntu-22.04", "7.2.3-complete") == "rocm/dev-ubuntu-22.04:7.2.3-complete"
    assert resolve.image_ref("rocm/dev", "t", "mirror.local:5000") == "mirror.local:5000/rocm/dev:t"
    assert resolve.image_ref("ghcr.io/org/img", "t", "mirror.local") == "mirror.local/org/img:t"


# ---- nothing else is derived from an AITER pin's code ---------------------------------------------

def test_resolve_aiter_writes_only_the_pins_whatever_the_dispatch_code(data, tree, upstream):
    """resolve aiter --write on a commit whose MLA kernel lists and dispatch code are like no AITER
    release's: the pin resolves, and the versions file and the Dockerfiles' defaults are all it
    writes (no file derived from AITER's code, nothing under backend/)."""
    from tools.pins import __main__ as cli

    repo = upstream["path"]
    (repo / "hsa" / "gfx942" / "mla").mkdir(parents=True)
    (repo / "hsa" / "gfx942" / "mla" / "mla_asm.csv").write_text("qType,co_name\nbf16,mla_new.co\n")
    (repo / "aiter" / "mla.py").write_text("def mla_decode_fwd(q):\n    return 'a dispatch no release has'\n")
    commit_all(repo, "new kernel lists and dispatch code")
    git("tag", "-a", "v1.1", "-m", "release", cwd=repo)
    d = _aiter_data(data, upstream)
    d["aiter"]["pins"]["test"]["tag"] = "v1.1"
    model.dump(d, tree / "versions.json")
    before = {p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    assert cli.main(["--file", str(tree / "versions.json"), "resolve", "aiter", "--aiter-pin", "test",
                     "--write"]) == 0
    after = {p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    assert set(after) == set(before)
    changed = {name for name in after if after[name] != before[name]}
    assert "versions.json" in changed and changed <= {"versions.json", *model.DOCKERFILES}
    pin = model.load(tree / "versions.json")["aiter"]["pins"]["test"]
    assert pin["commit"] == git("rev-parse", "HEAD", cwd=repo)
    assert pin["requirements_lock_sha256"] == model.NO_REQUIREMENTS  # the commit has no requirements.txt


def test_resolve_write_goes_through_a_symlinked_versions_file(tree, upstream):
    """A versions file that is a symbolic link keeps being one: its target gets the change."""
    real = tree / "real"
    real.mkdir()
    d = _aiter_data(model.load(tree / "versions.json"), upstream)
    model.dump(d, real / "versions.json")
    (tree / "versions.json").unlink()
    (tree / "versions.json").symlink_to(real / "versions.json")
    proc = run_tool("--file", str(tree / "versions.json"), "resolve", "aiter", "--aiter-pin", "test", "--write")
    assert proc.returncode == 0, proc.stderr
    assert (tree / "versions.json").is_symlink()
    assert model.load(real / "versions.json")["aiter"]["pins"]["test"]["commit"] == upstream["commit"]


@pytest.mark.parametrize("remote", ["/nonexistent/aiter", "git@127.0.0.1:ROCm/aiter.git", "file:///nonexistent/x.git"])
def test_a_git_remote_that_fails_is_named_with_gits_own_reason(tree, remote):
    """A local path or an ssh address (no '://') is named in the one line, beside git's reason."""
    d = model.load(tree / "versions.json")
    d["aiter"]["repository"] = remote
    model.dump(d, tree / "versions.json")
    env = {**os.environ, "PINS_TIMEOUT": "20", "GIT_SSH_COMMAND": "ssh -o BatchMode=yes -o ConnectTimeout=5"}
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", str(tree / "versions.json"), "resolve",
                           "aiter"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    *lines, summary = proc.stderr.strip().splitlines()
    assert len(lines) == len({own["aiter"] for own in d["tracks"].values()}), proc.stderr  # each track's pin
    for line in lines:
        assert f"git ls-remote {remote} failed: " in line, lines
        reason = line.split(" failed: ", 1)[1]
        assert reason and reason != "exit status 128", lines
    assert f"the git remote {remote} (commits)" in summary, summary
