"""Step several open transactions statement by statement, in an order a seeded schedule chooses.

Each session is a thread with its own database connection. A Django
`execute_wrapper` on that connection stops the session before every SQL
statement (savepoints included) until the scheduler grants it one step. The
scheduler picks, from the sessions waiting at their gate, one at random
(`random.Random(seed)`), lets it run exactly one statement, and waits until it
is back at its gate, has finished its operations, or is observed in
`pg_stat_activity` waiting for a lock held by another session. A blocked
session is left blocked (that is the interleaving under test) and the
scheduler steps the others, one of which will release the lock; PostgreSQL's
deadlock detector breaks a cycle, which the code under test must survive.

So transactions are held open across each other's statements in orders a
thread pool would almost never produce: a placement's node lock between a
cordon's UPDATE and its COMMIT, a release between a create's plan and its
INSERT, and so on. Lock waits make the exact order depend on timing too; the
seed fixes every choice the scheduler itself makes.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, connections

# Only a bound that stops a broken run from hanging forever; never part of an assertion.
STALL_SECONDS = 120.0
POLL_SECONDS = 0.005


class _Session(threading.Thread):
    def __init__(self, stepper: Stepper, index: int, work: Sequence[Callable[[], str]]) -> None:
        super().__init__(daemon=True, name=f"torture-session-{index}")
        self.stepper = stepper
        self.index = index
        self.work = work
        self.pid: int | None = None
        self.at_gate = False
        self.granted = False
        self.finished = False
        self.outcomes: list[str] = []
        self.error: BaseException | None = None

    def _gate(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        self.stepper._wait_turn(self)
        return execute(sql, params, many, context)

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            with connection.execute_wrapper(self._gate):
                for step in self.work:
                    try:
                        self.outcomes.append(step())
                    except Exception as exc:  # recorded: the test fails on any unexpected outcome
                        self.outcomes.append(f"error: {type(exc).__name__}: {exc}")
        except BaseException as exc:
            self.error = exc
        finally:
            with self.stepper.cond:
                self.finished = True
                self.stepper.cond.notify_all()
            connections.close_all()


class Stepper:
    """Runs `sessions` (each a list of operations) interleaved statement by statement."""

    def __init__(self, *, seed: int, sessions: Sequence[Sequence[Callable[[], str]]]) -> None:
        self.rng = random.Random(seed)
        self.cond = threading.Condition()
        self.sessions = [_Session(self, i, work) for i, work in enumerate(sessions)]
        self.steps = 0
        self.lock_waits = 0
        self.aborted = False

    def _wait_turn(self, session: _Session) -> None:
        with self.cond:
            session.at_gate = True
            self.cond.notify_all()
            self.cond.wait_for(lambda: session.granted or self.aborted)
            if self.aborted:
                # The scheduler failed: end this session's transaction instead of holding its locks.
                raise RuntimeError("the stepper was aborted")
            # The scheduler cleared `at_gate` when it granted the step, under the same lock,
            # so it never mistakes a session that is about to run for one still waiting.
            session.granted = False

    def _blocked_on_lock(self, session: _Session) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [session.pid])
            row = cursor.fetchone()
        return bool(row and row[0] == "Lock")

    def run(self) -> list[str]:
        """Run every session to its end; return all outcomes (in session order)."""
        for session in self.sessions:
            session.start()
        try:
            self._schedule()
        except BaseException:
            with self.cond:
                self.aborted = True
                self.cond.notify_all()
            for session in self.sessions:
                session.join(STALL_SECONDS)
            raise
        for session in self.sessions:
            session.join(STALL_SECONDS)
            if session.error is not None:
                raise session.error
        return [outcome for session in self.sessions for outcome in session.outcomes]

    def _schedule(self) -> None:
        blocked: set[int] = set()
        while True:
            with self.cond:
                # Wait until every session that is not blocked on a lock is at its gate or done,
                # so the choice below sees the same candidates whatever the thread timing.
                settled = self.cond.wait_for(
                    lambda: all(s.finished or s.at_gate or s.index in blocked for s in self.sessions),  # noqa: B023,
                    timeout=STALL_SECONDS,
                )
                assert settled, "a session neither reached its gate nor finished"
                blocked = {i for i in blocked if not (self.sessions[i].at_gate or self.sessions[i].finished)}
                ready = [s for s in self.sessions if s.at_gate and not s.finished]
                if not ready:
                    if all(s.finished for s in self.sessions):
                        break
                    # Only blocked sessions: PostgreSQL resolves it (a commit elsewhere already
                    # happened, or its deadlock detector fires); wait for one to move.
                    self.cond.wait(POLL_SECONDS * 10)
                    blocked = {i for i in blocked if self._still_blocked(i)}
                    continue
                chosen = self.rng.choice(ready)
                chosen.granted = True
                chosen.at_gate = False
                self.steps += 1
                self.cond.notify_all()
            self._await_step(chosen, blocked)

    def _still_blocked(self, index: int) -> bool:
        session = self.sessions[index]
        return not (session.at_gate or session.finished) and self._blocked_on_lock(session)

    def _await_step(self, chosen: _Session, blocked: set[int]) -> None:
        waited = 0.0
        while True:
            with self.cond:
                back = self.cond.wait_for(lambda: chosen.at_gate or chosen.finished, timeout=POLL_SECONDS)
            if back:
                return
            if self._blocked_on_lock(chosen):
                blocked.add(chosen.index)
                self.lock_waits += 1
                return
            waited += POLL_SECONDS
            assert waited < STALL_SECONDS, f"session {chosen.index} stalled outside a lock wait"
