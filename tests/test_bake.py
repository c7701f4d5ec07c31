"""docker-bake.hcl: `docker buildx bake --print` resolves and passes what docker-bake.pins.json renders from
versions.json (the rendering itself: tests/test_render_pins.py)."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.pins import model, render

ROOT = Path(__file__).resolve().parents[1]


PINS = str(render.BAKE_PINS)


def bake_print(*targets, env=None, files=("docker-bake.hcl", PINS)):
    if not shutil.which("docker"):
        pytest.skip("no docker client in PATH")
    if subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker buildx plugin not found (see ci/test-machine/docker-engine.sh env: DOCKER_CONFIG)")
    cmd = ["docker", "buildx", "bake", "--print"]
    for f in files:
        cmd += ["-f", f]
    proc = subprocess.run(cmd + list(targets), cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    return proc


def printed(*targets, env=None):
    proc = bake_print(*targets, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["target"]


# Build args that are settings of a build, not pins (bake variables of their own).
SETTINGS = {"ALLOW_UNRESOLVED", "VCS_REF", "MAX_JOBS", "AITER_MEM_PER_JOB_GIB", "VLLM_IMAGE", "AITER_CALLS_CHECK",
            "PYPI_INDEX_URL"}
# versions.json leaves pins unresolved until `python3 -m tools.pins resolve --write` runs on a connected
# machine, and bake stops a ROCm target that builds from one: tests of other settings print the
# ROCm targets as a development build does.
DEV = {"ALLOW_UNRESOLVED": "1"}


def pins_file(data, path):
    """The bake pins file `python3 -m tools.pins render` writes for a versions file of `data`, at path."""
    path.write_text(render.bake_text(data))
    return path


def resolved(data, tmp_path, keep=()):
    """The bake pins file of a versions file with every unresolved pin given a well-formed value (as
    `tools.pins resolve` writes them), but the dotted paths in keep, which stay null; that versions
    file is versions.json beside it."""
    data = json.loads(json.dumps(data))

    def fill(node, path):
        if isinstance(node, dict):
            for name in list(node.get("unresolved") or []):
                if f"{path}{name}" in keep:
                    continue
                node[name] = {"digest": "sha256:" + "d" * 64, "sha256": "e" * 64,
                              "lock_sha256": "e" * 64, "requirements_lock_sha256": "e" * 64}.get(name, "c" * 40)
                node["unresolved"].remove(name)
            for key, value in node.items():
                fill(value, f"{path}{key}.")

    fill(data, "")
    (tmp_path / "versions.json").write_text(json.dumps(data))
    return pins_file(data, tmp_path / PINS)


@pytest.mark.parametrize("track", model.built_track_names(model.load()))
def test_base_args_equal_versions_file(track, tmp_path):
    """bake passes the rendered args unchanged: tools.pins build_args, one per pin, byte for byte, for every
    track: unresolved pins (UNRESOLVED, the image without its digest under ALLOW_UNRESOLVED=1), and
    resolved ones."""
    data = model.load()
    for name, target in printed("base", "serve", env={"TRACK": track, **DEV}).items():
        args = target["args"]
        assert {k: v for k, v in args.items() if k not in SETTINGS} == \
            model.build_args(data, track_name_=track, allow_unresolved=True), name
    assert args["SOURCE_DATE_EPOCH"] == str(data["source_date_epoch"])
    path = resolved(data, tmp_path)
    proc = bake_print("base", "serve", env={"TRACK": track, "ALLOW_UNRESOLVED": "0"},
                      files=("docker-bake.hcl", str(path)))
    assert proc.returncode == 0, proc.stderr
    for name, target in json.loads(proc.stdout)["target"].items():
        args = {k: v for k, v in target["args"].items() if k not in SETTINGS}
        assert args == model.build_args(model.load(tmp_path / "versions.json"), track_name_=track), name


def test_base_target_settings():
    base = printed("base", env=DEV)["base"]
    assert base["dockerfile"] == "Dockerfile.rocm_base" and base["target"] == "final"
    assert any("rewrite-timestamp=true" in o for o in base["output"])
    assert any(s.startswith("id=ca-bundle") for s in base["secret"])


def test_overrides_from_environment():
    args = printed("base", env={"GPU_ARCHS": "gfx942", "AITER_PIN": "v0.1.20.post1",
                                "ALLOW_UNRESOLVED": "1"})["base"]["args"]
    data = model.load()
    known = data["aiter"]["pins"]["v0.1.20.post1"]
    assert args["GPU_ARCHS"] == "gfx942"
    expected = model.build_args(data, "v0.1.20.post1")
    assert all(args[k] == expected[k] for k in expected if k.startswith(("AITER_", "CK_", "HIPKITTENS_")))
    assert (args["AITER_COMMIT"], args["CK_COMMIT"]) == (known["commit"], known["ck_commit"])
    assert args["ROCM_IMAGE"] == model.build_args(data, allow_unresolved=True)["ROCM_IMAGE"]


def test_cache_settings_overridable():
    base = printed("base", env={"CACHE_FROM": "type=registry,ref=r/x:cache",
                                "CACHE_TO": "type=registry,ref=r/x:cache,mode=max", **DEV})["base"]
    assert base["cache-from"] == ["type=registry,ref=r/x:cache"]
    assert base["cache-to"] == ["type=registry,ref=r/x:cache,mode=max"]


def test_validate_group_resolves():
    targets = printed("validate", env=DEV)
    assert targets and all(t["dockerfile"] == "Dockerfile.rocm_base" for t in targets.values())


def test_fails_loudly_without_the_pins_file():
    proc = bake_print("base", files=("docker-bake.hcl",))
    assert proc.returncode != 0
    assert "variable" in proc.stderr.lower()


def test_unknown_aiter_pin_fails_in_one_line_naming_the_pins():
    proc = bake_print("base", env={"AITER_PIN": "v0.0.0"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr
    known = ", ".join(sorted(model.load()["aiter"]["pins"]))
    assert f"AITER_PIN=v0.0.0 is no pin of aiter.pins in versions.json; the pins: {known}" in errors[0], errors[0]


def test_image_targets_use_dockerfile_rocm():
    targets = printed("vllm", "serve", "ci", env=DEV)
    for name in ("vllm", "serve", "ci"):
        assert targets[name]["dockerfile"] == "Dockerfile.rocm"
        assert targets[name]["target"] == name
        assert targets[name]["contexts"]["base"] == "target:base"
        expected = model.build_args(model.load())
        assert all(targets[name]["args"][k] == expected[k] for k in expected if k.startswith(("VLLM_", "TRITON_")))


def test_ray_comes_from_its_lock_not_from_build_args():
    """Ray is installed from docker/requirements-ray.txt (a lock), so no target passes Ray
    versions or hashes as build args."""
    proc = bake_print("serve", "ci", env=DEV)
    assert proc.returncode == 0, proc.stderr
    for target in json.loads(proc.stdout)["target"].values():
        assert not [a for a in target["args"] if a.startswith("RAY_")], target["args"]


SHA = "0123456789abcdef0123456789abcdef01234567"
ATTESTATIONS = ["type=sbom", "type=provenance,mode=max"]
CLEAR = {"PUSH": "0", "CACHE_FROM": "", "CACHE_TO": "", "TAG": "dev", "REGISTRY": "localhost/rocm-vllm"}


@pytest.mark.parametrize("track", model.built_track_names(model.load()))
def test_local_images_are_tagged_per_track_without_push_cache_or_attestations(track):
    """<name>:<TAG>-vllm<track>, plus <name>:<TAG> for the default track; nothing pushed."""
    data = model.load()
    targets = printed("base", "vllm", "serve", "ci", env={**CLEAR, **DEV, "TRACK": track, "TAG": "t1"})
    for name, target in targets.items():
        plain = [f"localhost/rocm-vllm/{name}:t1"] if track == data["default_track"] else []
        assert target["tags"] == [f"localhost/rocm-vllm/{name}:t1-vllm{track}"] + plain
        assert not target.get("attest") and not target.get("cache-from") and not target.get("cache-to")
        assert target["output"] == ["type=image,rewrite-timestamp=true"]


def pushed(track=None, **env):
    full = {**CLEAR, **DEV, "PUSH": "1", "REGISTRY": "registry.example/team", "TAG": "main", "VCS_REF": SHA, **env}
    if track:
        full["TRACK"] = track
    return printed("base", "serve", "ci", env=full)


@pytest.mark.parametrize("track", model.built_track_names(model.load()))
def test_pushed_images_tags_cache_and_attestations_follow_the_versions_file(track):
    """PUSH=1: the commit tag vllm<version>-aiter<12 hex>-<12 hex of VCS_REF> and the branch tag
    (-vllm<track> outside the default track); one registry cache ref per target, the base's
    without the vLLM version but with the track's ROCm stack kind; SBOM and provenance; pushed."""
    data = model.load()
    pin = "v0.1.20.post1"
    commit = data["aiter"]["pins"][pin]["commit"][:12]
    version = data["tracks"][track]["vllm"]["version"]
    archs = "-".join(data["gpu_archs"])
    stack = model.track_stack(data, track)
    floating = "main" if track == data["default_track"] else f"main-vllm{track}"
    for name, target in pushed(track, AITER_PIN=pin).items():
        image = f"registry.example/team/{name}"
        assert target["tags"] == [f"{image}:vllm{version}-aiter{commit}-{SHA[:12]}", f"{image}:{floating}"]
        key = f"base-{stack}-aiter{commit}-{archs}" if name == "base" else f"{name}-vllm{version}-aiter{commit}-{archs}"
        assert target["cache-from"] == [f"type=registry,ref=registry.example/team/buildcache:{key}"]
        assert target["cache-to"] == [f"type=registry,ref=registry.example/team/buildcache:{key},mode=max"]
        assert target["attest"] == ATTESTATIONS
        assert target["output"] == ["type=image,rewrite-timestamp=true,push=true"]


