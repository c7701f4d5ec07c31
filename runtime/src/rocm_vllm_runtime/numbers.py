"""The one reading of numbers from settings (environment variables and command-line options):
whole numbers, ports, durations, fractions and tolerance pairs. Standard library only.

Only plain decimal forms are read: digits, for a real number one optional sign and one decimal
point ("8000", "0.5", "-1"). Exponents, nan, inf, underscores, spaces, repeated signs and non-ASCII
digits are refused. Every setting is bounded: ports 1-65535, durations at most a day, counts at
most the maximum each names. A value outside is a SettingError (a ValueError) that names the
setting, the value (cut short when long) and what it takes: one line, never a traceback."""
from __future__ import annotations

import re

DAY_S = 86400.0
MAX_PORT = 65535
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
