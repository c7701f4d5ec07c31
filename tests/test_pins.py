"""versions.json and the pin tool (python3 -m ci.pins)."""
import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci.pins import model, resolve, verify

ROOT = Path(__file__).resolve().parents[1]
KNOWN_AITER = "de07f3885ee5f2030ba72b6cc5940d674fd457cf"
KNOWN_CK = "f33252cebe5a52362ec1ee12c124dde7800dda3a"


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
    return subprocess.run([sys.executable, "-m", "ci.pins", *args], cwd=cwd, capture_output=True, text=True)


def test_repository_versions_file_verifies():
    proc = run_tool("verify")
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout


def test_strict_fails_on_unresolved_and_names_each(data):
    unresolved = model.unresolved_pins(data, data["aiter"]["default"])
    proc = run_tool("verify", "--strict")
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
    assert data["vllm"]["version"] == "0.32.0"


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
        "bad sha256": (lambda d: (d["pytorch"]["wheels"]["torch"].update(sha256="abc"),
                                  d["pytorch"]["wheels"]["torch"]["unresolved"].clear()), "64 lowercase hex"),
        "bad digest": (lambda d: (d["base_image"].update(digest="sha256:1234"),
                                  d["base_image"]["unresolved"].clear()), "sha256:<64"),
        "unknown arch": (setp(["gpu_archs"], ["gfx942", "gfx90a"]), "gfx90a"),
        "empty archs": (setp(["gpu_archs"], []), "gpu_archs: empty"),
        "null not listed": (lambda d: d["vllm"]["unresolved"].clear(), "vllm.commit is null but not listed"),
        "set but listed": (lambda d: d["aiter"]["pins"]["v0.1.20.post1"]["unresolved"].append("commit"),
                           "still listed"),
        "default pin missing": (setp(["aiter", "default"], "v9"), "aiter.default"),
        "latest tag": (setp(["base_image", "tag"], "latest"), "latest"),
        "missing section": (lambda d: d.pop("vllm"), "vllm: missing"),
        "vllm prefix mismatch": (lambda d: (d["vllm"].update(commit="f" * 40), d["vllm"]["unresolved"].clear()),
                                 "commit_prefix"),
        "ck without commit": (lambda d: (d["aiter"]["pins"]["v0.1.24.post1"].update(ck_commit=KNOWN_CK),
                                         d["aiter"]["pins"]["v0.1.24.post1"]["unresolved"].remove("ck_commit")),
                              "comes from the AITER commit"),
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


def test_dockerfile_default_drift_is_caught_and_sync_fixes_it(tree):
    path = tree / "Dockerfile.rocm_base"
    text = path.read_text()
    assert "ARG GPU_ARCHS=gfx942;gfx950\n" in text
    path.write_text(text.replace("ARG GPU_ARCHS=gfx942;gfx950\n", "ARG GPU_ARCHS=gfx942\n", 1))
    proc = run_tool("--file", str(tree / "versions.json"), "verify")
    assert proc.returncode == 1 and "ARG GPU_ARCHS" in proc.stderr
    assert run_tool("--file", str(tree / "versions.json"), "sync").returncode == 0
    assert path.read_text() == text
    assert run_tool("--file", str(tree / "versions.json"), "verify").returncode == 0


def test_every_versions_build_arg_is_declared_in_dockerfile(data):
    declared = {name for _, name, _ in model.dockerfile_arg_defaults((ROOT / "Dockerfile.rocm_base").read_text())}
    needed = set(model.build_args(data)) - {"VLLM_REPO", "VLLM_TAG", "VLLM_VERSION", "VLLM_COMMIT"}
    assert needed <= declared, needed - declared


def test_args_render_unresolved_and_allow(data):
    args = model.build_args(data)
    if data["base_image"]["digest"] is None:
        assert args["ROCM_IMAGE"].endswith("@sha256:UNRESOLVED")
        assert "@" not in model.build_args(data, allow_unresolved=True)["ROCM_IMAGE"]
    known = model.build_args(data, "v0.1.20.post1")
    assert known["AITER_COMMIT"] == KNOWN_AITER and known["AITER_CK_COMMIT"] == KNOWN_CK
    assert args["GPU_ARCHS"] == "gfx942;gfx950"


def test_strict_for_the_known_aiter_pin_ignores_other_aiter_pins(data, tree):
    errors, unresolved = verify.verify(data, strict=True, root=tree, aiter_name="v0.1.20.post1")
    assert not any(p.startswith("aiter.") for p in unresolved)
    assert not any("aiter.pins" in e for e in errors)


# ---- resolve, against local git repositories -------------------------------------------------