def test_pushed_settings_are_switches():
    """ATTEST=0 drops the attestations, CACHE_REPO moves (or, empty, drops) the registry cache,
    CACHE_FROM/CACHE_TO add to it, TAG empty leaves the commit tag alone."""
    base = pushed(ATTEST="0", CACHE_REPO="cache.example/c", CACHE_FROM="type=local,src=/c",
                  CACHE_TO="type=local,dest=/c", TAG="")["base"]
    assert not base.get("attest")
    assert base["cache-from"][0] == "type=local,src=/c"
    data = model.load()
    stack = model.track_stack(data, data["default_track"])
    assert base["cache-from"][1].startswith(f"type=registry,ref=cache.example/c:base-{stack}-aiter")
    assert base["cache-to"][0] == "type=local,dest=/c" and base["cache-to"][1].endswith(",mode=max")
    assert len(base["tags"]) == 1 and base["tags"][0].endswith(f"-{SHA[:12]}")
    base = pushed(CACHE_REPO="")["base"]
    assert not base.get("cache-from") and not base.get("cache-to") and base["attest"] == ATTESTATIONS


def test_an_unresolved_aiter_commit_is_named_in_the_pushed_tag(tmp_path):
    data = model.load()
    own = data["tracks"][data["default_track"]]
    data["aiter"]["pins"][own["aiter"]]["commit"] = None
    path = pins_file(data, tmp_path / PINS)
    env = {**CLEAR, **DEV, "PUSH": "1", "REGISTRY": "registry.example/team", "VCS_REF": SHA}
    proc = bake_print("serve", env=env, files=("docker-bake.hcl", str(path)))
    assert proc.returncode == 0, proc.stderr
    serve = json.loads(proc.stdout)["target"]["serve"]
    version = own["vllm"]["version"]
    assert serve["tags"][0] == f"registry.example/team/serve:vllm{version}-aiterUNRESOLVED-{SHA[:12]}"
    assert f":serve-vllm{version}-aiterUNRESOLVED-" in serve["cache-from"][0]


