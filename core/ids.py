"""Prefixed ULID ids (`pool_01k...`): sortable by creation, and matching the API's patterns."""

from __future__ import annotations

import re
from functools import partial

from ulid import ULID

ULID_PATTERN = "[0-9a-hjkmnp-tv-z]{26,52}"


def new_id(prefix: str) -> str:
    # ULIDs are Crockford base32; lowercase so they match ^pool_[0-9a-hjkmnp-tv-z]{26,52}$.
    return f"{prefix}_{str(ULID()).lower()}"


def id_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{prefix}_{ULID_PATTERN}$")


def id_default(prefix: str) -> partial[str]:
    """A model field default; a partial so migrations can serialize it."""
    return partial(new_id, prefix)


PROJECT = "prj"
POOL = "pool"
NODE = "node"
RESERVATION = "rsv"
ALLOCATION = "alloc"
PRINCIPAL = "prn"
TOKEN = "tok"  # noqa: S105 - an id prefix, not a secret
