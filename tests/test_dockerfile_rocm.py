"""Dockerfile.rocm: stages, layer order (backend/ and runtime/ last), what the targets carry.

Static: BuildKit's own parser (the `dockerfile` package), no engine needed. The build itself
runs in tests/test_engine_integration.py."""
import re
import subprocess
from pathlib import Path

import pytest

from tools.pins import model
from dockerfile_model import buildkit_parser, global_args, stages

ROOT = Path(__file__).resolve().parents[1]
NAME = "Dockerfile.rocm"
# Instructions that add or change files (a layer); the others only set image metadata.
LAYER_CMDS = {"RUN", "COPY", "ADD"}


def parse_text(text, tmp_path=None):
    dockerfile = buildkit_parser()
    return dockerfile.parse_string(text)


@pytest.fixture(scope="module")
def commands():
    return parse_text((ROOT / NAME).read_text())


def stage_map(commands):
    """{stage: (base, [commands])}, in order (unnamed stages as #index)."""
    return {name or f"#{i}": (base, cmds) for i, (name, base, cmds) in enumerate(stages(commands))}


def resolve_base(base, global_args):
    """A FROM value with its ARG expanded (${VAR:-fallback} when VAR defaults to empty)."""
    m = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::-([A-Za-z0-9_.-]+))?\}?", base)
    if not m:
        return base
    value = global_args.get(m.group(1), "")
    return value or (m.group(2) or "")


def lineage(commands, target, overrides=None):
    """Instructions of `target` and of every stage it is built FROM, base first."""
    stages = stage_map(commands)
    args = {**global_args(commands), **(overrides or {})}
    chain = []
    stage = target
    while stage in stages:
        chain.append(stage)
        stage = resolve_base(stages[stage][0], args)
    out = []
    for stage in reversed(chain):
        out += [(stage, c) for c in stages[stage][1]]
    return chain, out


def flag(c, prefix):
    return [f for f in c.flags if f.startswith(prefix)]


def mounts_from(c):
    found = []
    for f in flag(c, "--mount="):
        m = re.search(r"from=([^,]+)", f)
        if m:
            found.append(m.group(1))
    return found


def context_sources(cmds):
    """What a stage reads from the build context: its COPY sources and its bind mounts' sources."""
    found = []
    for c in cmds:
        if c.cmd.upper() == "COPY" and not flag(c, "--from="):
            found += c.value[:-1]
        for f in flag(c, "--mount="):
            m = re.search(r"\bsource=([^,]+)", f)
            if "type=bind" in f and m and "from=" not in f:
                found.append(m.group(1))
    return found


def text_of(c):
    return " ".join(c.value)


def installs_vllm(c):
    return c.cmd.upper() == "RUN" and "vllm-wheel" in mounts_from(c)


def adds_backend_or_runtime(c):
    """The instruction brings backend/ or runtime/ app files into the target image."""
    if c.cmd.upper() == "RUN" and {"backend-wheel", "runtime-wheel"} & set(mounts_from(c)):
        return True
    if c.cmd.upper() == "COPY":
        src = flag(c, "--from=")
        if src and src[0].split("=", 1)[1] in ("app-files", "backend-wheel", "backend-installed", "runtime-wheel",
                                                  "runtime-installed"):
            return True
        if not src and any(p.startswith(("backend/", "runtime/", "ci/")) for p in c.value[:-1]):
            return True
    return False