@pytest.mark.parametrize("env,names", [({"VCS_REF": "0123abc"}, "VCS_REF"), ({"VCS_REF": ""}, "VCS_REF"),
                                       ({"GPU_ARCHS": ";"}, "GPU_ARCHS")])
def test_pushed_images_need_a_commit_and_archs(env, names):
    proc = bake_print("base", env={**CLEAR, "PUSH": "1", "VCS_REF": SHA, **env})
    assert proc.returncode != 0
    assert f'"{names}_' in proc.stderr, proc.stderr


# ---- unresolved pins: bake stops a ROCm target before anything is pulled or built ---------------

ROCM_TARGETS = ("base", "vllm", "serve", "ci")


def stop_line(proc) -> str:
    """bake's one error line (its other stderr lines are progress: '#1 [internal] load ...')."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr
    return errors[0]


def named_pins(line: str) -> set[str]:
    """The pins a stop line names: 'TARGET (track T): it builds from N unresolved pin(s) of
    versions.json: a, b, c: run python3 -m tools.pins resolve --write ...'."""
    listed = line.split(" unresolved pin(s) of versions.json: ", 1)[1].split(": run ", 1)[0]
    return set(listed.split(", "))


def unresolved(data, tmp_path):
    """(data, its bake pins file): the versions file with every pin `tools.pins resolve` finds (commits,
    the image digest, the locks' sha256) unresolved again: null, and named in its object's unresolved list."""
    data = json.loads(json.dumps(data))

    def unset(node, *names):
        for name in names:
            node[name] = None
            node.setdefault("unresolved", [])
            node["unresolved"] += [] if name in node["unresolved"] else [name]

    for own in [data, *data["tracks"].values()]:
        if "base_image" in own:
            unset(own["base_image"], "digest")
        if "pytorch" in own:
            unset(own["pytorch"], "lock_sha256")
    for pin in data["aiter"]["pins"].values():
        unset(pin, "commit", "ck_commit", "hipkittens_commit", "requirements_lock_sha256")
    for own in data["tracks"].values():
        unset(own["vllm"], "commit")
        if "therock" in own:
            unset(own["therock"], "lock_sha256")
            unset(own["therock"]["triton"], "commit")
    return data, pins_file(data, tmp_path / "unresolved.bake.json")


