"""What this node holds, kept on its own disk: the record guard 6 is checked against.

The agent pulls the service's changes in delivery order and applies each here;
the change and its answer are written together, so a crash leaves either both
or neither, and a change delivered again (after a restart, or an ack lost on
the way) gets the answer it got the first time instead of being applied twice.
Answers stay until the service has confirmed it got them.

A file of the node's own, not a database: the host runs no database server,
and the record must hold when the service cannot be reached. The guarantees
stay in the service's PostgreSQL (the bookings' exclusion constraint); this is
guard 6's second line, on the node, and it is small (what one node holds, and
the answers not yet confirmed).

One JSON document in the agent's state directory. A write takes an exclusive
`flock` on a lock file beside it (two processes never interleave a check and
its write), reads the document, changes it, writes the new one to a temporary
file, `fsync`s it and renames it over the old one, then `fsync`s the directory:
an answer the service has been sent survives a power cut, and a reader sees
the whole old document or the whole new one. A failure before the rename
writes nothing.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from better_compute_agent import guard

logger = logging.getLogger(__name__)

# The document's shape; a newer agent's document is refused rather than misread.
FORMAT_VERSION = 1
State = dict[str, Any]


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


def _empty() -> State:
    return {"version": FORMAT_VERSION, "holdings": {}, "answers": {}, "endings": {}}


def _holding(record: Mapping[str, Any]) -> Holding:
    return Holding(**{**record, "atoms": tuple(record["atoms"])})


def _answer(record: Mapping[str, Any]) -> Answer:
    return Answer(
        delivery_id=record["delivery_id"],
        accepted=record["accepted"],
        reason=record["reason"],
        placement=record["placement"],
    )


def _ordered(holdings: Iterator[Mapping[str, Any]]) -> list[Holding]:
    return sorted((_holding(record) for record in holdings), key=lambda h: (h.start_ms, h.reservation_id))


# Chooses where an accepted assign goes, given the holdings its window overlaps (see `Store.apply`).
Place = Callable[[Mapping[str, Any], list[Holding]], "dict[str, Any] | None"]


class Store:
    """The node's durable record of its holdings and of the answers it owes the service.

    Safe to share between threads of one process (a lock), and between
    processes on the same file (`flock` on `<file>.lock`).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._lock = threading.Lock()
        self._lock_file = open(path.with_name(path.name + ".lock"), "a+b")  # noqa: SIM115 (held open)
        with self._reading() as state:
            version = state.get("version", FORMAT_VERSION)
        if version > FORMAT_VERSION:
            raise RuntimeError(f"{path} was written by a newer agent (format {version} > {FORMAT_VERSION})")

    def _read(self) -> State:
        try:
            with self._path.open("rb") as file:
                state: State = json.load(file)
        except FileNotFoundError:
            return _empty()
        return state

    def _write(self, state: State) -> None:
        temporary = self._path.with_name(self._path.name + ".tmp")
        with temporary.open("wb") as file:
            file.write(json.dumps(state, separators=(",", ":")).encode())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self._path)
        directory = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    @contextmanager
    def _reading(self) -> Iterator[State]:
        with self._lock:
            fcntl.flock(self._lock_file, fcntl.LOCK_SH)
            try:
                yield self._read()
            finally:
                fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    @contextmanager
    def _transaction(self) -> Iterator[State]:
        # The exclusive lock is taken before the read, so the check of what is held
        # and the write that follows it see the same state, even across processes.
        with self._lock:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX)
            try:
                state = self._read()
                yield state
                self._write(state)
            finally:
                fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    def apply(
        self, change: Mapping[str, Any], *, capacity: Mapping[str, int], place: Place | None = None
    ) -> Answer:
        """Apply one delivered change (or refuse it) and record the answer, in one write.

        A malformed change is refused with a reason, not raised; one without a
        usable `deliveryId` cannot be recorded and is answered with delivery id 0.
        A delivery at or below the last applied one is answered as it was the
        first time, and changes nothing. Only a failing disk raises, and then
        nothing was applied and nothing must be acknowledged.

        `place` chooses an accepted assign's placement (its CPUs) in the same
        write, against the holdings its window overlaps, so two assigns never
        pick one CPU from a stale view.
        """
        problem = guard.delivery_id_problem(change)
        if problem is not None:
            logger.warning("refused a change without a usable delivery id: %s", problem)
            return Answer(delivery_id=0, accepted=False, reason=problem)
        delivery_id = int(change["deliveryId"])
        with self._transaction() as state:
            last = self._last(state)
            if delivery_id <= last:
                known = state["answers"].get(str(delivery_id))
                if known is not None:
                    return _answer(known)
                # Never seen, yet older than what was applied: applying it now could
                # undo a later change, so it is refused (and answered like any other).
                late = f"delivery {delivery_id} arrived after delivery {last}; changes apply in order only"
                return self._record(state, Answer(delivery_id, False, late))
            reason = guard.shape_problem(change)
            if reason is None and change["kind"] == "assign":
                held = self._overlapping(state, int(change["start"]), int(change["end"]))
                reason = guard.refusal(change, held, capacity)
                if reason is None:
                    others = [h for h in held if h.reservation_id != change["reservationId"]]
                    placement = place(change, others) if place is not None else None
                    self._assign(state, change, placement)
                    return self._record(state, Answer(delivery_id, True, None, placement))
            elif reason is None:
                self._shorten(state, change)
            if reason is not None:
                logger.warning("refused delivery %s: %s", delivery_id, reason)
            return self._record(state, Answer(delivery_id, reason is None, reason))

    @staticmethod
    def _last(state: State) -> int:
        return max((int(key) for key in state["answers"]), default=0)

    @staticmethod
    def _record(state: State, answer: Answer) -> Answer:
        state["answers"][str(answer.delivery_id)] = {
            **asdict(answer),
            "answered_ms": int(time.time() * 1000),
            "acked": False,
        }
        return answer

    @staticmethod
    def _overlapping(state: State, start: int, end: int) -> list[Holding]:
        return _ordered(h for h in state["holdings"].values() if h["start_ms"] < end and start < h["end_ms"])

    @staticmethod
    def _assign(state: State, change: Mapping[str, Any], placement: dict[str, Any] | None) -> None:
        """Hold the reservation as delivered; a redelivered assign replaces its record."""
        profile = change.get("profile")
        notice = change.get("notice")
        state["holdings"][change["reservationId"]] = asdict(
            Holding(
                reservation_id=change["reservationId"],
                atoms=tuple(dict.fromkeys(change["atoms"])),
                start_ms=int(change["start"]),
                end_ms=int(change["end"]),
                resources={name: int(amount) for name, amount in sorted(guard.claims(change).items())},
                profile=None if profile is None else dict(profile),
                delivery_id=int(change["deliveryId"]),
                placement=placement,
                spot=change.get("spot") is True,
                notice=dict(notice) if isinstance(notice, Mapping) else None,
            )
        )

    @staticmethod
    def _shorten(state: State, change: Mapping[str, Any]) -> None:
        """Cut the reservation's end (never extend it); cut to its start or before, it is gone."""
        held = state["holdings"].get(change["reservationId"])
        if held is None:
            return  # never held (refused, or already pruned): there is nothing to give back
        end = int(change["end"])
        notice = change.get("notice")
        if isinstance(notice, Mapping):
            held["notice"] = dict(notice)
        if end <= held["start_ms"]:
            del state["holdings"][change["reservationId"]]
        elif end < held["end_ms"]:
            held["end_ms"], held["delivery_id"] = end, int(change["deliveryId"])

    def holdings(self, *, at_ms: int | None = None) -> list[Holding]:
        """Every holding, or those live at `at_ms` (start <= at < end), earliest first."""
        with self._reading() as state:
            held = state["holdings"].values()
            if at_ms is None:
                return _ordered(iter(held))
            return _ordered(h for h in held if h["start_ms"] <= at_ms < h["end_ms"])

    def holding(self, reservation_id: str) -> Holding | None:
        with self._reading() as state:
            record = state["holdings"].get(reservation_id)
        return None if record is None else _holding(record)

    def last_delivery_id(self) -> int:
        """The last delivery answered (0 when none): what the agent asks the service for changes after."""
        with self._reading() as state:
            return self._last(state)

    def unacked(self) -> list[Answer]:
        """Answers the service has not confirmed yet, oldest first: send them (again)."""
        with self._reading() as state:
            answers = [_answer(a) for a in state["answers"].values() if not a["acked"]]
        return sorted(answers, key=lambda answer: answer.delivery_id)

    def mark_acked(self, delivery_id: int) -> None:
        """The service confirmed it got this answer; it is no longer sent (an unknown id is ignored)."""
        with self._transaction() as state:
            answer = state["answers"].get(str(delivery_id))
            if answer is not None:
                answer["acked"] = True

    def prune(self, *, before_ms: int) -> int:
        """Drop holdings over by `before_ms` (end <= before_ms); the number dropped.

        Confirmed answers given before `before_ms` go too, except the last one,
        which `last_delivery_id` is read from.
        """
        with self._transaction() as state:
            over = [rid for rid, held in state["holdings"].items() if held["end_ms"] <= before_ms]
            for rid in over:
                del state["holdings"][rid]
            last = self._last(state)
            state["answers"] = {
                key: answer
                for key, answer in state["answers"].items()
                if not (answer["acked"] and answer["answered_ms"] < before_ms and int(key) < last)
            }
        return len(over)

    # --- the ends being enforced ------------------------------------------------------------

    def endings(self) -> dict[str, Ending]:
        with self._reading() as state:
            return {rid: Ending(**ending) for rid, ending in state["endings"].items()}

    def ending_begin(self, reservation_id: str, *, term_ms: int, kill_ms: int) -> Ending:
        """Record that the reservation's processes were sent SIGTERM; the first record stands."""
        with self._transaction() as state:
            ending = state["endings"].setdefault(
                reservation_id,
                asdict(Ending(reservation_id, term_ms=term_ms, kill_ms=kill_ms, killed_ms=None)),
            )
        return Ending(**ending)

    def ending_killed(self, reservation_id: str, *, at_ms: int) -> None:
        with self._transaction() as state:
            ending = state["endings"].get(reservation_id)
            if ending is not None and ending["killed_ms"] is None:
                ending["killed_ms"] = at_ms

    def ending_done(self, reservation_id: str) -> None:
        with self._transaction() as state:
            state["endings"].pop(reservation_id, None)

    def close(self) -> None:
        with self._lock:
            self._lock_file.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
