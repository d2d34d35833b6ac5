"""Durations as the API takes them: seconds, `1h30m`-style strings, or ISO 8601 (`PT8H`, `P1D`)."""

from __future__ import annotations

import re

MIN_SECONDS = 60
MAX_SECONDS = 366 * 86400

_UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_COMPACT = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_ISO = re.compile(r"^P(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


class DurationError(ValueError):
    pass


def parse_duration(value: object, *, minimum: int = MIN_SECONDS, maximum: int = MAX_SECONDS) -> int:
    """Seconds in [minimum, maximum]; DurationError says what is wrong in words a client can act on."""
    if isinstance(value, bool):
        raise DurationError("must be seconds or a duration string such as 1h30m or PT8H")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str):
        text = value.strip()
        match = _COMPACT.match(text) if text and text[0].isdigit() else None
        if match is None and text.startswith("P"):
            match = _ISO.match(text)
        if match is None or not any(match.groups()) or len(text) > 64:
            raise DurationError("must be seconds or a duration string such as 1h30m or PT8H")
        values = [int(group) if group else 0 for group in match.groups()]
        seconds = sum(v * u for v, u in zip(values, _UNITS.values(), strict=True))
    else:
        raise DurationError("must be seconds or a duration string such as 1h30m or PT8H")
    if seconds < minimum or seconds > maximum:
        raise DurationError(f"must be between {minimum} seconds and {maximum // 86400} days")
    return seconds