@pytest.mark.parametrize("track", model.built_track_names(model.load()))
def test_unresolved_pins_stop_each_rocm_target_in_one_line_naming_every_one(track, tmp_path):
    """Pins unresolved (as on a machine where `resolve` has not run): every ROCm target stops bake
    in one line naming the target, each unresolved pin it builds from (the track's AITER pin, the
    base image, the wheels, and for the vLLM targets the track's vLLM) and the command that
    resolves them; ALLOW_UNRESOLVED=1 lets it through. The CPU path builds from none of them."""
    data, path = unresolved(model.load(), tmp_path)
    files = ("docker-bake.hcl", str(path))
    pins = set(model.unresolved_pins(data, track_name_=track))
    vllm_pins = {p for p in pins if p.startswith(f"tracks.{track}.vllm.")}
    assert vllm_pins and pins - vllm_pins
    for target in ROCM_TARGETS:
        line = stop_line(bake_print(target, env={**CLEAR, "TRACK": track, "ALLOW_UNRESOLVED": "0"}, files=files))
        want = pins if target != "base" else pins - vllm_pins
        assert f"{target} (track {track}): it builds from {len(want)} unresolved pin(s) of versions.json: " in line
        assert named_pins(line) == want, line
        assert "run python3 -m tools.pins resolve --write" in line and "ALLOW_UNRESOLVED=1" in line, line
        assert "UNRESOLVED@" not in line and "invalid reference format" not in line
    proc = bake_print(*ROCM_TARGETS, env={**CLEAR, "TRACK": track, **DEV}, files=files)
    assert proc.returncode == 0 and set(json.loads(proc.stdout)["target"]) == set(ROCM_TARGETS), proc.stderr
    proc = bake_print("cpu", env={**CLEAR, "TRACK": track, "ALLOW_UNRESOLVED": "0"}, files=files)
    assert proc.returncode == 0 and set(json.loads(proc.stdout)["target"]) == {"serve-cpu", "ci-cpu"}, proc.stderr


def test_the_default_track_builds_vllm_0_34_on_the_therock_base(tmp_path):
    """`bake --print serve ci` for the default track: vLLM 0.34 on TheRock (ROCM_STACK=therock, the
    base stages FROM plain ubuntu by digest, PyTorch from the TheRock lock: the PyTorch args empty). With
    its pins unresolved, as versions.json holds them here, bake stops in one line naming each one
    (the TheRock lock's sha256 among them, never the shared pytorch section's wheels) and the
    indexes resolve must reach."""
    data = model.load()
    track = data["default_track"]
    assert data["tracks"][track]["vllm"]["version"].startswith("0.34.") and \
        model.track_stack(data, track) == model.THEROCK_STACK
    for target in ("serve", "ci"):
        line = stop_line(bake_print(target, env={**CLEAR, "ALLOW_UNRESOLVED": "0"}))
        assert named_pins(line) == set(model.unresolved_pins(data, track_name_=track)), line
        assert f"tracks.{track}.therock.lock_sha256" in named_pins(line)
        assert not any(p.startswith("pytorch.") for p in named_pins(line)) and "TheRock's wheel index" in line
    path = resolved(data, tmp_path)
    proc = bake_print("serve", "ci", env=CLEAR, files=("docker-bake.hcl", str(path)))
    assert proc.returncode == 0, proc.stderr
    base = data["tracks"][track]["base_image"]
    targets = json.loads(proc.stdout)["target"]
    assert set(targets) == {"base", "serve", "ci"} and targets["base"]["dockerfile"] == "Dockerfile.rocm_base"
    for name, target in targets.items():
        args = target["args"]
        assert args["VLLM_VERSION"] == data["tracks"][track]["vllm"]["version"] and args["ROCM_STACK"] == "therock"
        assert args["ROCM_IMAGE"] == f"{base['name']}:{base['tag']}@{base['digest']}"
        assert args["PYTORCH_LOCK"] == args["TORCH_VERSION"] == "" and args["THEROCK_LOCK"] == f"therock-{track}.txt"
        assert name == "base" or target["contexts"]["base"] == "target:base"


