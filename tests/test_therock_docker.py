"""The therock stages of Dockerfile.rocm_base (therock, triton-wheel, torch-therock: `--target torch`
with ROCM_STACK=therock) built for real on a Docker engine, as far as a CPU allows: TheRock's wheels
come from a stand-in of its release index served over https on 127.0.0.1 (tests/therock_standin.py;
its certificate reaches the build only through the ca-bundle secret), locked by the real uv
(`resolve therock`'s locks.therock_lock), installed by their hashes; Triton is built from a
stand-in repository on a git daemon at the pinned commit. In the image: ROCM_PATH is the SDK's
root, torch reports its ROCm and requires exactly the Triton built, amdsmi imports from the SDK,
`pip check` holds. A lock that is not the pinned one (its sha256) stops the build in the SDK step.
AITER's compile needs the SDK's real compiler: the stand-in has none, so the stages after torch
are not built here."""
from __future__ import annotations

import datetime
import hashlib
import http.server
import json
import shutil
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

import git_daemon
import therock_standin as standin
from git_repo import commit_all, git, new_repo
from tools.pins import locks, model

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.docker(unit="second")
TRITON_VERSION_PREFIX = "3.8.0+git"


def _docker_ready():
    try:
        ok = subprocess.run(["docker", "version"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ok and subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def base_image():
    if not _docker_ready():
        pytest.skip("no Docker engine with buildx answers (bash ci/test-machine/docker-engine.sh start; "
                    "eval \"$(bash ci/test-machine/docker-engine.sh env)\")")
    proc = subprocess.run(["bash", str(ROOT / "ci/test-machine/debian-test-image.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stand-in TheRock index")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "index.crt", folder / "index.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(scope="module")
def upstream(base_image, tmp_path_factory):
    """The stand-in TheRock index over https on 127.0.0.1, a git daemon serving a stand-in Triton
    repository, and the CA bundle (the system's and the index's certificate) for the build secret."""
    top = tmp_path_factory.mktemp("therock-docker")
    simple = standin.index(top / "index", "release", standin.release_wheels())
    cert, key = certificate(top)
    bundle = top / "ca-bundle.crt"
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    bundle.write_text((system.read_text() if system.is_file() else "") + cert.read_text())

    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(top / "index"), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    work, srv = top / "triton", top / "srv"
    (work / "python/triton").mkdir(parents=True)
    new_repo(work)
    (work / "python/triton/__init__.py").write_text("__version__ = 'stand-in'\n")
    commit = commit_all(work, "triton 1")
    version = f"{TRITON_VERSION_PREFIX}{commit[:8]}"
    (work / "python/setup.py").write_text(
        f"from setuptools import setup\nsetup(name='triton', version={version!r}, packages=['triton'])\n")
    commit = commit_all(work, "triton 2: the pinned commit")
    srv.mkdir()
    git("clone", "-q", "--bare", str(work), str(srv / "triton.git"), cwd=top)
    port = git_daemon.free_port()
    url, daemon = f"git://127.0.0.1:{port}", git_daemon.start(srv, port, "triton.git")
    yield {"index": f"https://127.0.0.1:{server.server_address[1]}/simple/", "file_index": simple.as_uri(),
           "bundle": bundle, "triton": {"repository": f"{url}/triton.git", "commit": commit,
                                        "version": version}, "top": top}
    git_daemon.stop(daemon)
    server.shutdown()


def build(base_image, upstream, tmp_path, *, lock_sha256: str | None = None, tag: str | None = None):
    """--target torch of a context holding Dockerfile.rocm_base, docker/ and docker/locks (with the
    stand-in track's lock); the TheRock and Triton build args as versions.json's therock track gives
    them, pointed at the stand-ins."""
    data = model.load(ROOT / "versions.json")
    track = model.therock_track_names(data)[0]
    context = tmp_path / "context"
    context.mkdir(parents=True)
    shutil.copy(ROOT / "Dockerfile.rocm_base", context)
    shutil.copytree(ROOT / "docker", context / "docker", ignore=shutil.ignore_patterns("__pycache__"))
    text = locks.therock_lock(data, track, index_url=upstream["file_index"])
    (context / model.LOCKS_DIR / model.therock_lock_name(track)).write_text(text)
    args = model.build_args(data, track_name_=track)
    pins = {k: v for k, v in args.items() if k.startswith(("THEROCK_", "TRITON_")) and not k.startswith("TRITON_K")}
    pins.update(THEROCK_INDEX_URL=upstream["index"],
                THEROCK_LOCK_SHA256=lock_sha256 or hashlib.sha256(text.encode()).hexdigest(),
                **{f"TRITON_{k.upper()}": v for k, v in upstream["triton"].items()})
    cmd = ["docker", "buildx", "build", "--network", "host", "--progress", "plain", "-f", "Dockerfile.rocm_base",
           "--target", "torch", "--secret", f"id=ca-bundle,src={upstream['bundle']}",
           "--build-arg", "ROCM_STACK=therock", "--build-arg", f"ROCM_IMAGE={base_image}",
           "--build-arg", "PYTHON_VERSION=3.11", *[o for k, v in pins.items() for o in ("--build-arg", f"{k}={v}")],
           *(["--load", "-t", tag] if tag else ["--output", "type=cacheonly"]), str(context)]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    print(f"therock torch stage: rc={proc.returncode} in {time.time() - start:.1f}s")
    return proc


@pytest.fixture(scope="module")
def image(base_image, upstream, tmp_path_factory):
    tag = "localhost/rocm-vllm-test/therock-torch:standin"
    proc = build(base_image, upstream, tmp_path_factory.mktemp("ctx"), tag=tag)
    assert proc.returncode == 0, proc.stderr[-6000:]
    yield tag
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def run_in(image: str, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", image, "bash", "-c", script],
                          capture_output=True, text=True, timeout=300)


def test_the_sdk_is_where_the_environment_says(image):
    proc = run_in(image, 'set -e; [ "$(rocm-sdk path --root)" = "$ROCM_PATH" ]; [ "$HIP_PATH" = "$ROCM_PATH" ]; '
                         'ls -d "$ROCM_PATH/lib" "$SDK_CORE/lib/libamdhip64.so.7"; echo "$LD_LIBRARY_PATH"')
    assert proc.returncode == 0, proc.stderr
    assert "_rocm_sdk_core/lib" in proc.stdout and "_rocm_sdk_devel/lib" in proc.stdout


def test_one_copy_of_each_runtime_library_and_the_loader_knows_the_sdk(image):
    """therock_links.sh: the core's HIP runtime is a link to the devel tree's, librocm_smi64.so.7 a
    link to the core's .so.1, both lib folders in ld.so.conf.d, the SDK's loader without RTLD_GLOBAL."""
    proc = run_in(image, 'set -e; readlink "$SDK_CORE/lib/libamdhip64.so.7"; '
                         'readlink "$ROCM_PATH/lib/librocm_smi64.so.7"; cat /etc/ld.so.conf.d/rocm-sdk.conf; '
                         'python -c "import inspect, rocm_sdk; print(inspect.signature(rocm_sdk.preload_libraries))"')
    assert proc.returncode == 0, proc.stderr
    hip, smi, dev, core, signature = proc.stdout.strip().splitlines()
    assert hip.endswith("_rocm_sdk_devel/lib/libamdhip64.so.7")
    assert smi.endswith("_rocm_sdk_core/lib/librocm_smi64.so.1")
    assert dev.endswith("_rocm_sdk_devel/lib") and core.endswith("_rocm_sdk_core/lib")
    assert "rtld_global: bool = False" in signature


def test_torch_reports_its_rocm_and_requires_the_triton_built(image, upstream):
    version = upstream["triton"]["version"]
    proc = run_in(image, "set -e; python -c 'import torch, triton; print(torch.__version__, torch.version.hip)'; "
                         "python -m pip check; python -c 'import importlib.metadata as m; "
                         "print(\"|\".join(m.requires(\"torch\")))'; python -c 'import amdsmi; print(amdsmi.__file__)'")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    first, requires, amdsmi = lines[0], lines[-2], lines[-1]
    assert first == f"{standin.TORCH['torch']} {standin.SDK}"
    assert f"triton=={version}" in requires.split("|") and standin.TORCH_TRITON not in requires
    assert "/opt/venv/" in amdsmi


def test_only_the_locked_wheels_and_the_built_triton_are_installed(image, upstream):
    proc = run_in(image, "python -m pip list --format json")
    assert proc.returncode == 0, proc.stderr
    installed = {p["name"].lower(): p["version"] for p in json.loads(proc.stdout)}
    assert installed["triton"] == upstream["triton"]["version"]
    for name, version in standin.TORCH.items():
        assert installed[name] == version
    assert installed["rocm-sdk-device-gfx942"] == standin.SDK and "rocm-sdk-device-gfx90a" not in installed


def test_a_lock_other_than_the_pinned_one_stops_the_build(base_image, upstream, tmp_path):
    proc = build(base_image, upstream, tmp_path, lock_sha256="1" * 64)
    assert proc.returncode != 0
    assert f"not the pinned {'1' * 64}: it is not the lock versions.json names" in proc.stderr, proc.stderr[-3000:]
