"""What this node holds, kept on its own disk: the record guard 6 is checked against.

The agent pulls the service's changes in delivery order and applies each here;
the change and its answer commit in one SQLite transaction, so a crash leaves
either both or neither, and a change delivered again (after a restart, or an
ack lost on the way) gets the answer it got the first time instead of being
applied twice. Answers stay until the service has confirmed it got them.

SQLite, not the service's PostgreSQL, on purpose: this is the node's own
record, on a host that runs no database server, and it must hold when the
service cannot be reached. The guarantees stay in PostgreSQL (the bookings'
exclusion constraint); this store is guard 6's second line, on the node.

One file in the agent's state directory, in WAL mode with `synchronous=FULL`:
an answer the service has been sent must survive a power cut, or the node
could forget a reservation it accepted.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from better_compute_agent import guard

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS holdings (
    reservation_id TEXT PRIMARY KEY,
    atoms TEXT NOT NULL,
    start_ms INTEGER NOT NULL,
    end_ms INTEGER NOT NULL,
    resources TEXT NOT NULL,
    profile TEXT,
    delivery_id INTEGER NOT NULL,
    CHECK (start_ms < end_ms)
);
-- The overlap query (start < :end AND :start < end) and prune read by end.
CREATE INDEX IF NOT EXISTS holdings_end ON holdings (end_ms);
CREATE TABLE IF NOT EXISTS answers (
    delivery_id INTEGER PRIMARY KEY,
    accepted INTEGER NOT NULL,
    reason TEXT,
    answered_ms INTEGER NOT NULL,
    acked INTEGER NOT NULL DEFAULT 0
);
"""
# Version 2: where each holding's cgroup is placed (the CPUs the ack reported), its spot notice, and
# the ends being enforced (so a restarted agent kills on the same deadline).
UPGRADES = {
    2: [
        "ALTER TABLE holdings ADD COLUMN placement TEXT",
        "ALTER TABLE holdings ADD COLUMN spot INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE holdings ADD COLUMN notice TEXT",
        "ALTER TABLE answers ADD COLUMN placement TEXT",
        "CREATE TABLE IF NOT EXISTS endings ("
        " reservation_id TEXT PRIMARY KEY, term_ms INTEGER NOT NULL, kill_ms INTEGER NOT NULL,"
        " killed_ms INTEGER)",
    ],
}


@dataclass(frozen=True)
class Holding:
    """One reservation the node holds: its atoms and scalar claims over `[start_ms, end_ms)`.

    `delivery_id` is the change that last set it (its assign, or a shorten that cut it).
    """

    reservation_id: str
    atoms: tuple[str, ...]
    start_ms: int
    end_ms: int
    resources: dict[str, int]
    profile: dict[str, Any] | None
    delivery_id: int
    placement: dict[str, Any] | None = None
    spot: bool = False
    # A spot reservation's preemption notice, as delivered: {"givenAt": ms, "endsAt": ms}.
    notice: dict[str, Any] | None = None


@dataclass(frozen=True)
class Answer:
    """What the node answers to one delivery; `reason` says why when it refuses.

    `placement` is where an accepted assign's cgroup goes (CPUs, NUMA nodes, near its GPUs).
    """

    delivery_id: int
    accepted: bool
    reason: str | None
    placement: dict[str, Any] | None = None


@dataclass(frozen=True)
class Ending:
    """A reservation whose end is being enforced: SIGTERM at `term_ms`, SIGKILL due at `kill_ms`."""

    reservation_id: str
    term_ms: int
    kill_ms: int
    killed_ms: int | None


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _holding(row: sqlite3.Row) -> Holding:
    return Holding(
        reservation_id=row["reservation_id"],
        atoms=tuple(json.loads(row["atoms"])),
        start_ms=row["start_ms"],
        end_ms=row["end_ms"],
        resources=json.loads(row["resources"]),
        profile=_loads(row["profile"]),
        delivery_id=row["delivery_id"],
        placement=_loads(row["placement"]),
        spot=bool(row["spot"]),
        notice=_loads(row["notice"]),
    )


def _answer(row: sqlite3.Row) -> Answer:
    return Answer(
        delivery_id=row["delivery_id"],
        accepted=bool(row["accepted"]),
        reason=row["reason"],
        placement=_loads(row["placement"]),
    )


HOLDING_COLUMNS = (
    "reservation_id, atoms, start_ms, end_ms, resources, profile, delivery_id, placement, spot, notice"
)
# Chooses where an accepted assign goes, given the holdings its window overlaps (see `Store.apply`).
Place = Callable[[Mapping[str, Any], list[Holding]], "dict[str, Any] | None"]