def layer_order_problems(commands, target):
    """Why the target's layer order is wrong (empty: right): every backend/runtime layer comes after
    the vLLM install, and after the first of them only backend/runtime layers and metadata follow."""
    _, instructions = lineage(commands, target, {"VLLM_IMAGE": ""})
    problems = []
    kinds = []
    for stage, c in instructions:
        if c.cmd.upper() in LAYER_CMDS:
            kinds.append(("vllm" if installs_vllm(c) else "app" if adds_backend_or_runtime(c) else "other", stage, c))
    names = [k for k, _, _ in kinds]
    if "vllm" not in names:
        problems.append(f"{target}: no vLLM install (RUN --mount=from=vllm-wheel) in its lineage")
    if "app" not in names:
        problems.append(f"{target}: neither backend/ nor runtime/ files are added")
    if problems:
        return problems
    first_app = names.index("app")
    if names.index("vllm") > first_app or "vllm" in names[first_app:]:
        problems.append(f"{target}: backend/runtime layers come before the vLLM install")
    for kind, stage, c in kinds[first_app:]:
        if kind != "app":
            problems.append(f"{target}: {stage}:{c.start_line} {c.cmd} {text_of(c)[:60]} comes after the "
                            "backend/runtime layers: a backend/ change would rebuild it")
    return problems


def test_stage_names_say_what_they_produce(commands):
    names = list(stage_map(commands))
    for required in ("vllm-src", "vllm-wheel", "vllm-built", "vllm", "backend-wheel", "backend-installed",
                     "runtime-wheel", "runtime-installed", "app-files", "serve", "ci"):
        assert required in names, required


@pytest.mark.parametrize("target", ["serve", "ci"])
def test_layer_order_backend_and_ci_after_vllm(commands, target):
    assert layer_order_problems(commands, target) == []


@pytest.mark.parametrize("target", ["serve", "ci"])
def test_targets_end_with_backend_and_app_layers(commands, target):
    """Both targets add exactly the installed runtime package, the installed backend and the app
    files as their last three layers, each with --link (independent of the layers below: a change
    to one rebuilds only that one). The backend and app layers are the last two, so a backend/
    change leaves every layer below them as it was."""
    _, instructions = lineage(commands, target, {"VLLM_IMAGE": ""})
    layers = [c for _, c in instructions if c.cmd.upper() in LAYER_CMDS]
    assert flag(layers[-3], "--from=") == ["--from=runtime-installed"] and flag(layers[-3], "--link")
    assert flag(layers[-2], "--from=") == ["--from=backend-installed"] and flag(layers[-2], "--link")
    assert flag(layers[-1], "--from=") == ["--from=app-files"] and flag(layers[-1], "--link")


def test_layer_order_check_can_fail(commands):
    """Moving the backend install of `serve` above the vLLM build is caught."""
    text = (ROOT / NAME).read_text()
    backend_install = "COPY --link --from=backend-installed /staging/ /\n"
    serve_part = text.index("FROM serve-base AS serve\n")
    assert text.find(backend_install, serve_part) > 0
    broken = text[:serve_part] + text[serve_part:].replace(backend_install, "", 1)
    broken = broken.replace("FROM base AS vllm-built\n", "FROM base AS vllm-built\n" + backend_install, 1)
    assert broken != text
    problems = layer_order_problems(parse_text(broken), "serve")
    assert any("before the vLLM install" in p or "comes after the backend/runtime layers" in p
               for p in problems), problems
    # a slow step after the app files is caught too
    slow = text.replace('LABEL org.opencontainers.image.revision="${VCS_REF}" \\\n      io.rocm-vllm.target="serve"',
                        'RUN echo slow\nLABEL org.opencontainers.image.revision="${VCS_REF}"', 1)
    assert any("comes after the backend/runtime layers" in p for p in layer_order_problems(parse_text(slow), "serve"))


def test_existing_vllm_image_path_replaces_the_vllm_build(commands):
    stages = stage_map(commands)
    assert global_args(commands)["VLLM_IMAGE"] == ""
    assert stages["vllm"][0] == "${VLLM_IMAGE:-vllm-built}" and stages["vllm"][1] == []
    chain, _ = lineage(commands, "serve", {"VLLM_IMAGE": "registry.example/vllm-rocm:0.32.0"})
    assert "vllm-built" not in chain and chain[-1] == "vllm"
    chain, _ = lineage(commands, "serve", {"VLLM_IMAGE": ""})
    assert chain[-1] == "vllm-built"


