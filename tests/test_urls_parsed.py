"""URLs are parsed, and decided on by their parts (scheme, userinfo, host, path, percent-decoded),
never searched for a word: TheRock's release index is refused where its host or a path segment
names a nightly or pre-release channel (TheRock's nightly host rocm.nightlies.amd.com, a
percent-encoded path); versions.json never holds an index or repository URL with credentials
(verify names the key, never the value). pip's settings are read as pip reads them: a boolean pip
refuses (PIP_NO_INDEX=garbage) is refused in one line, and a configuration file pip cannot parse is
named, its lines never shown (they may hold an index's credentials)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from owner_scan import python_files

from tools import uv_pip
from tools.pins import model, verify

ROOT = Path(__file__).resolve().parents[1]
BOUNDED = settings(derandomize=True, database=None, max_examples=300, deadline=None)


@pytest.mark.parametrize("url", [
    "https://rocm.nightlies.amd.com/v2/gfx94X-dcgpu/",
    "https://rocm.prereleases.amd.com/whl/",
    "https://stable.repo.amd.com/rocm/%6Eightly/",
    "https://stable.repo.amd.com/rocm/whl-%4Eightly/",
    "https://stable.repo.amd.com/rocm/%256Eightly/",
    "https://rocm.nightl%69es.amd.com/v2/",
    "https://NIGHTLY.repo.amd.com/rocm/whl-next/",
    "https://stable.repo.amd.com/rocm/whl-next/?channel=nightly",
    "https://user:pw@stable.repo.amd.com/rocm/whl-next/",
    "https://stable.repo.amd.com:99999/rocm/whl-next/",
    "http://stable.repo.amd.com/rocm/whl-next/",
    "https:///rocm/whl-next/",
])
def test_a_therock_index_other_than_a_release_one_is_refused(url):
    assert model.therock_index_problem(url) is not None, url


@pytest.mark.parametrize("url", ["https://stable.repo.amd.com/rocm/whl-next/", "https://repo.amd.com/rocm/whl/",
                                 "https://mirror.example/therock/release/"])
def test_a_release_index_is_taken(url):
    assert model.therock_index_problem(url) is None


WORDS = st.sampled_from(["nightly", "nightlies", "Nightly", "NIGHTLIES", "prerelease", "prereleases"])


@BOUNDED
@given(WORDS, st.sampled_from(["host", "path"]), st.sampled_from(["", "rocm-", "whl_"]),
       st.sampled_from(["", "-v2", ".x"]), st.integers(0, 2), st.integers(0, 5))
def test_a_channel_word_in_any_host_label_or_path_segment_however_encoded_is_refused(word, where, before, after,
                                                                                     times, at):
    part = before + word + after
    encoded = "".join(f"%{ord(c):02X}" if i == at % len(part) and times else c for i, c in enumerate(part))
    for _ in range(max(times - 1, 0)):
        encoded = encoded.replace("%", "%25")
    url = (f"https://{encoded}.amd.com/whl/" if where == "host" else f"https://stable.repo.amd.com/{encoded}/whl/")
    assert model.therock_index_problem(url) is not None, url


@BOUNDED
@given(st.text(max_size=60))
def test_any_text_is_a_release_index_or_a_problem(text):
    why = model.therock_index_problem(text)
    assert why is None or ("\n" not in why and why)


# ------------------------------------------------------------------ credentials in versions.json

@pytest.fixture
def data():
    return model.load(ROOT / "versions.json")


@pytest.mark.parametrize("key", ["pytorch.index_url", "vllm.index_url", "aiter.repository", "therock"])
@pytest.mark.parametrize("userinfo", ["user:s3cr@t", "s3cr#t", "user:s3 cr@t"])
def test_verify_refuses_credentials_in_any_url_naming_the_key(data, key, userinfo):
    d = copy.deepcopy(data)
    if key == "therock":
        node, field = d["tracks"][model.therock_track_names(d)[0]]["therock"], "index_url"
        key = f"tracks.{model.therock_track_names(d)[0]}.therock.index_url"
    else:
        section, field = key.split(".")
        node = d[section]
    host = node[field].split("://", 1)[1]
    node[field] = f"https://{userinfo}@{host}"
    errors = verify.check_schema(d)
    assert any(e.startswith(key) and "credentials" in e for e in errors), errors
    assert not any("s3" in e or "cr@t" in e or "cr#t" in e for e in errors), errors


def test_an_ssh_repository_names_its_user_a_https_one_no_credentials(data):
    d = copy.deepcopy(data)
    d["aiter"]["repository"] = "ssh://git@github.com/ROCm/aiter.git"
    assert verify.check_schema(d) == []
    d["aiter"]["repository"] = "https://TOKEN@github.com/ROCm/aiter.git"
    assert any(e.startswith("aiter.repository") and "credentials" in e for e in verify.check_schema(d))


def test_the_therock_command_refuses_an_index_with_credentials_never_showing_them(data, tmp_path):
    d = copy.deepcopy(data)
    name = model.therock_track_names(d)[0]
    d["tracks"][name]["therock"]["index_url"] = "https://user:s3c@r#t@mirror.example/rocm/whl/"
    model.dump(d, tmp_path / "versions.json")
    proc = subprocess.run([sys.executable, "-m", "tools.pins", "--file", tmp_path / "versions.json", "therock"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1 and f"tracks.{name}.therock.index_url" in proc.stderr, proc.stderr
    assert "s3c" not in proc.stdout + proc.stderr and "r#t" not in proc.stdout + proc.stderr


# ------------------------------------------------------------------ pip's settings

@pytest.mark.parametrize("value", ["1", "true", "YES", "on", "y", "T"])
def test_no_index_is_on_where_pip_reads_it_on(value):
    assert uv_pip.pip_sources({"no-index": value, "index-url": "https://m/simple"})[0] == "--no-index"


@pytest.mark.parametrize("value", ["0", "false", "No", "off", "n", "f", ""])
def test_no_index_is_off_where_pip_reads_it_off(value):
    assert uv_pip.pip_sources({"no-index": value, "index-url": "https://m/simple"}) == ["--index-url",
                                                                                       "https://m/simple"]


@pytest.mark.parametrize("value", ["garbage", "2", "yes please", " yes", "tru", "null"])
def test_a_no_index_pip_refuses_is_refused_in_one_line(value):
    settings_ = uv_pip.parse_config_list([f":env:.no-index={value!r}"])
    with pytest.raises(SystemExit) as stop:
        uv_pip.pip_sources(settings_)
    assert "PIP_NO_INDEX" in str(stop.value) and "\n" not in str(stop.value)


def test_a_configuration_file_pip_cannot_parse_is_named_never_shown(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text("index-url = https://user:s3cret@mirror.example/simple\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(conf), HOME=str(tmp_path))
    code = "import sys; from tools import uv_pip; uv_pip.pip_settings()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(conf) in proc.stderr and "s3cret" not in proc.stderr and "mirror.example" not in proc.stderr


# ------------------------------------------------------------------ one owner

def _url_credential_patterns(source: str) -> list[int]:
    """Lines of regular expressions that look for a URL's credentials (a pattern holding both
    "://" and "@"): the one masking (secret_values.userinfo_spans) reads them; no module searches again."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args:
            pattern = node.args[0]
            if isinstance(pattern, ast.Constant) and isinstance(pattern.value, str) and \
                    "://" in pattern.value and "@" in pattern.value:
                found.append(node.lineno)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("partition", "split")) and \
                node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "@" and \
                "netloc" in ast.unparse(node.func):
            found.append(node.lineno)
    return found


