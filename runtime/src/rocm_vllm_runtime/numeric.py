"""The one reading of numbers from settings (environment variables, command-line options and the
port of a URL): whole numbers, ports, durations, fractions and tolerance pairs; and the one
comparison of two measured numbers within a tolerance. Standard library only (the pin tool
and the Ray node script use it too).

Only plain decimal forms are read: digits, for a real number one optional sign and one decimal
point ("8000", "0.5", "-1"). Exponents, nan, inf, underscores, spaces, repeated signs and non-ASCII
digits are refused. Every setting is bounded: ports 1-65535, durations at most a day, counts at
most the maximum each names. A value outside is a SettingError (a ValueError) that names the
setting, the value (cut short when long) and what it takes: one line, never a traceback."""
from __future__ import annotations

import math
import re
import urllib.parse
from typing import NamedTuple

DAY_S = 86400.0
MAX_PORT = 65535
# The Unix times a reproducible build stamps (SOURCE_DATE_EPOCH): from 1980-01-01, the earliest a
# wheel's zip entries hold, to 2100-01-01 (tools.pins verify and the image manifest read it so).
EPOCH_RANGE = (315532800, 4102444800)
_SHOWN = 40  # characters of a bad value shown in a message
_WHOLE = re.compile(r"[0-9]+")
_REAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


class SettingError(ValueError):
    """A setting's value cannot be used; the message names the setting."""


def _text(raw: object) -> str:
    return str(raw)  # as given: " 8000" is refused, not read as 8000


def _shown(raw: object) -> str:
    text = _text(raw)
    return repr(text) if len(text) <= _SHOWN else repr(text[:_SHOWN]) + f"... ({len(text)} characters)"


def whole(name: str, raw: object, low: int, high: int) -> int:
    """A whole number in [low, high], written in plain decimal digits."""
    text = _text(raw)
    if not _WHOLE.fullmatch(text):
        raise SettingError(f"{name}={_shown(raw)} is not a whole number: give {low} to {high} in decimal digits")
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(high)) or int(digits) > high or int(digits) < low:
        raise SettingError(f"{name}={_shown(raw)} is out of range: give {low} to {high}")
    return int(digits)


def port(name: str, raw: object) -> int:
    """A TCP port, 1-65535."""
    try:
        return whole(name, raw, 1, MAX_PORT)
    except SettingError:
        raise SettingError(f"{name}={_shown(raw)} is not a TCP port (1-{MAX_PORT})") from None


def real(name: str, raw: object, low: float, high: float, *, open_low: bool = False,
         open_high: bool = False) -> float:
    """A number in plain decimal form in the range (bounds open where asked)."""
    text = _text(raw)
    if not _REAL.fullmatch(text) or len(text) > _SHOWN:
        raise SettingError(f"{name}={_shown(raw)} is not a number in plain decimal form (e.g. 0.5)")
    value = float(text)
    too_low = value <= low if open_low else value < low
    too_high = value >= high if open_high else value > high
    if too_low or too_high:
        span = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
        raise SettingError(f"{name}={_shown(raw)} is out of range: give a number in {span}")
    return value


def duration(name: str, raw: object, high: float = DAY_S) -> float:
    """A positive number of seconds, at most high (a day)."""
    try:
        return real(name, raw, 0.0, high, open_low=True)
    except SettingError:
        raise SettingError(f"{name}={_shown(raw)} is not a number of seconds more than 0 and at most "
                           f"{high:g}") from None


def pair(name: str, raw: object, what: str = "A,B", high: float = 1000.0) -> tuple[float, float]:
    """Two numbers from 0 to high, comma-separated (e.g. a tolerance ATOL,RTOL)."""
    parts = _text(raw).split(",")
    try:
        if len(parts) != 2:
            raise SettingError(name)
        return real(name, parts[0], 0.0, high), real(name, parts[1], 0.0, high)
    except SettingError:
        raise SettingError(f"{name}={_shown(raw)} is not {what}: two numbers from 0 to {high:g}, "
                           "comma-separated") from None


class Url(NamedTuple):
    """A URL as read by ``url``: its parts (port: None when the URL gives none)."""
    scheme: str
    host: str  # IPv6 addresses without brackets
    port: int | None
    path: str
    query: str
    fragment: str
    username: str | None
    password: str | None


def url(name: str, raw: object, schemes: tuple[str, ...] = ("http", "https")) -> Url:
    """A URL with one of schemes and a host; its port, when given, read as ``port`` reads one (a
    port of 65536 or more never wraps round onto another). The message names the setting, the
    URL's password masked."""
    from . import secret_values  # noqa: PLC0415  (a sibling module: the one masking)

    text = _text(raw)
    shown = _shown(secret_values.masked_url(text))
    try:
        parts = urllib.parse.urlsplit(text)
        host = parts.hostname
    except ValueError as exc:
        raise SettingError(f"{name}={shown} is not a URL ({exc})") from None
    if parts.scheme not in schemes or not host:
        raise SettingError(f"{name}={shown}: give a URL with its scheme ({' or '.join(schemes)}) and host")
    hostport = parts.netloc.rpartition("@")[2]
    given = hostport.rpartition("]")[2] if hostport.startswith("[") else hostport
    _, colon, port_text = given.rpartition(":")
    if len(secret_values.userinfo_spans(text)) != (1 if "@" in parts.netloc else 0):
        # the masking sees credentials where urllib does not: a "#", "?" or "/" in them ends the
        # authority early, so urllib would take a part of the password for the host or port
        raise SettingError(f"{name}={shown}: its credentials hold a character a URL must percent-encode "
                           "(@ # / ? or a space): give the URL without them")
    try:
        number = port(f"{name}'s port", port_text) if colon else None
    except SettingError:
        raise SettingError(f"{name}={shown}: its port is not a TCP port (1-{MAX_PORT})") from None
    return Url(parts.scheme, host, number, parts.path, parts.query, parts.fragment, parts.username,
               parts.password)


def agree(a: float, b: float, atol: float, rtol: float) -> bool:
    """Whether two measured numbers agree: |a - b| <= atol + rtol * max(|a|, |b|), both finite. A
    non-finite value (nan, inf) never agrees with anything, itself included."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))
