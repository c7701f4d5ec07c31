"""Requirement files as the build scripts read them (docker/vllm_requirements.py): as pip
reads them (continuations, comments, `-r` includes, per-requirement options) and parsed by
`packaging` (names, extras, versions, markers, URLs). No download: small files written here.
The real vLLM requirement files are read in tests/test_vllm_source.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.build_scripts import load

DOCKER = Path(__file__).resolve().parents[1] / "docker"
HASH = "sha256:" + "0" * 64


vr = load("vllm_requirements")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_pins_are_read_as_pip_reads_a_hash_pinned_file(tmp_path):
    """Continuation lines, spaced operators, extras, markers and includes all count; a pin whose
    marker is false for this Python and a range are not pins."""
    write(tmp_path / "scripts.txt", f"ninja==1.13.0 --hash={HASH}  # trailing comment\n")
    tools = write(tmp_path / "tools.txt", (
        "# build tools\n"
        f"setuptools==79.0.1 \\\n    --hash={HASH} \\\n    --hash={HASH}\n"
        f"packaging == 26.2 --hash={HASH}\n"
        f"Foo_Bar[extra]==1.0 ; python_version >= '3' --hash={HASH}\n"
        f"old-only==9.9 ; python_version < '3' --hash={HASH}\n"
        "cmake>=3.26,<4\n"
        "-r scripts.txt\n"))
    pins = {name: version for name, (version, _) in vr.pinned_versions(tools).items()}
    assert pins == {"setuptools": "79.0.1", "packaging": "26.2", "foo-bar": "1.0", "ninja": "1.13.0"}
    assert vr.pinned_versions(tools)["ninja"][1].name == "scripts.txt"


def test_requirement_lines_keep_urls_extras_and_markers(tmp_path):
    write(tmp_path / "b.txt", f"triton==3.8.0 \\\n    --hash={HASH}\n")
    write(tmp_path / "sub/a.txt", "-r ../b.txt\n")
    main = write(tmp_path / "main.txt", (
        "torch-stub @ https://example.invalid/torch_stub-1.0-py3-none-any.whl#sha256=abc ; sys_platform == 'linux'\n"
        "xgrammar[extra] >= 0.1.2 ; platform_machine == 'x86_64'  # a comment\n"
        "-c constraints-that-need-not-exist.txt\n"
        "--extra-index-url https://example.invalid/simple\n"
        "--requirement=sub/a.txt\n"))
    reqs = {r.name: (origin.name, r) for origin, r in vr.read_requirements(main)}
    assert set(reqs) == {"torch-stub", "xgrammar", "triton"}
    assert reqs["torch-stub"][1].url == "https://example.invalid/torch_stub-1.0-py3-none-any.whl#sha256=abc"
    assert reqs["xgrammar"][1].extras == {"extra"} and str(reqs["xgrammar"][1].specifier) == ">=0.1.2"
    assert str(reqs["xgrammar"][1].marker) == 'platform_machine == "x86_64"'
    assert reqs["triton"][0] == "b.txt" and str(reqs["triton"][1].specifier) == "==3.8.0"


def test_an_unreadable_line_names_file_and_line(tmp_path):
    bad = write(tmp_path / "bad.txt", "ok==1\n\nnot a requirement !!\n")
    with pytest.raises(ValueError, match=r"bad.txt:3: cannot parse"):
        vr.read_requirements(bad)


@pytest.mark.parametrize("build", vr.BUILD_REQUIREMENTS)
def test_build_tools_check_names_the_file_that_pins(tmp_path, build):
    """vLLM's build requirements (rocm.txt up to 0.33, rock.txt in 0.34) against our tools, the pin
    in an included file: the problem names that file."""
    src = tmp_path / "vllm"
    write(src / "requirements/common.txt", "regex\n")
    write(src / build, "-r ../common.txt\nsetuptools>=77.0.3,<80.0.0\npackaging>=26.2\ntorch==2.13.0\n")
    write(tmp_path / "requirements-scripts.txt", f"packaging==24.0 \\\n    --hash={HASH}\n")
    tools = write(tmp_path / "requirements-build.txt",
                  f"setuptools==79.0.1 --hash={HASH}\n-r requirements-scripts.txt\n")
    problems, notes = vr.check_build_tools(src, tools)
    assert problems == [f"{build} needs packaging>=26.2 but requirements-scripts.txt pins "
                        "packaging==24.0: change the pin in requirements-scripts.txt"]
    assert len(notes) == 1 and "asks for torch==2.13.0" in notes[0]
