"""Durations as the API takes them: seconds, `1h30m`-style strings, or ISO 8601 (`PT8H`, `P1D`).

The grammar is deliberately narrow so that a typo is refused instead of being
read as something else:

* an integer is seconds (a boolean is not an integer here), and so is a string
  of digits alone (`"3600"`);
* a compact string is units in the order w, d, h, m, s, each at most once,
  lower case, no spaces inside (`90s`, `45m`, `8h`, `1d`, `2w`, `1h30m`);
* an ISO 8601 string is `P[nW][nD][T[nH][nM][nS]]` with upper-case designators;
  a `T` must be followed by at least one time part (`P1DT` is refused), and
  years and months are refused because their length in seconds depends on the
  calendar.

Digits are ASCII only: Python's `\\d` and `int()` would otherwise accept other
scripts' digits. Surrounding whitespace is tolerated, as CLI users paste it.
"""

from __future__ import annotations

import re

MIN_SECONDS = 60
MAX_SECONDS = 366 * 86400
# Longer strings are refused before any parsing, so the parser's cost is bounded
# whatever a client sends.
MAX_TEXT_LENGTH = 64

_UNITS = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_COMPACT = re.compile(r"(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_ISO = re.compile(r"P(?:([0-9]+)W)?(?:([0-9]+)D)?(?:T(?=[0-9])(?:([0-9]+)H)?(?:([0-9]+)M)?(?:([0-9]+)S)?)?")


def _chain(units: str) -> str:
    """Units in order, each at most once, at least one: `[0-9]+w([0-9]+d)?…|[0-9]+d…|…`."""
    return "|".join(
        f"[0-9]+{first}" + "".join(f"(?:[0-9]+{unit})?" for unit in units[i + 1 :])
        for i, first in enumerate(units)
    )


# The strings `parse_duration` reads, as one ECMA-262 pattern without lookarounds (so that
# schema-driven generators can use it): digits alone, the compact form, or ISO 8601.
# Stricter than the parser only in refusing surrounding whitespace.
DURATION_PATTERN = (
    f"^(?:[0-9]+|{_chain('wdhms')}"
    f"|P(?:[0-9]+W(?:[0-9]+D)?(?:T(?:{_chain('HMS')}))?|[0-9]+D(?:T(?:{_chain('HMS')}))?|T(?:{_chain('HMS')})))$"
)

_SHAPE = "must be seconds or a duration string such as 90s, 1h30m, 1d or PT8H"


class DurationError(ValueError):
    """A duration the API cannot take; the message is written for the client."""


def _seconds_of(text: str) -> int:
    """Seconds of a compact or ISO string, without range checks."""
    text = text.strip()
    if not text or len(text) > MAX_TEXT_LENGTH:
        raise DurationError(_SHAPE)
    if text.isascii() and text.isdigit():
        # A bare number in a string is seconds, as the integer form is.
        return int(text)
    match = _ISO.fullmatch(text) if text.startswith("P") else _COMPACT.fullmatch(text)
    if match is None or not any(group is not None for group in match.groups()):
        if text.startswith("P") and re.search(r"[YM]", text.split("T", 1)[0]):
            raise DurationError("years and months are not fixed lengths; use weeks or days")
        raise DurationError(_SHAPE)
    return sum(int(group) * unit for group, (_, unit) in zip(match.groups(), _UNITS, strict=True) if group)


def parse_duration(value: object, *, minimum: int = MIN_SECONDS, maximum: int = MAX_SECONDS) -> int:
    """Seconds in [minimum, maximum]; DurationError says what is wrong in words a client can act on."""
    if isinstance(value, bool):
        raise DurationError(_SHAPE)
    if isinstance(value, float) and value.is_integer():
        # JSON has one number type: 3600.0 is the integer 3600, as JSON Schema reads it.
        value = int(value)
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str):
        seconds = _seconds_of(value)
    else:
        raise DurationError(_SHAPE)
    if seconds < minimum or seconds > maximum:
        raise DurationError(f"must be between {_describe(minimum)} and {_describe(maximum)}")
    return seconds


def format_duration(seconds: int) -> str:
    """The shortest compact form (`1h30m`), which `parse_duration` reads back to `seconds`."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
        raise DurationError("must be a non-negative integer number of seconds")
    if seconds == 0:
        return "0s"
    parts = []
    rest = seconds
    for name, unit in _UNITS:
        count, rest = divmod(rest, unit)
        if count:
            parts.append(f"{count}{name}")
    return "".join(parts)


def _describe(seconds: int) -> str:
    if seconds % 86400 == 0 and seconds >= 86400:
        return f"{seconds // 86400} days"
    return f"{seconds} seconds"