def test_the_docker_tests_copy_every_path_the_build_reads(commands):
    """The Docker tests build from a copy of the build inputs (test_engine_integration.CONTEXT_PATHS):
    every COPY and bind-mount source of the Dockerfile lies in a path they copy."""
    from test_engine_integration import CONTEXT_PATHS  # noqa: PLC0415

    sources = {p for _, _, cmds in stages(commands) for p in context_sources(cmds)}
    assert sources, "no context source found"
    uncopied = sorted(p for p in sources if p.strip("/").split("/", 1)[0] not in CONTEXT_PATHS)
    assert not uncopied, f"read by {NAME}, not in the Docker tests' context copy: {uncopied}"


def test_backend_wheel_stage_reads_backend_sources_only(commands):
    _, cmds = stage_map(commands)["backend-wheel"]
    sources = context_sources(cmds)
    assert sources and all(p.startswith("backend/") or p == "docker" for p in sources), sources
    assert "backend/tests" not in " ".join(sources)
    assert any(p.startswith("backend/src") for p in sources) and "backend/pyproject.toml" in sources


def test_runtime_wheel_stage_reads_runtime_sources_only(commands):
    _, cmds = stage_map(commands)["runtime-wheel"]
    sources = context_sources(cmds)
    assert sorted(sources) == ["docker", "runtime/pyproject.toml", "runtime/src/"], sources
    runs = [text_of(c) for c in cmds if c.cmd.upper() == "RUN"]
    assert runs and "build_project_wheel.sh /opt/runtime /wheels rocm_vllm_runtime" in runs[-1]
    _, installed = stage_map(commands)["runtime-installed"]
    assert any("runtime-wheel" in mounts_from(c) and "rocm_vllm_runtime-*.whl" in text_of(c)
               and "--no-deps" in text_of(c) for c in installed if c.cmd.upper() == "RUN")


@pytest.mark.parametrize("target", ["serve", "ci"])
def test_targets_carry_no_sources_or_build_stages(commands, target):
    chain, instructions = lineage(commands, target, {"VLLM_IMAGE": ""})
    for stage in ("vllm-clone", "vllm-src", "vllm-wheel", "backend-wheel", "backend-installed", "runtime-wheel",
                  "runtime-installed", "ray-installed", "app-files"):
        assert stage not in chain, f"{target} is built on {stage}"
    for stage, c in instructions:
        src = flag(c, "--from=")
        if c.cmd.upper() == "COPY":
            assert not src or src[0].split("=", 1)[1] in STAGED_ROOTS, f"{stage}:{c.start_line}: COPY {src}"
            app_source = any(p.startswith(("backend/", "runtime/", "ci/")) for p in c.value[:-1])
            assert not app_source or stage == "app-files", f"{stage}:{c.start_line}"
        for f in flag(c, "--mount="):
            if "type=cache" in f:
                assert "target=/root/.cache" in f, f"{stage}:{c.start_line}: cache mount outside /root/.cache"
            if "type=bind" in f:  # build stages' outputs, or the build scripts of docker/ (never left behind)
                assert re.search(r"from=(vllm-src|vllm-wheel|backend-wheel|runtime-wheel)", f) or (
                    "from=" not in f and "source=docker," in f), f"{stage}:{c.start_line}: bind mount {f}"


def test_app_files_leave_out_build_tooling_and_byte_code(commands):
    _, cmds = stage_map(commands)["app-files"]
    sources = [p for c in cmds if c.cmd.upper() == "COPY" for p in c.value[:-1]]
    for needed in ("runtime/entrypoint.sh", "runtime/bin/", "runtime/suites/", "runtime/models/tiny-mla/config.json",
                   "runtime/models/tiny-mla/tokenizer.json", "runtime/models/tiny-mla/tokenizer_config.json"):
        assert needed in sources
    # the runtime package comes installed (runtime-installed), never as source files
    tooling = ("docker/", "tools/pins", "ci/pipeline", "ci/test-machine", "runtime/src", "runtime/tests",
               "runtime/pyproject")
    assert not any(p.startswith(tooling) or p in ("ci/", "runtime/", "docker") for p in sources)
    assert any("__pycache__" in text_of(c) for c in cmds if c.cmd.upper() == "RUN")


