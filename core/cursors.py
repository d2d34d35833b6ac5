"""Page cursors: the position of a page's last row, as an opaque string a client hands back.

A cursor is base64url of its fields joined by a separator (`|`, or `:` for a
node list's `node:<hostname>`). Clients treat it as opaque, but its wire format
is kept stable so a cursor from before a deploy still reads after it. Anything
that does not decode to the expected fields is INVALID_INPUT naming `cursor`,
never a 500.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from core.errors import InvalidInput

_INVALID = "is not a cursor this API returned"


def cursor_invalid() -> InvalidInput:
    """The one answer to a cursor this API did not write (for the callers' own checks of its fields)."""
    return InvalidInput.field("cursor", _INVALID)


def cursor_encode(*fields: str, sep: str = "|") -> str:
    """The cursor of `fields`, in order; a field must not hold `sep` (but the last may)."""
    return base64.urlsafe_b64encode(sep.join(fields).encode()).decode()


def cursor_decode(cursor: str, *, count: int, sep: str = "|") -> list[str]:
    """The `count` fields a `cursor_encode` wrote (the last keeps any further `sep`), or INVALID_INPUT."""
    try:
        text = base64.urlsafe_b64decode(cursor.encode()).decode()
    except (ValueError, binascii.Error, UnicodeError) as exc:
        raise cursor_invalid() from exc
    fields = text.split(sep, count - 1)
    if len(fields) != count:
        raise cursor_invalid()
    return fields


def cursor_time(text: str) -> datetime:
    """A cursor's time field (`datetime.isoformat()`), which must carry its offset; else INVALID_INPUT."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise cursor_invalid() from exc
    if value.tzinfo is None:
        raise cursor_invalid()
    return value
