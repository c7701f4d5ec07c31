"""A URL's credentials are masked whole, wherever a URL is shown (rocm_vllm_runtime.secrets, the one
masking): the userinfo is everything from `scheme://` to the last `@` of its authority (which ends
at the first `/`, `?` or line break), so a password that holds `@`, `#`, `:` or a space, as a
pasted one may, is never shown in part. The reading of a URL (numbers.url) never shows what it
took for a port either. `health --url` is an entry point of both."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_vllm_runtime import numbers, secrets

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
    for shown in (secrets.masked_url(text), secrets.mask_text(text, []), secrets.masked(["--url", text])[1]):
        assert "PW<" not in shown and ">" not in shown.replace("->", ""), shown
        assert "***@" in shown
    try:
        numbers.url("--url", text)
    except numbers.SettingError as exc:
        assert "PW<" not in str(exc) and ">" not in str(exc), str(exc)


@pytest.mark.parametrize(("text", "shown"), [
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
    assert secrets.masked_url(text) == shown


def test_the_values_a_url_holds_are_secrets_to_mask_elsewhere():
    values = secrets.secret_values(["--url", "https://user:p@ss word@host/x"], {})
    assert "p@ss word" in values and secrets.mask_text("log: p@ss word", values) == "log: ***"


@pytest.mark.parametrize("userinfo", ["user:PART1@PART2", "user:PART1#PART2", "user:PART1 PART2",
                                      "user:PART1:PART2", "PART1@PART2"])
def test_health_never_shows_part_of_a_password(userinfo):
    proc = subprocess.run([sys.executable, "-m", "rocm_vllm_runtime.health", "--url",
                           f"http://{userinfo}@127.0.0.1:1"], capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    assert "PART1" not in out and "PART2" not in out, out