def ray_layer_problems(commands, target) -> list[str]:
    """Why the target's Ray layer is wrong (empty: right): Ray comes from ray-installed as one
    --link layer of serve-base (so both targets carry it), after the vLLM install and below the
    runtime, backend and app layers (Ray changes less often than they do); the stage installs the
    pinned Ray hash-checked under the image's own distributions."""
    stages = stage_map(commands)
    _, instructions = lineage(commands, target, {"VLLM_IMAGE": ""})
    layers = [(s, c) for s, c in instructions if c.cmd.upper() in LAYER_CMDS]
    ray = [i for i, (_, c) in enumerate(layers) if flag(c, "--from=") == ["--from=ray-installed"]]
    if len(ray) != 1:
        return [f"{target}: {len(ray)} Ray layers (COPY --from=ray-installed), not one"]
    stage, c = layers[ray[0]]
    problems = [] if stage == "serve-base" and flag(c, "--link") else [
        f"{target}: the Ray layer is in {stage}, not a COPY --link of serve-base"]
    if any(installs_vllm(x) for _, x in layers[ray[0]:]):
        problems.append(f"{target}: the Ray layer comes before the vLLM install")
    if any(adds_backend_or_runtime(x) for _, x in layers[:ray[0]]):
        problems.append(f"{target}: the Ray layer comes after runtime/backend/app layers: a backend/ change "
                        "would rebuild it")
    declared = {v.split("=")[0] for x in stages["ray-installed"][1] if x.cmd.upper() == "ARG" for v in x.value}
    if "SOURCE_DATE_EPOCH" not in declared:
        problems.append("ray-installed: ARG SOURCE_DATE_EPOCH not declared")
    runs = [x for x in stages["ray-installed"][1] if x.cmd.upper() == "RUN"]
    if not runs or "install_ray.sh /opt/rocm-vllm/docker/requirements-ray.txt /staging" not in text_of(runs[-1]) \
            or "source=docker," not in " ".join(runs[-1].flags):
        problems.append("ray-installed: its RUN does not call install_ray.sh with the Ray lock (requirements-ray.txt)")
    return problems


@pytest.mark.parametrize("target", ["serve", "ci"])
def test_ray_is_one_staged_layer_below_the_daily_layers(commands, target):
    assert ray_layer_problems(commands, target) == []


def test_ray_layer_check_can_fail():
    text = (ROOT / NAME).read_text()
    ray_copy = "COPY --link --from=ray-installed /staging/ /\n"
    assert text.count(ray_copy) == 1
    moved = text.replace(ray_copy, "", 1).replace(
        "COPY --link --from=app-files /opt/app/ /opt/rocm-vllm/\n",
        "COPY --link --from=app-files /opt/app/ /opt/rocm-vllm/\n" + ray_copy, 1)
    assert any("not a COPY --link of serve-base" in p for p in ray_layer_problems(parse_text(moved), "serve"))
    assert any("after runtime/backend/app" in p for p in ray_layer_problems(parse_text(moved), "serve"))
    missing = text.replace(ray_copy, "", 1)
    assert ray_layer_problems(parse_text(missing), "ci") == ["ci: 0 Ray layers (COPY --from=ray-installed), not one"]