def git(*args, cwd):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always",
                           *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def upstream(tmp_path):
    """A repository with a CK submodule and tags, like AITER."""
    ck = tmp_path / "ck"
    ck.mkdir()
    git("init", "-q", "-b", "main", cwd=ck)
    (ck / "ck.h").write_text("1\n")
    git("add", ".", cwd=ck)
    git("commit", "-qm", "ck", cwd=ck)
    ck_commit = git("rev-parse", "HEAD", cwd=ck)
    repo = tmp_path / "aiter"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    (repo / "setup.py").write_text("\n")
    git("add", ".", cwd=repo)
    git("submodule", "add", "-q", ck.as_uri(), "3rdparty/composable_kernel", cwd=repo)
    git("commit", "-qm", "aiter", cwd=repo)
    git("tag", "-a", "v1.0", "-m", "release", cwd=repo)
    return {"url": repo.as_uri(), "commit": git("rev-parse", "HEAD", cwd=repo), "ck": ck_commit, "path": repo}


def _aiter_data(data, upstream, commit=None, ck=None):
    d = copy.deepcopy(data)
    d["aiter"]["repository"] = upstream["url"]
    d["aiter"]["pins"]["test"] = {"tag": "v1.0", "commit": commit, "ck_commit": ck,
                                  "unresolved": [k for k, v in (("commit", commit), ("ck_commit", ck)) if v is None]}
    return d


def test_resolve_aiter_tag_and_ck_submodule(data, upstream):
    d = _aiter_data(data, upstream)
    changes = resolve.resolve_aiter(d, "test")
    pin = d["aiter"]["pins"]["test"]
    assert pin["commit"] == upstream["commit"]  # the annotated tag is peeled to its commit
    assert pin["ck_commit"] == upstream["ck"]
    assert pin["unresolved"] == [] and len(changes) == 2
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
    d["vllm"].update(repository=upstream["url"], tag="v1.0", commit=None, unresolved=["commit"])
    d["vllm"]["commit_prefix"] = "0000000"
    with pytest.raises(model.PinError, match="does not start with"):
        resolve.resolve_vllm(d)
    d["vllm"]["commit_prefix"] = upstream["commit"][:9]
    resolve.resolve_vllm(d)
    assert d["vllm"]["commit"] == upstream["commit"] and d["vllm"]["unresolved"] == []


def test_resolve_write_updates_file_and_dockerfiles(tree, upstream):
    d = model.load(tree / "versions.json")
    d["aiter"]["repository"] = upstream["url"]
    d["aiter"]["pins"]["test"] = {"tag": "v1.0", "commit": None, "ck_commit": None, "unresolved": ["commit", "ck_commit"]}
    d["aiter"]["default"] = "test"
    model.dump(d, tree / "versions.json")
    proc = run_tool("--file", str(tree / "versions.json"), "resolve", "aiter", "--write")
    assert proc.returncode == 0, proc.stderr
    after = model.load(tree / "versions.json")
    assert after["aiter"]["pins"]["test"]["commit"] == upstream["commit"]
    text = (tree / "Dockerfile.rocm_base").read_text()
    assert f"ARG AITER_COMMIT={upstream['commit']}" in text
    assert f"ARG AITER_CK_COMMIT={upstream['ck']}" in text
    assert run_tool("--file", str(tree / "versions.json"), "verify").returncode == 0


def test_wheel_picking_and_required_version():
    links = [("torch-2.13.0+rocm7.2-cp312-cp312-manylinux_2_28_x86_64.whl", "u1#sha256=" + "a" * 64, {}),
             ("torch-2.13.0+rocm7.2-cp311-cp311-manylinux_2_28_x86_64.whl", "u2", {}),
             ("pytorch_triton_rocm-3.8.0-cp312-cp312-linux_x86_64.whl", "u3", {})]
    assert resolve.pick_wheel(links, "torch", "2.13.0+rocm7.2", "3.12")[1].startswith("u1")
    assert resolve.pick_wheel(links, "pytorch-triton-rocm", "3.8.0", "3.12")[1] == "u3"
    with pytest.raises(model.PinError, match="cp313"):
        resolve.pick_wheel(links, "torch", "2.13.0+rocm7.2", "3.13")
    assert resolve.wheel_sha256("https://x/y.whl#sha256=" + "b" * 64) == "b" * 64
    meta = "Name: torch\nRequires-Dist: pytorch-triton-rocm==3.8.0+git669b31a; platform_system == \"Linux\"\n"
    assert resolve.required_version(meta, "pytorch-triton-rocm") == "3.8.0+git669b31a"
