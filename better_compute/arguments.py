"""The values the CLI's flags take: times, durations and counts, read as the API wants them.

Each is an argparse `type`: a value it cannot read is a usage error (exit 2)
before any request is sent.
"""

from __future__ import annotations

import argparse
import re
from datetime import datetime


class UsageError(Exception):
    """A value the CLI cannot send (exit 2)."""


def parse_time(text: str) -> int:
    """ISO-8601 (naive means local time), epoch milliseconds, or `now`, as epoch milliseconds."""
    value = text.strip()
    if value.lower() == "now":
        return int(datetime.now().timestamp() * 1000)
    if re.fullmatch(r"[0-9]+", value):
        ms = int(value)
        if 0 < ms < 100_000_000_000:
            raise argparse.ArgumentTypeError(
                f"{text!r} looks like seconds; give epoch milliseconds (13 digits) or ISO-8601"
            )
        return ms
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither ISO-8601 (2026-05-04T14:00, 2026-05-04T12:00Z) nor epoch milliseconds"
        ) from None
    # A naive time is local time: `timestamp()` reads it so.
    return int(moment.timestamp() * 1000)


def parse_duration(text: str) -> int | str:
    """Seconds as a number, anything else as the API's duration text (the server reads it)."""
    value = text.strip()
    if not value:
        raise argparse.ArgumentTypeError("a duration cannot be empty")
    return int(value) if value.isdigit() else value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value