def test_ray_install_script_pins_hashes_and_holds_the_image():
    """install_ray.sh: pip with --require-hashes, --no-compile, --root, under a constraints file of
    every installed distribution; the staging root must hold exactly what it installed on purpose;
    a missing lock, or one without hash-pinned ray, stops it naming the lock command."""
    script = (ROOT / "docker/install_ray.sh").read_text()
    pip = script[script.index("python3 -m pip install"):].split("||")[0]
    for option in ("--require-hashes", "--no-compile", '--root "$root"', '--constraint "$work/constraints.txt"'):
        assert option in pip, option
    assert "--no-deps" not in pip and "--ignore-installed" not in pip and "--upgrade" not in pip
    layer = (ROOT / "docker/ray_layer.py").read_text()  # its decisions: what is held, what may be installed
    assert '"$here/ray_layer.py" plan' in script and '"$here/ray_layer.py" check' in script
    # every installed distribution is held, read by the build scripts' one reader of installed metadata
    assert "pinned_dists.installed(" in layer and "only" in layer
    assert "md.distributions()" in (ROOT / "docker/pinned_dists.py").read_text()


@pytest.mark.parametrize("lock_text", [None, "msgpack==1.2.4 \\\n    --hash=sha256:" + "a" * 64 + "\n",
                                       "ray==2.60.0\nmsgpack==1.2.4\n"], ids=["missing", "no-ray", "no-hashes"])