def test_each_target_is_stopped_only_by_the_pins_it_builds_from(tmp_path):
    """A versions file resolved but for a few pins: a target builds unless one of its own pins is
    missing. The vLLM commit stops vllm, serve and ci (not base, nor serve on an existing vLLM
    image); the HipKittens commit stops the base (not the AITER source check, group validate); the
    base image digest stops every ROCm target; the CPU path is never stopped."""
    data = model.load()
    track = data["default_track"]
    pin = data["tracks"][track]["aiter"]
    env = {**CLEAR, "TRACK": track, "ALLOW_UNRESOLVED": "0", "VLLM_IMAGE": ""}
    data = json.loads(json.dumps(data))

    def bake(keep, *targets, **more):
        return bake_print(*targets, env={**env, **more}, files=("docker-bake.hcl", str(resolved(data, tmp_path, keep))))

    everything = ("validate", *ROCM_TARGETS, "cpu")
    assert bake((), *everything).returncode == 0  # every pin resolved: nothing stops

    commit = f"tracks.{track}.vllm.commit"
    assert bake({commit}, "base", "validate", "cpu").returncode == 0
    for target in ("vllm", "serve", "ci"):
        assert named_pins(stop_line(bake({commit}, target))) == {commit}
    assert bake({commit}, "serve", VLLM_IMAGE="registry.example/vllm-rocm:v1").returncode == 0

    hipkittens = f"aiter.pins.{pin}.hipkittens_commit"
    assert bake({hipkittens}, "validate", "cpu").returncode == 0
    assert named_pins(stop_line(bake({hipkittens}, "base"))) == {hipkittens}

    own = "base_image" in data["tracks"][track]
    digest = f"tracks.{track}.base_image.digest" if own else "base_image.digest"
    image = data["tracks"][track]["base_image"] if own else data["base_image"]
    image.update(digest=None, unresolved=["digest"])
    for target in ("validate", *ROCM_TARGETS):
        assert named_pins(stop_line(bake({digest}, target))) == {digest}
    assert bake({digest}, "cpu").returncode == 0

    if model.track_stack(data, track) == model.THEROCK_STACK:
        # the TheRock lock and the Triton source: the base and what builds on it, not the AITER source
        for pin in (f"tracks.{track}.therock.lock_sha256", f"tracks.{track}.therock.triton.commit"):
            node = data["tracks"][track]["therock"]
            node = node["triton"] if pin.endswith("triton.commit") else node
            node.update({pin.rsplit(".", 1)[1]: None, "unresolved": [pin.rsplit(".", 1)[1]]})
            assert bake({pin}, "validate", "cpu").returncode == 0
            for target in ROCM_TARGETS:
                assert named_pins(stop_line(bake({pin}, target))) == {pin}


@pytest.mark.parametrize("target", ["base", "serve", "serve-cpu"])
def test_a_track_typo_stops_in_one_line_naming_the_known_tracks(target):
    """TRACK=0.3 (a typo): one error line naming the setting and versions.json's tracks, not HCL's
    'Invalid index'."""
    proc = bake_print(target, env={**CLEAR, "TRACK": "0.3", "ALLOW_UNRESOLVED": "1"})
    known = ", ".join(sorted(model.load()["tracks"]))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr[-1500:]
    assert f"TRACK=0.3 is no release track of versions.json; the tracks: {known}" in errors[0], errors[0]
    assert "Invalid index" not in proc.stderr


# ---- an existing vLLM image (VLLM_IMAGE): no base target, no pin of the base or AITER -------------

EXISTING = "registry.example/vllm/vllm-openai-rocm:v0.34.0"
# The build args of Dockerfile.rocm on an existing image: settings, the track and its vLLM release.
EMBED_ARGS = {"VLLM_IMAGE", "VLLM_TRACK", "VLLM_VERSION", "GPU_ARCHS", "SOURCE_DATE_EPOCH", "VCS_REF",
              "ALLOW_UNRESOLVED", "AITER_CALLS_CHECK"}


