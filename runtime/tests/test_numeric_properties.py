"""Properties of the one reading of numbers and URLs (rocm_vllm_runtime.numeric), over generated
text: a value is read as plain decimal in range, or refused with a SettingError naming the
setting; never another exception (int()'s digit limit, an overflow, urllib's ValueError). A URL's
port is a TCP port or the URL is refused: port N + 65536 never reaches the server on N. The one
masking (rocm_vllm_runtime.secret_values) never shows a URL's password. Seeds are fixed (derandomize)
and each property runs a bounded number of examples."""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_vllm_runtime import numeric, secret_values

BOUNDED = settings(derandomize=True, database=None, max_examples=300, deadline=None)
# text that looks like numbers: digits, signs, points, exponents, words, spaces, other scripts
NUMBERISH = st.text(st.sampled_from("0123456789+-._eE xnaifINF\u0663\uff11\u00b2"), max_size=30) | st.text(
    max_size=30) | st.integers().map(str) | st.floats().map(repr) | st.just("9" * 5000)


@BOUNDED
@given(NUMBERISH, st.integers(0, 10), st.integers(10, 10**12))
def test_whole_reads_plain_digits_in_range_or_names_the_setting(text, low, high):
    try:
        value = numeric.whole("N", text, low, high)
    except numeric.SettingError as exc:
        assert str(exc).startswith("N=") and "\n" not in str(exc) and len(str(exc)) < 200
        return
    assert re.fullmatch(r"[0-9]+", text) and value == int(text) and low <= value <= high


@BOUNDED
@given(st.integers(1, 65535), st.integers(0, 5))
def test_every_port_round_trips(port, zeros):
    assert numeric.port("P", "0" * zeros + str(port)) == port


@BOUNDED
@given(NUMBERISH)
def test_durations_are_finite_positive_and_at_most_a_day(text):
    try:
        value = numeric.duration("T", text)
    except numeric.SettingError as exc:
        assert str(exc).startswith("T=")
        return
    assert math.isfinite(value) and 0 < value <= numeric.DAY_S
    assert re.fullmatch(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", text)


@BOUNDED
@given(st.decimals(0, 86400, allow_nan=False, allow_infinity=False, places=3))
def test_plain_decimal_seconds_are_read(value):
    text = f"{value:f}"
    if value == 0:
        with pytest.raises(numeric.SettingError):
            numeric.duration("T", text)
    else:
        assert numeric.duration("T", text) == float(text)


HOSTS = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "example.org", "a-b.example"])


@BOUNDED
@given(st.sampled_from(["http", "https"]), HOSTS, st.integers(0, 300_000))
def test_a_urls_port_is_a_tcp_port_or_the_url_is_refused(scheme, host, port):
    text = f"{scheme}://{host}:{port}"
    if 1 <= port <= 65535:
        assert numeric.url("--url", text).port == port
    else:
        with pytest.raises(numeric.SettingError, match=r"^--url=.*is not a TCP port"):
            numeric.url("--url", text)


@BOUNDED
@given(st.text(max_size=40) | st.text(st.sampled_from(":/[]@?#%. 0123456789abchtps+"), max_size=40))
def test_any_text_is_a_url_or_one_line(text):
    try:
        parts = numeric.url("--url", text)
    except numeric.SettingError as exc:
        assert str(exc).startswith("--url=") and "\n" not in str(exc).replace(text, "")
        return
    assert parts.scheme in ("http", "https") and parts.host
    assert parts.port is None or 1 <= parts.port <= 65535


@BOUNDED
@given(st.text(st.sampled_from("abcdefXYZ0123456789-_.~!$&'()*+,;="), min_size=1, max_size=20), HOSTS,
       st.sampled_from(["", ":8000"]), st.sampled_from(["", "/v1", "/simple/torch/"]))
def test_a_urls_password_is_never_shown(password, host, port, path):
    secret = f"PW{password}"
    text = f"https://user:{secret}@{host}{port}{path}"
    for shown in (secret_values.masked_url(text), secret_values.shown(["--url", text]),
                  secret_values.mask_text(f"fetching {text} failed", [])):
        assert secret not in shown and "https://***@" in shown
    assert numeric.url("--url", text).password == secret
    with pytest.raises(numeric.SettingError) as refused:
        numeric.url("--url", f"https://user:{secret}@{host}:99999{path}")
    assert secret not in str(refused.value) and "https://***@" in str(refused.value)


FINITE = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


@BOUNDED
@given(NON_FINITE, FINITE | NON_FINITE, st.floats(0, 1e6), st.floats(0, 1e6))
def test_a_non_finite_value_never_agrees(bad, other, atol, rtol):
    assert not numeric.agree(bad, other, atol, rtol) and not numeric.agree(other, bad, atol, rtol)


@BOUNDED
@given(FINITE, FINITE, st.floats(0, 10), st.floats(0, 1))
def test_finite_agreement_is_symmetric_and_reflexive(a, b, atol, rtol):
    assert numeric.agree(a, b, atol, rtol) == numeric.agree(b, a, atol, rtol)
    assert numeric.agree(a, a, atol, rtol)