class Store:
    """The node's durable record of its holdings and of the answers it owes the service.

    Safe to share between threads of one process (one connection behind a lock);
    another process may read the same file at the same time (WAL).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Autocommit mode: every write below opens its own BEGIN IMMEDIATE.
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        with self._transaction() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{path} was written by a newer agent (schema {version} > {SCHEMA_VERSION})"
                )
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            for target in range(max(version, 1), SCHEMA_VERSION):
                for statement in UPGRADES[target + 1]:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front, so the check of what is held
        # and the write that follows it see the same state, even across processes.
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def apply(
        self, change: Mapping[str, Any], *, capacity: Mapping[str, int], place: Place | None = None
    ) -> Answer:
        """Apply one delivered change (or refuse it) and record the answer, in one transaction.

        A malformed change is refused with a reason, not raised; one without a
        usable `deliveryId` cannot be recorded and is answered with delivery id 0.
        A delivery at or below the last applied one is answered as it was the
        first time, and changes nothing. Only a failing disk raises, and then
        nothing was applied and nothing must be acknowledged.

        `place` chooses an accepted assign's placement (its CPUs) in the same
        transaction, against the holdings its window overlaps, so two assigns
        never pick one CPU from a stale view.
        """
        problem = guard.delivery_id_problem(change)
        if problem is not None:
            logger.warning("refused a change without a usable delivery id: %s", problem)
            return Answer(delivery_id=0, accepted=False, reason=problem)
        delivery_id = int(change["deliveryId"])
        with self._transaction() as db:
            last = self._last(db)
            if delivery_id <= last:
                known = db.execute("SELECT * FROM answers WHERE delivery_id = ?", [delivery_id]).fetchone()
                if known is not None:
                    return _answer(known)
                # Never seen, yet older than what was applied: applying it now could
                # undo a later change, so it is refused (and answered like any other).
                late = f"delivery {delivery_id} arrived after delivery {last}; changes apply in order only"
                return self._record(db, Answer(delivery_id, False, late))
            reason = guard.shape_problem(change)
            if reason is None and change["kind"] == "assign":
                held = self._overlapping(db, int(change["start"]), int(change["end"]))
                reason = guard.refusal(change, held, capacity)
                if reason is None:
                    others = [h for h in held if h.reservation_id != change["reservationId"]]
                    placement = place(change, others) if place is not None else None
                    self._assign(db, change, placement)
                    return self._record(db, Answer(delivery_id, True, None, placement))
            elif reason is None:
                self._shorten(db, change)
            if reason is not None:
                logger.warning("refused delivery %s: %s", delivery_id, reason)
            return self._record(db, Answer(delivery_id, reason is None, reason))

    @staticmethod
    def _last(db: sqlite3.Connection) -> int:
        return int(db.execute("SELECT COALESCE(MAX(delivery_id), 0) FROM answers").fetchone()[0])

    @staticmethod
    def _record(db: sqlite3.Connection, answer: Answer) -> Answer:
        db.execute(
            "INSERT INTO answers (delivery_id, accepted, reason, answered_ms, placement)"
            " VALUES (?, ?, ?, ?, ?)",
            [
                answer.delivery_id,
                int(answer.accepted),
                answer.reason,
                int(time.time() * 1000),
                None if answer.placement is None else json.dumps(answer.placement),
            ],
        )
        return answer

    @staticmethod
    def _overlapping(db: sqlite3.Connection, start: int, end: int) -> list[Holding]:
        rows = db.execute(
            f"SELECT {HOLDING_COLUMNS} FROM holdings WHERE start_ms < ? AND ? < end_ms", [end, start]
        ).fetchall()
        return [_holding(row) for row in rows]

    @staticmethod
    def _assign(db: sqlite3.Connection, change: Mapping[str, Any], placement: dict[str, Any] | None) -> None:
        """Hold the reservation as delivered; a redelivered assign replaces its record."""
        resources = {name: int(amount) for name, amount in sorted(guard.claims(change).items())}
        profile = change.get("profile")
        notice = change.get("notice")
        db.execute(
            f"INSERT INTO holdings ({HOLDING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (reservation_id) DO UPDATE SET atoms = excluded.atoms,"
            " start_ms = excluded.start_ms, end_ms = excluded.end_ms, resources = excluded.resources,"
            " profile = excluded.profile, delivery_id = excluded.delivery_id,"
            " placement = excluded.placement, spot = excluded.spot, notice = excluded.notice",
            [
                change["reservationId"],
                json.dumps(list(dict.fromkeys(change["atoms"]))),
                int(change["start"]),
                int(change["end"]),
                json.dumps(resources),
                None if profile is None else json.dumps(dict(profile), sort_keys=True),
                int(change["deliveryId"]),
                None if placement is None else json.dumps(placement),
                int(change.get("spot") is True),
                json.dumps(dict(notice)) if isinstance(notice, Mapping) else None,
            ],
        )

    @staticmethod
    def _shorten(db: sqlite3.Connection, change: Mapping[str, Any]) -> None:
        """Cut the reservation's end (never extend it); cut to its start or before, it is gone."""
        row = db.execute(
            "SELECT start_ms, end_ms FROM holdings WHERE reservation_id = ?", [change["reservationId"]]
        ).fetchone()
        if row is None:
            return  # never held (refused, or already pruned): there is nothing to give back
        end = int(change["end"])
        notice = change.get("notice")
        if isinstance(notice, Mapping):
            db.execute(
                "UPDATE holdings SET notice = ? WHERE reservation_id = ?",
                [json.dumps(dict(notice)), change["reservationId"]],
            )
        if end <= row["start_ms"]:
            db.execute("DELETE FROM holdings WHERE reservation_id = ?", [change["reservationId"]])
        elif end < row["end_ms"]:
            db.execute(
                "UPDATE holdings SET end_ms = ?, delivery_id = ? WHERE reservation_id = ?",
                [end, int(change["deliveryId"]), change["reservationId"]],
            )

    def holdings(self, *, at_ms: int | None = None) -> list[Holding]:
        """Every holding, or those live at `at_ms` (start <= at < end), earliest first."""
        with self._lock:
            if at_ms is None:
                rows = self._db.execute(
                    f"SELECT {HOLDING_COLUMNS} FROM holdings ORDER BY start_ms, reservation_id"
                ).fetchall()
            else:
                rows = self._db.execute(
                    f"SELECT {HOLDING_COLUMNS} FROM holdings WHERE start_ms <= ? AND ? < end_ms"
                    " ORDER BY start_ms, reservation_id",
                    [at_ms, at_ms],
                ).fetchall()
        return [_holding(row) for row in rows]

    def holding(self, reservation_id: str) -> Holding | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {HOLDING_COLUMNS} FROM holdings WHERE reservation_id = ?", [reservation_id]
            ).fetchone()
        return None if row is None else _holding(row)

    def last_delivery_id(self) -> int:
        """The last delivery answered (0 when none): what the agent asks the service for changes after."""
        with self._lock:
            return self._last(self._db)

    def unacked(self) -> list[Answer]:
        """Answers the service has not confirmed yet, oldest first: send them (again)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT delivery_id, accepted, reason, placement FROM answers WHERE acked = 0"
                " ORDER BY delivery_id"
            ).fetchall()
        return [_answer(row) for row in rows]

    def mark_acked(self, delivery_id: int) -> None:
        """The service confirmed it got this answer; it is no longer sent (an unknown id is ignored)."""
        with self._transaction() as db:
            db.execute("UPDATE answers SET acked = 1 WHERE delivery_id = ?", [delivery_id])

    def prune(self, *, before_ms: int) -> int:
        """Drop holdings over by `before_ms` (end <= before_ms); the number dropped.

        Confirmed answers given before `before_ms` go too, except the last one,
        which `last_delivery_id` is read from.
        """
        with self._transaction() as db:
            dropped = db.execute("DELETE FROM holdings WHERE end_ms <= ?", [before_ms]).rowcount
            db.execute(
                "DELETE FROM answers WHERE acked = 1 AND answered_ms < ?"
                " AND delivery_id < (SELECT MAX(delivery_id) FROM answers)",
                [before_ms],
            )
        return int(dropped)

    # --- the ends being enforced ------------------------------------------------------------

    def endings(self) -> dict[str, Ending]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM endings").fetchall()
        return {
            row["reservation_id"]: Ending(
                row["reservation_id"], row["term_ms"], row["kill_ms"], row["killed_ms"]
            )
            for row in rows
        }

    def ending_begin(self, reservation_id: str, *, term_ms: int, kill_ms: int) -> Ending:
        """Record that the reservation's processes were sent SIGTERM; the first record stands."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO endings (reservation_id, term_ms, kill_ms) VALUES (?, ?, ?)"
                " ON CONFLICT (reservation_id) DO NOTHING",
                [reservation_id, term_ms, kill_ms],
            )
            row = db.execute("SELECT * FROM endings WHERE reservation_id = ?", [reservation_id]).fetchone()
        return Ending(row["reservation_id"], row["term_ms"], row["kill_ms"], row["killed_ms"])

    def ending_killed(self, reservation_id: str, *, at_ms: int) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE endings SET killed_ms = ? WHERE reservation_id = ? AND killed_ms IS NULL",
                [at_ms, reservation_id],
            )

    def ending_done(self, reservation_id: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM endings WHERE reservation_id = ?", [reservation_id])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