def test_only_the_masking_reads_a_urls_credentials():
    owner = "runtime/src/rocm_vllm_runtime/secret_values.py"
    # numeric.url takes the host and port after the userinfo urllib found (and holds it to the masking's)
    known = {"runtime/src/rocm_vllm_runtime/numeric.py": 1}
    offenders = []
    for base in ("runtime/src", "backend/src", "ci", "docker", "tools", "deploy"):
        for path in sorted(python_files(ROOT / base)):
            rel = path.relative_to(ROOT).as_posix()
            if rel == owner or "/tests/" in rel or path.name.startswith("test_"):
                continue
            if len(_url_credential_patterns(path.read_text())) > known.get(rel, 0):
                offenders.append(rel)
    assert offenders == [], offenders
    planted = 'import re\nCREDS = re.compile(r"(\\w+://)([^@/]*)@")\n'
    assert _url_credential_patterns(planted) == [2]


@pytest.mark.parametrize(("url", "proxy"), [
    ("https://user:PART1/PART2@mirror.example/simple/", ""),
    ("https://user:PART1?PART2@mirror.example/simple/", ""),
    ("https://mirror.example/simple/", "user:PART1@127.0.0.1:9"),
    ("https://mirror.example/simple/", "user:PART1-PART2!@127.0.0.1:9"),
])
def test_the_pin_tools_http_errors_never_show_a_password(monkeypatch, url, proxy):
    """tools.pins' HTTP client names the URL and the proxy it went through, their credentials masked
    (rocm_vllm_runtime.secret_values): a password with "/" or "?", a proxy setting without a scheme."""
    from tools.pins import resolve  # noqa: PLC0415

    for name in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.setenv("PINS_TIMEOUT", "5")
    with pytest.raises(model.PinError) as caught:
        resolve._http(url)
    assert "PART1" not in str(caught.value) and "PART2" not in str(caught.value), str(caught.value)
    assert "***@" in str(caught.value)
