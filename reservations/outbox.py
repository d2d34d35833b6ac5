"""The delivery outbox: tell nodes what was committed, after commit, with retries."""

from __future__ import annotations


def outbox_deliver_due(*, limit: int = 200) -> int:
    """Deliver the outbox rows whose next attempt is due; return how many were delivered."""
    raise NotImplementedError
