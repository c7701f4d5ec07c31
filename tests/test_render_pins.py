"""docker-bake.pins.json: what `python3 -m tools.pins render` makes of versions.json, kept current by verify.

bake reading the file is tests/test_bake.py's (docker buildx bake --print); these need no Docker."""
import json
import shutil

import pytest

from tools.pins import model, render
from test_bake import unresolved
from test_pins import ROOT, run_tool

TRACKS = model.built_track_names(model.load(ROOT / "versions.json"))


@pytest.fixture()
def checkout(tmp_path):
    """A copy of what the pin tool reads and writes beside a bake file: versions file, Dockerfiles, bake files."""
    for name in ("versions.json", *model.DOCKERFILES, str(render.BAKE_FILE), str(render.BAKE_PINS)):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_the_committed_pins_file_is_what_versions_json_renders_to():
    assert (ROOT / render.BAKE_PINS).read_text() == render.bake_text(model.load(ROOT / "versions.json")), \
        f"run {render.RENDER_COMMAND}"


def test_verify_fails_in_one_line_naming_render_until_it_runs(checkout):
    data = model.load(checkout / "versions.json")
    data["tracks"][data["default_track"]]["vllm"]["tag"] = "v0.34.9"
    model.write_files(model.global_arg_updates(data, checkout)[1] | {checkout / "versions.json": model.canonical(data)})
    assert json.loads((checkout / render.BAKE_PINS).read_text())["build_args"]["0.34/VLLM_TAG"] == "v0.34.9"
    (checkout / render.BAKE_PINS).write_text((ROOT / render.BAKE_PINS).read_text())  # stale, as if edited by hand
    proc = run_tool("--file", str(checkout / "versions.json"), "verify")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    assert f"{render.BAKE_PINS} is not what versions.json renders to" in errors[0]
    assert f"run {render.RENDER_COMMAND} and commit it" in errors[0]
    proc = run_tool("--file", str(checkout / "versions.json"), "render")
    assert proc.returncode == 0 and f"{render.BAKE_PINS}: rendered from versions.json" in proc.stdout, proc.stderr
    assert run_tool("--file", str(checkout / "versions.json"), "verify").returncode == 0
    (checkout / render.BAKE_PINS).unlink()
    assert render.BAKE_PINS.name in run_tool("--file", str(checkout / "versions.json"), "verify").stderr


@pytest.mark.parametrize("track", TRACKS)
def test_each_target_lists_the_unresolved_pins_it_builds_from(track, tmp_path):
    """With every resolvable pin null: vllm's list (the track's and its AITER pin's) is every unresolved pin
    the track builds from (model.unresolved_pins, read from the unresolved lists, not the nulls); base's
    leaves out vLLM's source; the AITER source's leaves out the wheels and HipKittens."""
    data, _ = unresolved(model.load(ROOT / "versions.json"), tmp_path)
    pins = render.bake_pins(data)
    pin = data["tracks"][track]["aiter"]
    lists = {t: pins["unresolved_pins"][f"{track}/{t}"] + pins["aiter_pin_unresolved"][f"{pin}/{t}"]
             for t in render.PIN_TARGETS}
    assert len(set(lists["vllm"])) == len(lists["vllm"])
    assert set(lists["vllm"]) == set(model.unresolved_pins(data, track_name_=track))
    assert set(lists["base"]) == {p for p in lists["vllm"] if not p.startswith((f"tracks.{track}.vllm.", "vllm."))}
    assert set(lists["base-aiter-src"]) == {p for p in lists["base"] if not p.endswith(
        ("lock_sha256", "hipkittens_commit", ".triton.commit"))}
    assert f"aiter.pins.{pin}.commit" in lists["base-aiter-src"]


def test_an_aiter_pin_replaces_every_arg_it_sets():
    """AITER_PIN: bake merges aiter_pin_args over the track's args. They are every arg in which two AITER pins'
    builds differ, and the track's own where the track builds that pin."""
    data = model.load(ROOT / "versions.json")
    pins = render.bake_pins(data)
    builds = {pin: model.build_args(data, aiter_name=pin) for pin in data["aiter"]["pins"]}
    differ = {arg for a in builds.values() for b in builds.values() for arg in a if a[arg] != b[arg]}
    assert differ and differ <= set(render.AITER_PIN_ARGS), differ - set(render.AITER_PIN_ARGS)
    for pin, args in builds.items():
        assert {arg: pins["aiter_pin_args"][f"{pin}/{arg}"] for arg in render.AITER_PIN_ARGS} == \
            {arg: args[arg] for arg in render.AITER_PIN_ARGS}
    for name in TRACKS:
        own = data["tracks"][name]["aiter"]
        for arg in render.AITER_PIN_ARGS:
            assert pins["aiter_pin_args"][f"{own}/{arg}"] == pins["build_args"][f"{name}/{arg}"]


def _grep(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_the_default_tracks_args_are_also_under_default():
    """default_build_args is the default track's build_args, keyed "default/<ARG>": every one, the same values."""
    data = model.load(ROOT / "versions.json")
    pins = render.bake_pins(data)
    track = data["default_track"]
    own = {key.split("/", 1)[1]: value for key, value in pins["build_args"].items() if key.startswith(f"{track}/")}
    assert own and pins["default_build_args"] == {f"default/{arg}": value for arg, value in own.items()}


def test_one_grep_answers_which_aiter_commit_the_default_image_builds():
    """`grep default/AITER_COMMIT docker-bake.pins.json` prints the value and the about line, which names the
    Dockerfile.rocm_base stages that take AITER_COMMIT (stages that exist and declare it)."""
    text = (ROOT / render.BAKE_PINS).read_text()
    data = model.load(ROOT / "versions.json")
    lines = _grep(text, "default/AITER_COMMIT")
    value = model.build_args(data)["AITER_COMMIT"]
    assert [line.strip().rstrip(",") for line in lines if '"about"' not in line] == \
        [f'"default/AITER_COMMIT": "{value}"']
    about = [line for line in lines if '"about"' in line]
    assert len(about) == 1 and "Dockerfile.rocm_base" in about[0], lines
    dockerfile = (ROOT / "Dockerfile.rocm_base").read_text()
    for stage in ("aiter-clone", "aiter-verify"):
        assert f"{stage} stage" in about[0], stage
        body = dockerfile.split(f" AS {stage}\n", 1)[1].split("\nFROM ", 1)[0]
        assert "AITER_COMMIT" in body.split("\n", 1)[0], f"{stage} declares no AITER_COMMIT"
