"""The one reading of numbers from settings (environment variables and command-line options):
whole numbers, ports, durations, fractions and tolerance pairs. Every value is finite and in
range, or a SettingError (a ValueError) names the setting, the value and what it takes. Used by
the serving benchmark, the accuracy gate and the health probe."""
from __future__ import annotations

import math


class SettingError(ValueError):
    """A setting's value cannot be used; the message names the setting."""


def _text(raw: object) -> str:
    return str(raw)  # as given: " 8000" is refused, not read as 8000


def whole(name: str, raw: object, low: int = 1, high: int | None = None) -> int:
    """A whole number in [low, high]."""
    text = _text(raw)
    if not (text.isascii() and text.lstrip("+").isdigit()):
        raise SettingError(f"{name}={raw!r} is not a whole number")
    value = int(text)
    if value < low or (high is not None and value > high):
        span = f"{low} or more" if high is None else f"{low} to {high}"
        raise SettingError(f"{name}={value} is out of range: give {span}")
    return value


def port(name: str, raw: object) -> int:
    """A TCP port, 1-65535."""
    try:
        return whole(name, raw, 1, 65535)
    except SettingError:
        raise SettingError(f"{name}={raw!r} is not a TCP port (1-65535)") from None


def real(name: str, raw: object, low: float = 0.0, high: float | None = None, *, open_low: bool = False,
         open_high: bool = False) -> float:
    """A finite number in the range (bounds open where asked); nan, inf and text are refused."""
    text = _text(raw)
    try:
        if text != text.strip():
            raise ValueError(text)
        value = float(text)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingError(f"{name}={raw!r} is not a finite number")
    too_low = value <= low if open_low else value < low
    too_high = high is not None and (value >= high if open_high else value > high)
    if too_low or too_high:
        span = (f"{'more than' if open_low else 'at least'} {low:g}" if high is None else
                f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}")
        raise SettingError(f"{name}={raw!r} is out of range: give a number {span}")
    return value


def duration(name: str, raw: object) -> float:
    """A positive, finite number of seconds."""
    try:
        return real(name, raw, 0.0, open_low=True)
    except SettingError:
        raise SettingError(f"{name}={raw!r} is not a positive, finite number of seconds") from None


def pair(name: str, raw: object, what: str = "A,B") -> tuple[float, float]:
    """Two finite numbers of 0 or more, comma-separated (e.g. a tolerance ATOL,RTOL)."""
    parts = _text(raw).split(",")
    try:
        if len(parts) != 2:
            raise SettingError(name)
        return real(name, parts[0]), real(name, parts[1])
    except SettingError:
        raise SettingError(f"{name}={raw!r} is not {what}: two finite numbers of 0 or more, "
                           "comma-separated") from None