def test_ray_install_refuses_a_lock_without_hash_pinned_ray(tmp_path, lock_text):
    lock = tmp_path / "requirements-ray.txt"
    if lock_text is not None:
        lock.write_text(lock_text)
    proc = subprocess.run(["bash", ROOT / "docker/install_ray.sh", lock, tmp_path / "root"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("install-ray: ERROR:")
    assert "python3 -m tools.pins lock ray" in proc.stderr
    assert not (tmp_path / "root").exists()


def copied_stages(instructions) -> list[str]:
    return [flag(c, "--from=")[0].split("=", 1)[1] for _, c in instructions
            if c.cmd.upper() == "COPY" and flag(c, "--from=")]


def test_pytest_only_in_ci(commands):
    stages = stage_map(commands)
    _, serve = lineage(commands, "serve", {"VLLM_IMAGE": ""})
    _, ci = lineage(commands, "ci", {"VLLM_IMAGE": ""})
    serve_text = [text_of(c) for _, c in serve] + [text_of(c) + " ".join(c.flags) for s in copied_stages(serve)
                                                   for c in stages[s][1]]
    assert not any("requirements-ci.txt" in x for x in serve_text)
    assert "ci-tools" in copied_stages(ci)
    assert any("docker/requirements-ci.txt" in text_of(c) and "--require-hashes" in text_of(c)
               for c in stages["ci-tools"][1])


# Stages whose /staging (or /opt/app) root the targets take as --link layers.
STAGED_ROOTS = {"serve-files": "/staging", "ci-tools": "/staging", "backend-installed": "/staging",
                "runtime-installed": "/staging", "ray-installed": "/staging", "app-files": "/opt/app"}
NORMALISE = re.compile(r'find (\S+) -exec touch -h -d "@\$\{SOURCE_DATE_EPOCH\}" \{\} \+')


def reproducibility_problems(commands, target):
    """Why a target's own layers would carry build-time or working-tree file times (empty: none):
    each layer above vllm is a COPY --link --from a staged stage; that stage declares
    SOURCE_DATE_EPOCH and its last RUN sets every mtime under the copied root to it."""
    stages = stage_map(commands)
    chain, instructions = lineage(commands, target, {"VLLM_IMAGE": ""})
    problems = []
    for stage, c in instructions:
        if stage not in chain[:chain.index("vllm")] or c.cmd.upper() not in LAYER_CMDS:
            continue
        src = flag(c, "--from=")
        source = src[0].split("=", 1)[1] if src else None
        if c.cmd.upper() != "COPY" or source not in STAGED_ROOTS or not flag(c, "--link"):
            problems.append(f"{target}: {stage}:{c.start_line} {c.cmd} {text_of(c)[:50]}: not a COPY --link "
                            "from a staged stage")
            continue
        cmds = stages[source][1]
        if not any(x.cmd.upper() == "ARG" and any(v.split("=")[0] == "SOURCE_DATE_EPOCH" for v in x.value)
                   for x in cmds):
            problems.append(f"{source}: no ARG SOURCE_DATE_EPOCH")
        runs = [x for x in cmds if x.cmd.upper() == "RUN"]
        roots = NORMALISE.findall(text_of(runs[-1])) if runs else []
        if STAGED_ROOTS[source] not in roots:
            problems.append(f"{source}: its last RUN does not set every mtime under {STAGED_ROOTS[source]} "
                            "to SOURCE_DATE_EPOCH")
    return problems


@pytest.mark.parametrize("target", ["serve", "ci"])
def test_owned_layers_carry_no_build_times(commands, target):
    assert reproducibility_problems(commands, target) == []


def test_reproducibility_check_can_fail():
    text = (ROOT / NAME).read_text()
    unnormalised = text.replace(' \\\n && find /opt/app -exec touch -h -d "@${SOURCE_DATE_EPOCH}" {} +', "", 1)
    assert unnormalised != text
    assert any("app-files" in p for p in reproducibility_problems(parse_text(unnormalised), "serve"))
    direct = text.replace("FROM serve-base AS serve\n", "FROM serve-base AS serve\nCOPY runtime/bin/ /opt/x/\n", 1)
    assert any("not a COPY --link" in p for p in reproducibility_problems(parse_text(direct), "serve"))


def test_ci_requirements_locked_without_dependencies():
    """The ci target's lock names exactly the inputs (no dependency of theirs: vLLM brings those)."""
    wanted = {line.split("==")[0] for line in (ROOT / "docker/requirements-ci.in").read_text().splitlines()
              if line and not line.startswith("#")}
    text = (ROOT / "docker/requirements-ci.txt").read_text()
    assert set(re.findall(r"^([A-Za-z0-9_.-]+)==\S+ \\$", text, re.M)) == wanted
    assert "--no-deps" in text.splitlines()[0]


def _last(commands, stage_cmds, cmd):
    found = [c for c in stage_cmds if c.cmd.upper() == cmd]
    return found[-1] if found else None


@pytest.mark.parametrize("target", ["serve", "ci"])
def test_entrypoint_settings_and_labels(commands, target):
    _, instructions = lineage(commands, target, {"VLLM_IMAGE": ""})
    cmds = [c for _, c in instructions]
    entry = _last(commands, cmds, "ENTRYPOINT")
    assert entry.json and entry.value == ("/opt/rocm-vllm/entrypoint.sh",)
    cmd = _last(commands, cmds, "CMD")
    assert cmd.json and cmd.value[0] == ("serve" if target == "serve" else "selftest")
    env = " ".join(text_of(c) for c in cmds if c.cmd.upper() == "ENV")
    assert "ROCM_VLLM_JIT_CACHE" in env and "TINY_MLA_MODEL" in env
    assert "AITER_JIT_DIR" not in env, "the entrypoint derives AITER_JIT_DIR; do not set it in the image"
    labels = " ".join(text_of(c) for c in cmds if c.cmd.upper() == "LABEL")
    for label in ("org.opencontainers.image.title", "org.opencontainers.image.version",
                  "org.opencontainers.image.revision", "org.opencontainers.image.description"):
        assert label in labels, label


def test_revision_arg_declared_after_every_layer(commands):
    """VCS_REF changes with every commit: declared before a RUN it would invalidate that layer."""
    for target in ("serve", "ci"):
        _, cmds = stage_map(commands)[target]
        positions = [i for i, c in enumerate(cmds) if c.cmd.upper() == "ARG" and any(
            t.split("=")[0] == "VCS_REF" for t in c.value)]
        last_layer = max(i for i, c in enumerate(cmds) if c.cmd.upper() in LAYER_CMDS)
        assert positions and min(positions) > last_layer, target
    for stage, (_, cmds) in stage_map(commands).items():
        if stage not in ("serve", "ci"):
            assert not any(c.cmd.upper() == "ARG" and "VCS_REF" in text_of(c) for c in cmds), stage


def test_vllm_build_uses_pinned_commit_and_archs(commands):
    _, cmds = stage_map(commands)["vllm-wheel"]
    declared = {t for c in cmds if c.cmd.upper() == "ARG" for t in c.value}
    defaults = global_args(commands)
    expected = model.build_args(model.load())
    for key in ("VLLM_TAG", "VLLM_COMMIT", "TRITON_KERNELS_COMMIT", "VLLM_VERSION", "GPU_ARCHS"):
        assert key in declared and defaults[key].strip("'") == expected[key], key
    run = text_of(next(c for c in cmds if c.cmd.upper() == "RUN"))
    assert "vllm_source.sh verify" in run and "build_vllm.sh" in run
    script = (ROOT / "docker/build_vllm.sh").read_text()
    assert "PYTORCH_ROCM_ARCH=$GPU_ARCHS" in script and "--no-build-isolation" in script
    assert "native" not in re.sub(r"#.*", "", script)


def test_vllm_built_keeps_the_base_pins(commands):
    """vLLM's runtime requirements are installed from the track's lock (checked against the source
    in the vllm-wheel stage), without resolution, then pip check; the step fails when a pinned
    distribution changed anyway (not torch's version alone)."""
    _, cmds = stage_map(commands)["vllm-built"]
    run = text_of(next(c for c in cmds if c.cmd.upper() == "RUN"))
    assert "install_vllm.sh" in run
    _, wheel_cmds = stage_map(commands)["vllm-wheel"]
    wheel_run = " ".join(text_of(c) + " ".join(c.flags) for c in wheel_cmds if c.cmd.upper() == "RUN")
    assert 'VLLM_LOCK="/opt/rocm-vllm/locks/vllm-${VLLM_TRACK}-rocm.txt"' in wheel_run
    assert "source=docker/locks,target=/opt/rocm-vllm/locks" in wheel_run
    build = (ROOT / "docker/build_vllm.sh").read_text()
    assert 'vllm_requirements.py" lock "$src" "$VLLM_LOCK"' in build
    script = (ROOT / "docker/install_vllm.sh").read_text()
    assert "pinned_dists.py\" snapshot" in script and "pinned_dists.py\" compare" in script
    assert 'pip install --require-hashes --no-deps -r "$wheels/requirements-lock.txt"' in script
    assert "pip check" in script
    assert "grep" not in script
    fixed = (ROOT / "docker/pinned_dists.py").read_text()
    for name in ("torch", "torchvision", "torchaudio", "amdsmi", "amd-aiter", "triton"):
        assert f'"{name}"' in fixed, name


def test_vllm_build_fetches_nothing_itself(commands):
    """triton_kernels comes from a source stage at the pinned commit (TRITON_KERNELS_SRC_DIR), so
    vLLM's CMake clones nothing; the air-gapped context triton-kernels-src can replace it."""
    stages_ = stage_map(commands)
    assert stages_["triton-kernels-src"][0] == "scratch"
    _, cmds = stages_["vllm-wheel"]
    run = next(c for c in cmds if c.cmd.upper() == "RUN")
    assert "triton-kernels-src" in mounts_from(run)
    assert "TRITON_KERNELS_SRC_DIR=/opt/triton-kernels" in text_of(run)
    declared = {t for c in stages_["triton-kernels-clone"][1] if c.cmd.upper() == "ARG" for t in c.value}
    defaults = global_args(commands)
    expected = model.build_args(model.load())
    script = (ROOT / "docker/vllm_source.sh").read_text()
    for name in ("TRITON_KERNELS_REPOSITORY", "TRITON_KERNELS_COMMIT", "TRITON_KERNELS_PATH"):
        assert name in declared and defaults[name] == expected[name] and expected[name] != model.UNRESOLVED, name
        assert f"${name}" in script, name
