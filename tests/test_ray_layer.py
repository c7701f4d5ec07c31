"""docker/ray_layer.py, install_ray.sh's decisions, run as the Ray stage runs it (a script beside
lock_lines.py): the lock read through lock_lines, the constraints of every installed distribution, the
entries to install, and the check of what the staging root holds."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docker/ray_layer.py"
RAY = "ray==2.49.1 \\\n    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64 + "\n"
MSGPACK = "msgpack==1.1.1 \\\n    --hash=sha256:" + "c" * 64 + "\n"


def layer(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-B", SCRIPT, *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_the_plan_holds_every_distribution_and_takes_the_locks_ray(tmp_path: Path) -> None:
    lock = tmp_path / "requirements-ray.txt"
    lock.write_text("# a lock\n" + RAY + MSGPACK)
    proc = layer("plan", lock, tmp_path)
    assert proc.returncode == 0, proc.stderr
    version, *wanted = proc.stdout.split()
    has_msgpack = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; m.version('msgpack')"],
                                 capture_output=True).returncode == 0
    assert version == "2.49.1" and wanted == (["ray"] if has_msgpack else ["ray", "msgpack"])
    lines = (tmp_path / "requirements.txt").read_text().splitlines()
    assert [line.split()[0] for line in lines] == [f"{n}=={'2.49.1' if n == 'ray' else '1.1.1'}" for n in wanted]
    assert lines[0].split()[1:] == ["--hash=sha256:" + "a" * 64, "--hash=sha256:" + "b" * 64]
    held = (tmp_path / "constraints.txt").read_text().splitlines()
    assert held[0].startswith("#") and "pytest==" + __import__("pytest").__version__ in held


def test_a_lock_without_ray_or_without_hashes_is_one_line_naming_the_lock_command(tmp_path: Path) -> None:
    lock = tmp_path / "requirements-ray.txt"
    for text, says in ((MSGPACK, "has no hash-pinned ray"), ("ray==2.49.1\n", "no --hash=sha256: entry"),
                       (RAY + "--index-url https://x.example\n", "the option --index-url")):
        lock.write_text(text)
        proc = layer("plan", lock, tmp_path)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("install-ray: ERROR: "), proc.stderr
        assert says in lines[0] and "python3 -m tools.pins lock ray" in lines[0], lines[0]
        assert not (tmp_path / "requirements.txt").exists()


def test_a_root_holding_another_distribution_is_refused(tmp_path: Path) -> None:
    import sysconfig
    site = Path(f"{tmp_path}{sysconfig.get_paths()['purelib']}")
    (site / "click-8.1.0.dist-info").mkdir(parents=True)
    (site / "ray-2.49.1.dist-info").mkdir()
    proc = layer("check", tmp_path, "2.49.1", "ray")
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        "install-ray: ERROR: the Ray layer holds click, ray but only ray may be installed: a requirement of Ray "
        "replaced one of the image's distributions; change docker/requirements-ray.in (then python3 -m tools.pins "
        "lock ray)"]
    (site / "click-8.1.0.dist-info").rmdir()
    proc = layer("check", tmp_path, "2.49.1", "ray")  # no ray package under the root: it does not import
    assert proc.returncode == 1 and proc.stderr.startswith("install-ray: ERROR: ray from the Ray layer gives "), \
        proc.stderr
