"""docker-bake.pins.json: versions.json rendered for bake, the one place its pins become build args.

The file is generated and committed. docker-bake.hcl reads it as a second bake file and computes no pin:

    docker buildx bake -f docker-bake.hcl -f docker-bake.pins.json serve ci

Its keys are flat, so one grep from an ARG name finds each track's value: "<track>/<ARG>" in build_args,
"default/<ARG>" in default_build_args (the default track's, again: `grep default/AITER_COMMIT
docker-bake.pins.json` says which AITER commit the default image builds, and the about line beside it names the
Dockerfile step that checks it out), "<pin>/<ARG>" in aiter_pin_args (AITER_PIN builds another AITER pin), and
"<track>/<target>" or "<pin>/<target>" in the unresolved lists that stop a ROCm target.
`python3 -m tools.pins render` writes it, `resolve --write` and `discover --write` rewrite it, and `verify` fails
while it is stale.
"""
from __future__ import annotations

from pathlib import Path

from . import model

BAKE_FILE = Path("docker-bake.hcl")
BAKE_PINS = Path("docker-bake.pins.json")
RENDER_COMMAND = "python3 -m tools.pins render"
# The build args an AITER pin sets: what AITER_PIN replaces in a track's args.
AITER_PIN_ARGS = ("AITER_TAG", "AITER_COMMIT", "CK_COMMIT", "HIPKITTENS_COMMIT", "AITER_REQUIREMENTS_LOCK",
                  "AITER_REQUIREMENTS_LOCK_SHA256")
# The ROCm targets by what they build from, smallest first: the verified AITER source, the base image, and
# vLLM (serve and ci build on vllm and read its list). A CPU target builds from no pin of versions.json.
PIN_TARGETS = ("base-aiter-src", "base", "vllm")
# The prefix of default_build_args' keys: the default track's build args under a name that needs no track.
DEFAULT_PREFIX = "default"
ABOUT = (f"Generated from versions.json by `{RENDER_COMMAND}`: do not edit. docker-bake.hcl reads it "
         "(-f docker-bake.pins.json); `python3 -m tools.pins verify` fails while it is stale. "
         f"{DEFAULT_PREFIX}/<ARG> (default_build_args) is the default track's <ARG>, as <default_track>/<ARG>: "
         f"{DEFAULT_PREFIX}/AITER_COMMIT is the AITER commit the default image builds, checked out by "
         "Dockerfile.rocm_base's aiter-clone stage (docker/aiter_source.sh clone) and checked again by its "
         "aiter-verify stage.")


def _nulls(path: str, node: dict, keys: tuple[str, ...]) -> list[str]:
    """The dotted paths of the keys of node that are null (unresolved pins)."""
    return [f"{path}.{key}" for key in keys if key in node and node[key] is None]


def track_unresolved(data: dict, name: str) -> dict[str, list[str]]:
    """{target: the unresolved pins it builds from} of a track, its AITER pin's left out (pin_unresolved)."""
    own = data["tracks"][name]
    image = model.section(data, "base_image", name)
    source = _nulls(model.section_path(data, "base_image", name), image, ("name", "tag", "digest"))
    source += _nulls("aiter", data["aiter"], ("repository", "ck_submodule_path"))
    base = source + _nulls("aiter", data["aiter"], ("hipkittens_repository", "required_modules"))
    if model.track_stack(data, name) == model.THEROCK_STACK:
        therock = own["therock"]
        base += _nulls(f"tracks.{name}.therock", therock, ("index_url", "lock_sha256"))
        base += _nulls(f"tracks.{name}.therock.triton", therock["triton"], ("repository", "commit", "version"))
    else:
        base += _nulls(model.section_path(data, "pytorch", name), model.section(data, "pytorch", name),
                       ("index_url", "lock_sha256"))
    vllm = base + _nulls("vllm", data["vllm"], ("repository",))
    vllm += _nulls("vllm.triton_kernels", data["vllm"]["triton_kernels"], ("repository", "path"))
    vllm += _nulls(f"tracks.{name}.vllm", own["vllm"], ("tag", "commit", "triton_kernels_commit"))
    return dict(zip(PIN_TARGETS, (source, base, vllm), strict=True))


def pin_unresolved(data: dict, pin: str) -> dict[str, list[str]]:
    """{target: the unresolved fields of AITER pin `pin` it builds from}."""
    node = data["aiter"]["pins"][pin]
    source = _nulls(f"aiter.pins.{pin}", node, ("tag", "commit", "ck_commit"))
    base = source + _nulls(f"aiter.pins.{pin}", node, ("hipkittens_commit", "requirements_lock_sha256"))
    return dict(zip(PIN_TARGETS, (source, base, base), strict=True))


def default_build_args(data: dict) -> dict[str, str]:
    """The default track's build args, keyed "default/<ARG>" (bake reads "<track>/<ARG>" in build_args;
    these answer a reader's grep)."""
    args = model.build_args(data, track_name_=data["default_track"])
    return {f"{DEFAULT_PREFIX}/{arg}": value for arg, value in args.items()}


def bake_pins(data: dict) -> dict:
    """What docker-bake.hcl reads, from a versions file that passed verify's schema check."""
    tracks = model.built_track_names(data)
    pins = sorted(data["aiter"]["pins"])
    out: dict = {"about": ABOUT, "default_track": data["default_track"], "tracks": sorted(tracks),
                 "aiter_pins": pins, "track_aiter_pins": {name: data["tracks"][name]["aiter"] for name in tracks},
                 "build_args": {}, "build_args_unresolved_allowed": {}, "aiter_pin_args": {},
                 "unresolved_pins": {}, "aiter_pin_unresolved": {},
                 "default_build_args": default_build_args(data)}
    for name in tracks:
        args = model.build_args(data, track_name_=name)
        allowed = model.build_args(data, track_name_=name, allow_unresolved=True)
        out["build_args"].update({f"{name}/{arg}": value for arg, value in args.items()})
        out["build_args_unresolved_allowed"].update(
            {f"{name}/{arg}": value for arg, value in allowed.items() if args[arg] != value})
        out["unresolved_pins"].update({f"{name}/{t}": found for t, found in track_unresolved(data, name).items()})
    for pin in pins:
        args = model.build_args(data, aiter_name=pin)
        out["aiter_pin_args"].update({f"{pin}/{arg}": args[arg] for arg in AITER_PIN_ARGS})
        out["aiter_pin_unresolved"].update({f"{pin}/{t}": found for t, found in pin_unresolved(data, pin).items()})
    return out


def bake_text(data: dict) -> str:
    """The file's one layout: keys sorted, two-space indent, a trailing newline."""
    return model.canonical(bake_pins(data))


def update(data: dict, root: Path = model.REPO_ROOT) -> dict[Path, str]:
    """{the pins file: its text} where it differs from what data renders to, else {}; {} in a tree without
    the bake file (a versions file alone)."""
    path = root / BAKE_PINS
    if not (root / BAKE_FILE).exists():
        return {}
    text = bake_text(data)
    try:
        if path.read_text() == text:
            return {}
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as exc:
        raise model.PinError(f"{path}: cannot read ({exc}): fix its permissions, then run {RENDER_COMMAND}") from None
    return {path: text}


def check(data: dict, root: Path = model.REPO_ROOT) -> list[str]:
    """One line when the pins file beside the bake file is missing or not what versions.json renders to."""
    if update(data, root):
        return [f"{BAKE_PINS} is not what versions.json renders to (bake would build other pins): run "
                f"{RENDER_COMMAND} and commit it"]
    return []
