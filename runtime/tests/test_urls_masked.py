"""A URL's credentials are masked whole, wherever a URL is shown (rocm_vllm_runtime.secret_values, the one
masking): the userinfo is everything from `scheme://` to the last `@` of its authority (which ends
at the first `/`, `?` or line break), so a password that holds `@`, `#`, `:` or a space, as a
pasted one may, is never shown in part; a password with `/` or `?`, and user:password@host without a
scheme (a proxy setting), are masked whole as well. The reading of a URL (numeric.url) never shows
what it took for a port either. `health --url` is an entry point of both; the pin tool's HTTP
errors are held to it in tests/test_urls_parsed.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_vllm_runtime import numeric, secret_values

BOUNDED = settings(derandomize=True, database=None, max_examples=300, deadline=None)
PASSWORD_CHARS = st.sampled_from("abcXYZ019-_.~!$&'()*+,;=%@#: ")
HOSTS = st.sampled_from(["127.0.0.1", "mirror.example", "[::1]", "pypi.org"])


@BOUNDED
@given(st.text(PASSWORD_CHARS, min_size=1, max_size=20), st.sampled_from(["", "user", "u@ser", "to ken"]), HOSTS,
       st.sampled_from(["", ":8000"]), st.sampled_from(["", "/simple/", "/v1?x=1", "?q", "#frag"]),
       st.sampled_from(["{}", "fetching {} failed", "{} said 401 to me@example.org", "a {}\nb"]))
def test_no_part_of_a_password_is_ever_shown(password, user, host, port, path, frame):
    secret = f"PW<{password}>"
    userinfo = f"{user}:{secret}" if user else secret
    text = frame.format(f"https://{userinfo}@{host}{port}{path}")
    for shown in (secret_values.masked_url(text), secret_values.mask_text(text, []),
                  secret_values.masked(["--url", text])[1]):
        assert "PW<" not in shown and ">" not in shown.replace("->", ""), shown
        assert "***@" in shown
    try:
        numeric.url("--url", text)
    except numeric.SettingError as exc:
        assert "PW<" not in str(exc) and ">" not in str(exc), str(exc)


SLASHED = st.text(st.sampled_from("abcXYZ019-_.~!$&'()*+,;=%@#:/?"), min_size=1, max_size=20)


@BOUNDED
@given(SLASHED, st.sampled_from(["user", "u", "u@ser", "to ken", "x-y.z"]), HOSTS,
       st.sampled_from(["", ":8000"]), st.sampled_from(["", "/simple/", "/v1?x=1", "?q", "#frag", "/a@b"]),
       st.sampled_from(["{}", "fetching {} failed", "{} said 401 to me@example.org", "a {}\nb", "'{}'"]))
def test_a_password_that_holds_a_slash_or_a_question_mark_is_masked_whole(password, user, host, port, path, frame):
    """A pasted password may hold "/" or "?", which end an authority: user:password@ is masked whole
    all the same (more may be masked, never less)."""
    text = frame.format(f"https://{user}:PW<{password}>@{host}{port}{path}")
    for shown in (secret_values.masked_url(text), secret_values.mask_text(text, []),
                  secret_values.masked(["--url", text])[1]):
        assert "PW<" not in shown and ">" not in shown.replace("->", ""), shown
        assert "***@" in shown
    try:
        numeric.url("--url", text)
    except numeric.SettingError as exc:
        assert "PW<" not in str(exc) and ">" not in str(exc), str(exc)


@BOUNDED
@given(st.text(st.sampled_from("abcXYZ019-_.~!$&*+%@#:/?"), min_size=1, max_size=20),
       st.sampled_from(["user", "u", "x-y.z"]), HOSTS, st.sampled_from(["", ":3128"]),
       st.sampled_from(["{}", "through the proxy {}: no answer", "https_proxy={}", "('{}')",
                        "a\n{} said me@example.org"]))
def test_credentials_without_a_scheme_are_masked_wherever_they_stand(password, user, host, port, frame):
    """user:password@host without a scheme (a proxy setting as pip, curl and the pin tool take it)."""
    text = frame.format(f"{user}:PW<{password}>@{host}{port}")
    for shown in (secret_values.masked_url(text), secret_values.mask_text(text, []),
                  secret_values.masked(["--proxy", text])[1]):
        assert "PW<" not in shown and ">" not in shown, shown
        assert "***@" in shown


@pytest.mark.parametrize(("text", "shown"), [
    ("https://u:pa/ss@host/x", "https://***@host/x"),
    ("https://u:pa?ss@host", "https://***@host"),
    ("https://u:p@ss/x@host/y", "https://***@host/y"),
    ("https://u:1234/x@host", "https://***@host"),
    ("user:pw@proxy:3128", "***@proxy:3128"),
    ("through the proxy user:p/w?x@proxy.example:3128: refused", "through the proxy ***@proxy.example:3128: refused"),
    ("https_proxy=user:pw@[::1]:3128", "https_proxy=***@[::1]:3128"),
    ("http://127.0.0.1:8000/x@y", "http://127.0.0.1:8000/x@y"),
    ("https://host.example:443/repo.git@v1.0", "https://host.example:443/repo.git@v1.0"),
    ("debian:bookworm@sha256:" + "a" * 64, "debian:bookworm@sha256:" + "a" * 64),
    ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
    ("at 12:30 me@example.org", "at 12:30 me@example.org"),
    ("https://user:s3cret@host/simple", "https://***@host/simple"),
    ("https://tok@host", "https://***@host"),
    ("https://u:p@ss@host:8000/x", "https://***@host:8000/x"),
    ("https://u:pa#ss@host/x", "https://***@host/x"),
    ("https://u:pa ss@host/x", "https://***@host/x"),
    ("a https://u:p@h/x and https://v:q@k/y", "a https://***@h/x and https://***@k/y"),
    ("git+https://github.com/org/repo@v1.0", "git+https://github.com/org/repo@v1.0"),
    ("https://pypi.org/simple/?a=b@c", "https://pypi.org/simple/?a=b@c"),
    ("no url here user@host", "no url here user@host"),
])
def test_the_userinfo_is_masked_whole_and_nothing_else(text, shown):
    assert secret_values.masked_url(text) == shown


def test_the_values_a_url_holds_are_secrets_to_mask_elsewhere():
    values = secret_values.secret_values(["--url", "https://user:p@ss word@host/x"], {})
    assert "p@ss word" in values and secret_values.mask_text("log: p@ss word", values) == "log: ***"


@pytest.mark.parametrize("url", [f"http://{u}@127.0.0.1:1" for u in (
    "user:PART1@PART2", "user:PART1#PART2", "user:PART1 PART2", "user:PART1:PART2", "PART1@PART2",
    "user:PART1/PART2", "user:PART1?PART2")] + ["user:PART1/PART2@127.0.0.1:1", "user:PART1@127.0.0.1:1"])
def test_health_never_shows_part_of_a_password(url):
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.health", "--url", url],
                          capture_output=True, text=True, timeout=60, env={**os.environ})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    assert "PART1" not in out and "PART2" not in out, out
