"""What each Dockerfile's build context holds. The build steps mount docker/ as one folder, so
Dockerfile.rocm_base.dockerignore leaves out every file the base image's steps do not read: a change
to a vLLM-image script or its locks must not rebuild the base (and with it AITER and vLLM).
Docker-engine proof: tests/test_aiter_src_docker.py::test_a_file_the_base_does_not_read_leaves_its_steps_cached."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ignore_lines(dockerfile: str) -> list[str]:
    text = (ROOT / f"{dockerfile}.dockerignore").read_text()
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def base_reads() -> tuple[set[str], set[str]]:
    """docker/ files the base reads (named in Dockerfile.rocm_base, or in a file it reads), and all of them."""
    tracked = subprocess.run(["git", "ls-files", "docker"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    by_name = {Path(f).name: f for f in tracked}

    def named_in(text: str) -> set[str]:
        return {n for n in by_name if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", text)}

    seen: set[str] = set()
    todo = named_in((ROOT / "Dockerfile.rocm_base").read_text())
    while todo:
        name = todo.pop()
        seen.add(name)
        todo |= named_in((ROOT / by_name[name]).read_text()) - seen
    return {by_name[n] for n in seen}, set(by_name.values())


def test_the_base_context_leaves_out_exactly_the_docker_files_the_base_does_not_read():
    reads, tracked = base_reads()
    left_out = {line for line in ignore_lines("Dockerfile.rocm_base") if line.startswith("docker/")}
    assert left_out == tracked - reads, (
        f"add to Dockerfile.rocm_base.dockerignore: {sorted(tracked - reads - left_out)}; "
        f"remove (the base reads them): {sorted(left_out & reads)}")


def test_compiled_python_left_on_the_host_enters_no_image():
    for dockerfile in ("Dockerfile.rocm_base", "Dockerfile.rocm"):
        assert "**/__pycache__" in ignore_lines(dockerfile), dockerfile
