"""What the stand-in daemon's messages are made of: the refusal, an assignment, a node's turn."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction


class AllocationFailed(Exception):
    """The node refused an assignment: an atom overlaps one it holds, or its scalar claims do not fit."""

    def __init__(
        self, device_uid: str, holder: str, *, message: str = "", holders: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message or f"{device_uid} is already assigned to {holder}")
        self.device_uid = device_uid
        self.holder = holder
        # Every reservation whose hold on the node stands in the way (one for an atom).
        self.holders = holders or (holder,)


Assignment = tuple[str, datetime, datetime]  # (device uid, start, end)


@dataclass(frozen=True)
class NodeAssignment:
    """What one node is told about one allocation: its atoms, scalar claims and node profile."""

    node_id: str
    reservation_id: str
    allocation_id: str
    atoms: list[Assignment]
    resources: dict[str, int] = field(default_factory=dict)
    node_profile: dict[str, Any] | None = None


Held = dict[
    str, list[tuple[int, str, str, datetime, datetime]]
]  # uid → (row, holder, allocation, start, end)


def json_value(value: Any) -> Any:
    # Django hands raw jsonb columns back as text.
    return json.loads(value) if isinstance(value, str) else value


def joined() -> AbstractContextManager[Any]:
    """The caller's transaction when there is one (no savepoint: a refusal raises before any write), else one.

    Each message's writes commit with whatever delivered it (the outbox row's
    deletion); called on its own (a test, the resync), a message is its own
    transaction, so the node's lock is held until its writes commit.
    """
    return nullcontext() if connection.in_atomic_block else transaction.atomic()


def lock_nodes(cursor: Any, node_ids: list[str]) -> None:
    """One node's daemon handles one message at a time, as a real agent would (held to commit).

    Several nodes in one statement, in id order (every message takes them in that order).
    """
    cursor.execute(
        "SELECT count(pg_advisory_xact_lock(hashtext('fake-daemon:' || n)))"
        " FROM (SELECT n FROM unnest(%s::varchar[]) AS n ORDER BY n) AS nodes",
        [sorted(set(node_ids))],
    )


# Whether the reservation still runs, its nodes without and with an agent, and (when it runs)
