"""The aiter-src stages of Dockerfile.rocm_base built for real on a Docker engine, against a
git server on 127.0.0.1 serving a tiny repository with a submodule (standing in for AITER and
its Composable Kernel submodule). No registry is needed: the stages run on a Debian image made
by ci/test-machine/debian-test-image.sh (or TEST_BASE_IMAGE)."""
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import git_daemon
from git_repo import commit_all, git, new_repo
from tools.pins import model

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.docker


def _engine_answers():
    try:
        return subprocess.run(["docker", "version"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _buildx():
    return subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def engine():
    if not _engine_answers():
        pytest.skip("no Docker engine answers (start one: bash ci/test-machine/docker-engine.sh start; "
                    "eval \"$(bash ci/test-machine/docker-engine.sh env)\")")
    if not _buildx():
        pytest.skip("docker buildx plugin not found "
                    "(eval \"$(bash ci/test-machine/docker-engine.sh env)\" sets DOCKER_CONFIG)")


@pytest.fixture(scope="module")
def base_image(engine):
    start = time.time()
    proc = subprocess.run(["bash", str(ROOT / "ci/test-machine/debian-test-image.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(f"test base image {proc.stdout.strip()} ready in {time.time() - start:.1f}s")
    return proc.stdout.strip()


# A small MLA kernel list per arch, the code objects it names, and stand-ins for AITER's MLA
# dispatch code that no AITER release has: the aiter-check's kernel-list check reads only the lists
# and their code objects, never the dispatch code.
FAKE_CSV = {
    "gfx942": ["bf16,bf16,16,1,4,0,1,0,_ZN5aiter2psE,mla_fake_qh16_ps.co",
               "bf16,bf16,16,0,1,0,1,0,_ZN5aiter2q1E,mla_fake_qh16_q1.co",
               "bf16,bf16,128,0,0,0,1,0,_ZN5aiter3anyE,mla_fake_qh128.co"],
    "gfx950": ["fp8,fp8,32,1,4,0,1,0,_ZN5aiter3h32E,mla_fake_qh32_q4_ps.co"],
}
FAKE_DISPATCH = {
    "aiter/mla.py": "def mla_decode_fwd(q):\n    return q  # stand-in: no AITER release dispatches so\n",
    "csrc/py_itfs_cu/asm_mla.cu": "void mla_decode_stage1_asm_fwd(int q)\n{\n}\n",
}


def write_fake_kernel_sources(aiter):
    for arch, rows in FAKE_CSV.items():
        path = aiter / "hsa" / arch / "mla" / "mla_asm.csv"
        path.parent.mkdir(parents=True)
        path.write_text("qType,kvType,Gqa,ps,qSeqLen,prefill,causal,lse,knl_name,co_name\n" + "\n".join(rows) + "\n")
        for row in rows:
            (path.parent / row.split(",")[-1]).write_bytes(b"\x7fELF stand-in code object\n")
    for rel, text in FAKE_DISPATCH.items():
        (aiter / rel).parent.mkdir(parents=True, exist_ok=True)
        (aiter / rel).write_text(text)


@pytest.fixture(scope="module")
def git_server(tmp_path_factory):
    """git daemon on 127.0.0.1 serving ck.git and aiter.git (tag v1.0, CK submodule)."""
    top = tmp_path_factory.mktemp("gitsrv")
    port = git_daemon.free_port()
    url = f"git://127.0.0.1:{port}"
    work = top / "work"
    ck = new_repo(work / "ck")
    (ck / "ck.h").write_text("// ck 1\n")
    ck1 = commit_all(ck, "ck 1")
    (ck / "ck.h").write_text("// ck 2\n")
    ck2 = commit_all(ck, "ck 2 (a later CK commit AITER does not record)")
    git("checkout", "-q", ck1, cwd=ck)
    srv = top / "srv"
    srv.mkdir()
    git("clone", "-q", "--bare", str(ck), str(srv / "ck.git"), cwd=top)
    git("--git-dir", str(srv / "ck.git"), "branch", "-f", "main", ck2, cwd=top)
    aiter = new_repo(work / "aiter")
    (aiter / "setup.py").write_text("# stand-in for AITER\n")
    write_fake_kernel_sources(aiter)
    git("add", ".", cwd=aiter)
    git("-c", "protocol.file.allow=always", "submodule", "add", "-q", str(srv / "ck.git"),
        "3rdparty/composable_kernel", cwd=aiter)
    git("-C", "3rdparty/composable_kernel", "checkout", "-q", ck1, cwd=aiter)
    git("config", "-f", ".gitmodules", "submodule.3rdparty/composable_kernel.url", f"{url}/ck.git", cwd=aiter)
    commit = commit_all(aiter, "aiter 1")
    git("tag", "-a", "v1.0", "-m", "v1.0", cwd=aiter)
    (aiter / "README").write_text("later\n")
    later = commit_all(aiter, "aiter 2")
    git("clone", "-q", "--bare", str(aiter), str(srv / "aiter.git"), cwd=top)
    daemon = git_daemon.start(srv, port, "aiter.git")
    yield {"url": url, "commit": commit, "later": later, "ck": ck1, "ck_later": ck2}
    git_daemon.stop(daemon)


def aiter_pins(server, tag, commit, ck):
    """--build-arg options: the AITER pins of versions.json's default track, with the test
    repository's ("UNRESOLVED" as an unresolved pin is)."""
    args = model.build_args(model.load())
    args.update(AITER_REPOSITORY=f"{server['url']}/aiter.git", AITER_TAG=tag, AITER_COMMIT=commit, CK_COMMIT=ck)
    return [o for k in ("AITER_REPOSITORY", "AITER_TAG", "AITER_COMMIT", "CK_COMMIT", "CK_SUBMODULE_PATH")
            for o in ("--build-arg", f"{k}={args[k]}")]


def build(base_image, server, *, commit, ck, context_dir=None, tag="v1.0", target="aiter-verified",
          output=("--output", "type=cacheonly"), extra=(), root=ROOT):
    cmd = ["docker", "buildx", "build", "--network", "host", "--progress", "plain",
           "-f", "Dockerfile.rocm_base", "--target", target, *output, *extra,
           "--build-arg", f"AITER_SRC_BASE={base_image}",
           # BuildKit parses every FROM, used or not: an unresolved ROCm digest would stop it.
           "--build-arg", f"ROCM_IMAGE={base_image}",
           *aiter_pins(server, tag, commit, ck)]
    if context_dir:
        cmd += ["--build-context", f"aiter-src={context_dir}"]
    start = time.time()
    proc = subprocess.run(cmd + ["."], cwd=root, capture_output=True, text=True, timeout=900)
    print(f"build ({'named context' if context_dir else 'clone'}, commit {commit[:8]}, ck {ck[:8]}): "
          f"rc={proc.returncode} in {time.time() - start:.1f}s")
    return proc


def test_right_pins_build(base_image, git_server):
    proc = build(base_image, git_server, commit=git_server["commit"], ck=git_server["ck"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"aiter-src: OK AITER v1.0 = {git_server['commit']}, CK = {git_server['ck']}" in proc.stderr


def test_wrong_aiter_commit_fails_clearly(base_image, git_server):
    proc = build(base_image, git_server, commit=git_server["later"], ck=git_server["ck"])
    assert proc.returncode != 0
    assert (f"AITER is at {git_server['commit']} but versions.json pins commit {git_server['later']} (tag v1.0)"
            in proc.stderr), proc.stderr[-3000:]


def test_wrong_ck_commit_fails_clearly(base_image, git_server):
    proc = build(base_image, git_server, commit=git_server["commit"], ck=git_server["ck_later"])
    assert proc.returncode != 0
    assert (f"CK submodule is at {git_server['ck']} but versions.json pins ck_commit {git_server['ck_later']}:"
            in proc.stderr), proc.stderr[-3000:]


def test_unresolved_commit_stops_before_cloning(base_image, git_server):
    proc = build(base_image, git_server, commit="UNRESOLVED", ck="UNRESOLVED")
    assert proc.returncode != 0
    assert "aiter.pins.v1.0.commit is UNRESOLVED in versions.json" in proc.stderr
    assert "ALLOW_UNRESOLVED=1" in proc.stderr


@pytest.fixture()
def checkout(tmp_path, git_server):
    dest = tmp_path / "aiter"
    git("clone", "-q", "--recursive", "--branch", "v1.0", f"{git_server['url']}/aiter.git", str(dest), cwd=tmp_path)
    return dest


def test_air_gapped_named_context_builds(base_image, git_server, checkout):
    # the URL in the build args is never contacted: the source comes from the named context
    proc = build(base_image, {**git_server, "url": "git://127.0.0.1:9"}, commit=git_server["commit"],
                 ck=git_server["ck"], context_dir=checkout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "aiter-src: OK" in proc.stderr


def test_air_gapped_named_context_with_wrong_ck_fails(base_image, git_server, checkout):
    git("-C", "3rdparty/composable_kernel", "fetch", "-q", "origin", cwd=checkout)
    git("-C", "3rdparty/composable_kernel", "checkout", "-q", git_server["ck_later"], cwd=checkout)
    proc = build(base_image, git_server, commit=git_server["commit"], ck=git_server["ck"], context_dir=checkout)
    assert proc.returncode != 0
    assert f"CK submodule is checked out at {git_server['ck_later']} but AITER" in proc.stderr, proc.stderr[-3000:]


def layers(tag):
    proc = subprocess.run(["docker", "image", "inspect", "-f", "{{json .RootFS.Layers}}", tag],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def test_source_stages_are_byte_identical_across_cold_builds(base_image, git_server):
    """Two clones of the same commits, no build cache: aiter-src and aiter-verified have the same
    layers (no index stat data, reflog times or checkout times in them)."""
    found = {}
    for target in ("aiter-src", "aiter-verified"):
        for n in (1, 2):
            tag = f"localhost/rocm-vllm-test/{target}:repro-{n}"
            proc = build(base_image, git_server, commit=git_server["commit"], ck=git_server["ck"], target=target,
                         output=("--load", "-t", tag), extra=("--no-cache",))
            assert proc.returncode == 0, proc.stderr[-3000:]
            found[(target, n)] = layers(tag)
        print(f"{target}: {len(found[(target, 1)])} layer(s), identical: {found[(target, 1)] == found[(target, 2)]}")
    assert found[("aiter-src", 1)] == found[("aiter-src", 2)]
    assert found[("aiter-verified", 1)] == found[("aiter-verified", 2)]


def step_ran(proc, stage: str) -> bool:
    """Whether the RUN step of ``stage`` ran in a plain-progress build (False: taken from the cache)."""
    steps = re.findall(r"^#(\d+) \[" + re.escape(stage) + r" [^\]]*\] RUN ", proc.stderr, re.M)
    assert steps, proc.stderr[-3000:]
    return not all(re.search(rf"^#{step} CACHED$", proc.stderr, re.M) for step in steps)


def test_a_file_the_base_does_not_read_leaves_its_steps_cached(base_image, git_server, tmp_path):
    """docker/ is mounted as one folder per step; Dockerfile.rocm_base.dockerignore leaves out what
    the base does not read, so a change to a vLLM-image script, its locks or a runtime module keeps the
    base's steps cached, and a change to a script the step reads runs it again."""
    root = tmp_path / "repo"
    for part in ("Dockerfile.rocm_base", "Dockerfile.rocm_base.dockerignore", "docker", "runtime/src"):
        (root / part).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy2
        copy(ROOT / part, root / part)
    pins = {"commit": git_server["commit"], "ck": git_server["ck"], "target": "aiter-clone", "root": root}
    first = build(base_image, git_server, **pins)
    assert first.returncode == 0, first.stderr[-3000:]
    for ignored in ("docker/build_vllm.sh", "docker/requirements-ray.txt",
                    "runtime/src/rocm_vllm_runtime/serve.py"):
        (root / ignored).parent.mkdir(parents=True, exist_ok=True)
        with open(root / ignored, "a") as out:
            out.write("\n# changed\n")
    (root / "docker/__pycache__").mkdir(exist_ok=True)
    (root / "docker/__pycache__/lib.cpython-311.pyc").write_bytes(b"left by a test run")
    unchanged = build(base_image, git_server, **pins)
    assert unchanged.returncode == 0 and not step_ran(unchanged, "aiter-clone"), unchanged.stderr[-3000:]
    with open(root / "docker/aiter_source.sh", "a") as out:
        out.write("\n# changed\n")
    changed = build(base_image, git_server, **pins)
    assert changed.returncode == 0 and step_ran(changed, "aiter-clone"), changed.stderr[-3000:]


def run_kernel_list_check(source, archs="gfx942;gfx950"):
    """The aiter-check stage's kernel-list step, as Dockerfile.rocm_base runs it."""
    return subprocess.run([sys.executable, "-B", str(ROOT / "docker/check_aiter.py"), "kernel-lists", str(source),
                           "--archs", archs], capture_output=True, text=True)


def test_kernel_list_check_on_the_verified_source(base_image, git_server, tmp_path):
    """The aiter-check stage's kernel-list check (check_aiter.py kernel-lists) on the source the
    aiter-verified stage produced, whose dispatch code is like no AITER release's: it passes for
    the build's GPU archs; with one arch's kernel list removed it stops in one line naming the arch
    and the setting to change. The real stage runs on the ROCm image (not available here), so the
    script runs on the exported stage."""
    out = tmp_path / "verified"
    proc = build(base_image, git_server, commit=git_server["commit"], ck=git_server["ck"],
                 output=("--output", f"type=local,dest={out}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    source = out / "opt" / "aiter" / "src"
    for rel, text in FAKE_DISPATCH.items():
        assert (source / rel).read_text() == text  # the stand-in dispatch code went through the stage
    for arch, rows in FAKE_CSV.items():
        assert sorted(p.name for p in (source / "hsa" / arch / "mla").glob("*.co")) == sorted(
            row.split(",")[-1] for row in rows)
    proc = run_kernel_list_check(source)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0 and "aiter-check: OK (kernel-lists)" in proc.stdout, proc.stderr

    (source / "hsa" / "gfx950" / "mla" / "mla_asm.csv").unlink()
    proc = run_kernel_list_check(source)
    print(proc.stderr)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("aiter-check: ERROR: ") and "no MLA kernel list (*.csv) for gfx950" in line, line
    assert "remove gfx950 from gpu_archs in versions.json" in line
    assert run_kernel_list_check(source, "gfx942").returncode == 0  # a build for gfx942 alone still passes
