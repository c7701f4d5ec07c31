"""tools/uv_pip.py: uv, which installs the test and track environments, is given the package sources
and network settings pip would use, from pip's configuration files and its PIP_* variables as pip
itself reads them (uv reads neither); uv's own settings win where both are set."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.pins.locks import uv_command
from tools.uv_pip import (TORCH_CPU_INDEX, command, parse_config_list, pip_settings, pip_sources, torch_sources,
                       uv_environment)

ROOT = Path(__file__).resolve().parents[1]
STRATEGY = ["--index-strategy", "unsafe-best-match"]
SETTINGS = parse_config_list([
    "global.index-url='https://mirror.example/simple'",
    "global.extra-index-url='https://a/x https://b/y'",
    "global.find-links='/opt/wheels\\n/srv/more'",
    "global.cert='/etc/ca.pem'",
    ":env:.default-timeout='180'",
])


def test_each_later_section_overrides_the_one_before_as_pip_applies_them_to_install():
    settings = parse_config_list([
        ":env:.timeout='30'", "install.timeout='20'", "global.timeout='10'",
        "install.index-url='https://install/simple'", "global.index-url='https://global/simple'",
        "download.find-links='/only/for/download'", "global.no_index='false'",
        "not a setting", "global.constraint='/etc/constraints.txt'",
    ])
    assert dict(settings) == {"timeout": "30", "index-url": "https://install/simple", "no-index": "false"}
    assert settings.where == {"timeout": "PIP_TIMEOUT", "index-url": "pip config install.index-url",
                              "no-index": "pip config global.no-index"}
    assert parse_config_list([":env:.default-timeout='15.5'"]).where == {"timeout": "PIP_DEFAULT_TIMEOUT"}


def test_each_source_pip_names_is_passed_on_and_chosen_from_as_pip_chooses():
    assert pip_sources(SETTINGS) == ["--index-url", "https://mirror.example/simple",
                                     "--extra-index-url", "https://a/x", "--extra-index-url", "https://b/y",
                                     "--find-links", "/opt/wheels", "--find-links", "/srv/more", *STRATEGY]
    assert pip_sources({}) == []
    assert pip_sources({"index-url": "https://m/simple"}) == ["--index-url", "https://m/simple"]  # one place
    assert pip_sources({"no-index": "yes", "index-url": "https://m/simple", "extra-index-url": "https://e/",
                        "find-links": "/w"}) == ["--no-index", "--find-links", "/w"]
    assert pip_sources({"trusted-host": "m.internal:8080"}) == ["--allow-insecure-host", "m.internal:8080"]


def test_torch_comes_from_the_wheelhouse_else_pytorchs_cpu_index():
    assert torch_sources(SETTINGS) == pip_sources(SETTINGS)
    assert torch_sources({}) == ["--extra-index-url", TORCH_CPU_INDEX, *STRATEGY]
    assert torch_sources({"index-url": "https://m/simple"}) == \
        ["--index-url", "https://m/simple", "--extra-index-url", TORCH_CPU_INDEX, *STRATEGY]


def test_pips_certificate_timeout_and_proxy_where_uvs_are_unset():
    proxied = parse_config_list([*(f"{k}='{v}'" for k, v in (("global.cert", "/etc/ca.pem"),
                                                             ("global.timeout", "180"),
                                                             ("global.proxy", "http://proxy:3128")))])
    env = uv_environment({}, proxied)
    assert (env["SSL_CERT_FILE"], env["UV_HTTP_TIMEOUT"], env["HTTPS_PROXY"], env["HTTP_PROXY"]) == \
        ("/etc/ca.pem", "180", "http://proxy:3128", "http://proxy:3128")
    own = uv_environment({"SSL_CERT_FILE": "/own.pem", "UV_HTTP_TIMEOUT": "30", "https_proxy": "http://own:1"},
                         proxied)
    assert (own["SSL_CERT_FILE"], own["UV_HTTP_TIMEOUT"], own.get("HTTPS_PROXY")) == ("/own.pem", "30", None)
    assert uv_environment({}, parse_config_list([])) == {}


def test_a_timeout_pip_takes_is_one_uv_takes():
    """pip reads its timeout as a real number; uv only whole seconds (it refuses 15.5 for
    UV_HTTP_TIMEOUT, a setting the user never wrote): rounded up."""
    env = uv_environment({}, parse_config_list([":env:.default-timeout='15.5'"]))
    assert env["UV_HTTP_TIMEOUT"] == "16"
    ok = subprocess.run([*uv_command(), "pip", "install", "--dry-run", "--offline", "--no-deps", "--python",
                         sys.executable, "pip"], env={**os.environ, **env}, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run([*uv_command(), "pip", "install", "--dry-run", "--offline", "--no-deps", "--python",
                              sys.executable, "pip"], env={**os.environ, "UV_HTTP_TIMEOUT": "15.5"},
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "UV_HTTP_TIMEOUT" in refused.stderr  # why the rounding is there


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1e3", "90000"])
def test_a_timeout_uv_cannot_take_stops_in_one_line_naming_pips_setting(value):
    with pytest.raises(SystemExit) as stop:
        uv_environment({}, parse_config_list([f":env:.default-timeout='{value}'"]))
    assert str(stop.value).startswith(f"error: PIP_DEFAULT_TIMEOUT='{value}'") and "\n" not in str(stop.value)


def _pip_config(tmp_path: Path, text: str) -> dict[str, str]:
    """The environment's changes that make pip read text as its configuration file (after the
    machine's own) and nothing from the user's: (to set, to remove)."""
    conf = tmp_path / "pip.conf"
    conf.write_text(text)
    gone = [k for k in os.environ if k.startswith(("PIP_", "UV_", "SSL_CERT", "HTTP", "XDG_CONFIG"))]
    return {"HOME": str(tmp_path), "PIP_CONFIG_FILE": str(conf)}, gone


def _environment(tmp_path: Path, text: str) -> dict[str, str]:
    put, gone = _pip_config(tmp_path, text)
    return {**{k: v for k, v in os.environ.items() if k not in gone}, **put}


def test_pips_own_reading_of_its_files_and_variables(tmp_path, monkeypatch):
    """pip itself reads its files and variables: what `pip install` would use is what uv gets."""
    put, gone = _pip_config(tmp_path, "[global]\nindex-url = https://files.example/simple\ntimeout = 10\n"
                                      "[install]\nfind-links =\n    /w1\n    /w2\n")
    for key in gone:
        monkeypatch.delenv(key)
    for key, value in {**put, "PIP_DEFAULT_TIMEOUT": "15.5"}.items():
        monkeypatch.setenv(key, value)
    settings = pip_settings()
    assert (settings["index-url"], settings["find-links"].split(), settings["timeout"]) == \
        ("https://files.example/simple", ["/w1", "/w2"], "15.5")
    assert settings.where["timeout"] == "PIP_DEFAULT_TIMEOUT"


@pytest.mark.parametrize("argv", [[], ["uv"], ["uv", "pip", "compile"], ["--torch", "uv", "venv"]])
def test_anything_but_a_pip_install_is_refused(argv):
    with pytest.raises(SystemExit, match="usage"):
        command(argv, {})


def test_the_callers_index_strategy_is_kept():
    assert command(["uv", "pip", "install", "--index-strategy", "first-index"], SETTINGS).count("--index-strategy") == 1


def test_the_command_line_runs_uv_with_the_sources_and_environment(tmp_path):
    """Run as ci/test.sh runs it: the program given as UV gets exactly ARGS then the sources pip's
    file and variables name, in the translated environment."""
    seen = tmp_path / "seen.json"
    fake = tmp_path / "uv"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv[1:], 'cert': os.environ.get('SSL_CERT_FILE'), "
                    f"'timeout': os.environ.get('UV_HTTP_TIMEOUT')}}, open({str(seen)!r}, 'w'))\n")
    fake.chmod(0o755)
    env = _environment(tmp_path, "[global]\ncert = /etc/ca.pem\nextra-index-url = https://extra.example/simple\n")
    # as ci/test.sh runs it: a module of the repository root, with the runtime importable (ci/test.sh installs it
    # first; here from its source folder)
    env["PYTHONPATH"] = str(ROOT / "runtime/src")
    run_module = [sys.executable, "-m", "tools.uv_pip"]
    proc = subprocess.run([*run_module, "--torch", fake, "pip", "install", "-r", "x.lock"], cwd=ROOT,
                          env={**env, "PIP_DEFAULT_TIMEOUT": "59.1"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(seen.read_text()) == {
        "argv": ["pip", "install", "-r", "x.lock", "--extra-index-url", "https://extra.example/simple",
                 "--extra-index-url", TORCH_CPU_INDEX, *STRATEGY],
        "cert": "/etc/ca.pem", "timeout": "60"}
    for argv, extra, says in (([tmp_path / "nosuch", "pip", "install"], {}, "error: cannot run"),
                              ([fake, "pip", "install"], {"PIP_DEFAULT_TIMEOUT": "90000"},
                               "error: PIP_DEFAULT_TIMEOUT='90000'"),  # pip takes it, uv is bounded
                              ([fake, "pip", "install"], {"PIP_DEFAULT_TIMEOUT": "soon"},  # pip's own refusal
                               "error: cannot read pip's settings with ")):
        proc = subprocess.run([*run_module, *argv], cwd=ROOT, env={**env, **extra}, capture_output=True, text=True)
        assert proc.returncode == 1 and proc.stderr.startswith(says), proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "default-timeout" in proc.stderr  # pip's words, naming the setting
