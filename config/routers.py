"""The database router: ORM reads of a replica-read handler go to `replica`, all else to `default`.

Which handlers may read the replica, and when, is decided in `core.replica`
(the method, the replica's lag, the tenant's recent writes); this only tells
the ORM the same thing. With no `replica` alias it routes nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from core.replica import REPLICA_ALIAS, reading_replica


class ReplicaRouter:
    """Reads on the replica only inside a replica read; writes and migrations on `default` only."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return REPLICA_ALIAS if reading_replica() else None

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        # The replica is a copy of the primary: objects read from either may be related.
        return True

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool:
        # The replica replays the primary's WAL and the direct alias is the primary itself.
        return db == DEFAULT_DB_ALIAS