def every_base_pin_unresolved(data, tmp_path, track):
    """(data, its bake pins file): the versions file with every pin the track's base image and vLLM source
    build from that versions.schema.json lets be null, null (and listed unresolved): the base image's name, tag and
    digest, AITER's repositories and its pin's commits and lock, the PyTorch or TheRock index and
    lock, the Triton source, vLLM's commit."""
    data, _ = unresolved(data, tmp_path)
    own = data["tracks"][track]

    def unset(node, *names):
        for name in names:
            node[name] = None
            node["unresolved"] = sorted(set(node.get("unresolved") or []) | {name})

    unset(own.get("base_image", data["base_image"]), "name", "tag", "digest")
    unset(data["aiter"], "repository", "ck_submodule_path", "hipkittens_repository")
    unset(data["aiter"]["pins"][own["aiter"]], "commit", "ck_commit", "hipkittens_commit", "requirements_lock_sha256")
    unset(own.get("pytorch", data["pytorch"]), "index_url", "lock_sha256")
    if "therock" in own:
        unset(own["therock"], "index_url", "lock_sha256")
        unset(own["therock"]["triton"], "repository", "commit", "version")
    return data, pins_file(data, tmp_path / "base-unresolved.bake.json")


@pytest.mark.parametrize("track", model.built_track_names(model.load()))
def test_an_existing_vllm_image_needs_no_pin_of_the_base_or_aiter(track, tmp_path):
    """VLLM_IMAGE set, every base and AITER pin unresolved, ALLOW_UNRESOLVED=0: `bake --print serve ci`
    resolves; the graph holds serve and ci only (no base target: `base` is the image itself) and
    their build args hold no pin of the base or AITER, only the track and its vLLM release (what the
    build checks the image against). Without VLLM_IMAGE the same file stops serve on those pins."""
    data, path = every_base_pin_unresolved(model.load(), tmp_path, track)
    files = ("docker-bake.hcl", str(path))
    env = {**CLEAR, "TRACK": track, "ALLOW_UNRESOLVED": "0"}
    pins = named_pins(stop_line(bake_print("serve", env={**env, "VLLM_IMAGE": ""}, files=files)))
    assert f"aiter.pins.{data['tracks'][track]['aiter']}.commit" in pins and len(pins) >= 12, pins
    proc = bake_print("serve", "ci", env={**env, "VLLM_IMAGE": EXISTING}, files=files)
    assert proc.returncode == 0, proc.stderr
    targets = json.loads(proc.stdout)["target"]
    assert set(targets) == {"serve", "ci"}, set(targets)
    for name, target in targets.items():
        assert target["contexts"] == {"base": f"docker-image://{EXISTING}"}, name
        args = target["args"]
        assert set(args) == EMBED_ARGS, sorted(set(args) ^ EMBED_ARGS)
        assert (args["VLLM_IMAGE"], args["VLLM_TRACK"]) == (EXISTING, track)
        assert args["VLLM_VERSION"] == data["tracks"][track]["vllm"]["version"]
        assert not [v for v in args.values() if "UNRESOLVED" in v], args


def test_an_existing_vllm_images_tags_and_cache_name_the_image_not_an_aiter_commit(tmp_path):
    """PUSH=1 on an existing image: the commit tag and cache key carry image<12 hex of the sha256 of
    VLLM_IMAGE> where a built image carries its AITER commit (the image's AITER is not a pin here)."""
    import hashlib

    data = model.load()
    track = data["default_track"]
    _, path = every_base_pin_unresolved(data, tmp_path, track)
    env = {**CLEAR, "PUSH": "1", "REGISTRY": "registry.example/team", "TAG": "main", "VCS_REF": SHA,
           "VLLM_IMAGE": EXISTING, "ALLOW_UNRESOLVED": "0", "GPU_ARCHS": "gfx942"}
    proc = bake_print("serve", "ci", env=env, files=("docker-bake.hcl", str(path)))
    assert proc.returncode == 0, proc.stderr
    image = "image" + hashlib.sha256(EXISTING.encode()).hexdigest()[:12]
    version = data["tracks"][track]["vllm"]["version"]
    for name, target in json.loads(proc.stdout)["target"].items():
        assert target["tags"] == [f"registry.example/team/{name}:vllm{version}-{image}-{SHA[:12]}",
                                  f"registry.example/team/{name}:main"], target["tags"]
        key = f"registry.example/team/buildcache:{name}-vllm{version}-{image}-gfx942"
        assert target["cache-from"] == [f"type=registry,ref={key}"], target["cache-from"]
