"""The delivery outbox: tell nodes what was committed, after commit, with retries."""

from __future__ import annotations


def outbox_deliver_due(*, limit: int = 200) -> int:
    """Deliver the outbox rows whose next attempt is due; return how many were delivered."""
    raise NotImplementedError


def delivery_enqueue(*, reservation_id: str, kind: str) -> None:
    """Write an outbox row in the caller's transaction; it is delivered after commit."""
    raise NotImplementedError
