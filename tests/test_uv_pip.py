"""ci/uv_pip.py: uv, which installs the test and track environments, is given the package sources
and network settings pip would use (uv reads no PIP_* setting); uv's own settings win where both
are set."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.uv_pip import TORCH_CPU_INDEX, command, pip_sources, torch_sources, uv_environment

ROOT = Path(__file__).resolve().parents[1]
PIP_SETTINGS = {"PIP_INDEX_URL": "https://mirror.example/simple", "PIP_EXTRA_INDEX_URL": "https://a/x https://b/y",
                "PIP_FIND_LINKS": "/opt/wheels /srv/more", "PIP_CERT": "/etc/ca.pem", "PIP_DEFAULT_TIMEOUT": "180"}


def test_each_source_pip_names_is_passed_on():
    assert pip_sources(PIP_SETTINGS) == ["--index-url", "https://mirror.example/simple",
                                         "--extra-index-url", "https://a/x", "--extra-index-url", "https://b/y",
                                         "--find-links", "/opt/wheels", "--find-links", "/srv/more"]
    assert pip_sources({}) == []


def test_torch_comes_from_the_wheelhouse_else_pytorchs_cpu_index():
    assert torch_sources(PIP_SETTINGS) == pip_sources(PIP_SETTINGS)
    assert torch_sources({}) == ["--extra-index-url", TORCH_CPU_INDEX]
    assert torch_sources({"PIP_INDEX_URL": "https://m/simple"}) == \
        ["--index-url", "https://m/simple", "--extra-index-url", TORCH_CPU_INDEX]


def test_pips_certificate_and_timeout_where_uvs_are_unset():
    env = uv_environment(PIP_SETTINGS)
    assert (env["SSL_CERT_FILE"], env["UV_HTTP_TIMEOUT"]) == ("/etc/ca.pem", "180")
    own = uv_environment({**PIP_SETTINGS, "SSL_CERT_FILE": "/own.pem", "UV_HTTP_TIMEOUT": "30"})
    assert (own["SSL_CERT_FILE"], own["UV_HTTP_TIMEOUT"]) == ("/own.pem", "30")
    assert "SSL_CERT_FILE" not in uv_environment({}) and "UV_HTTP_TIMEOUT" not in uv_environment({})


@pytest.mark.parametrize("argv", [[], ["uv"], ["uv", "pip", "compile"], ["--torch", "uv", "venv"]])
def test_anything_but_a_pip_install_is_refused(argv):
    with pytest.raises(SystemExit, match="usage"):
        command(argv, {})


def test_the_command_line_runs_uv_with_the_sources_and_environment(tmp_path):
    """Run as ci/test.sh runs it: the program given as UV gets exactly ARGS then the sources, in
    the translated environment."""
    seen = tmp_path / "seen.json"
    fake = tmp_path / "uv"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv[1:], 'cert': os.environ.get('SSL_CERT_FILE'), "
                    f"'timeout': os.environ.get('UV_HTTP_TIMEOUT')}}, open({str(seen)!r}, 'w'))\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "SSL_CERT"))}
    proc = subprocess.run([sys.executable, ROOT / "ci/uv_pip.py", "--torch", fake, "pip", "install", "-r", "x.lock"],
                          env={**env, "PIP_CERT": "/etc/ca.pem", "PIP_DEFAULT_TIMEOUT": "60"},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(seen.read_text()) == {"argv": ["pip", "install", "-r", "x.lock", "--extra-index-url",
                                                     TORCH_CPU_INDEX],
                                            "cert": "/etc/ca.pem", "timeout": "60"}
    proc = subprocess.run([sys.executable, ROOT / "ci/uv_pip.py", tmp_path / "nosuch", "pip", "install"],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.startswith("error: cannot run"), proc.stderr
    assert "Traceback" not in proc.stderr

