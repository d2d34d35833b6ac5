"""The delivery outbox: tell nodes what was committed, after commit, with retries.

The booking transaction writes a `Delivery` row next to what the node must
hear about: "assign" for a create (or the new side of a repair), "shorten" for
a release, a lease expiry, a spot notice (or the old side of a repair). The
row exists exactly when the change committed, so a process that dies between
the commit and the node loses nothing: the row is still there.

After commit the request tries its rows at once
(`outbox_deliver_reservation`; inside an HTTP request, once the response is
written: `deliveries_hold`, which `reservations.api.middleware.DeliverAfterResponse`
calls); what a row tells the nodes is `reservations.delivery.sending`'s. A
row is deleted when the node answered, whether it accepted or refused (a
refusal releases the reservation, guard 6).
When a node cannot be reached (the daemon raised), the row stays with
`attempts + 1`, `last_error` and a next attempt backed off exponentially
(`CAPACITY_DELIVERY_RETRY_SECONDS * 2**attempts`, at most 300 s), and a NOTIFY
on the worker's channel so a sleeping worker moves its next deadline; the
worker delivers due rows with `outbox_deliver_due`.

A row is written due one retry period after its commit, not at once: the
request's own attempt normally deletes it first, so the worker only sees what
the request could not deliver (or never tried, having died).

Both kinds of delivery bring the node in line with what is booked now (an
assignment adds what the node lacks, a shortening cuts what it holds beyond
the bookings), so delivering a row twice, or late, is harmless. A
reservation's rows are delivered in the order they were written (assign
before shorten), by one process at a time: the rows are claimed (deleted,
`SKIP LOCKED`) together with a transaction-scoped advisory lock on the
reservation (which also covers rows written after the claim), so two workers,
or a worker and a request, never deliver one reservation at once. The delivery
runs inside the claiming transaction, so the row is gone in the same commit
as the node's record changes, and back (backed off) when it rolls back. The
usual delivery, one row, costs the claim, what the nodes are sent, and the
commit: no savepoint, no separate delete.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime

from django.conf import settings
from django.core.signals import request_finished
from django.db import connection, transaction

from core.constants import WORKER_CHANNEL
from reservations.delivery import sending
from reservations.models import DeliveryKind

logger = logging.getLogger(__name__)

# The longest wait between two attempts of one row, however many attempts failed.
MAX_RETRY_SECONDS = 300
# How much of a node's error is kept on the row.
MAX_ERROR_CHARS = 2000


def enqueue_sql(*, source: str, kind: str) -> str:
    """The INSERT of one outbox row per `id` of `source`, for a CTE of the statement that makes the change.

    Folded into the statement the booking transaction already runs (the
    reservation's INSERT, the release's UPDATE), so the outbox costs no
    statement of its own. Takes the parameter `%(delivery_retry)s`
    (`delivery_params()`); RETURNS `next_attempt_at`.
    """
    if kind not in DeliveryKind.values:
        raise ValueError(f"unknown delivery kind {kind!r}")
    return (
        "INSERT INTO reservations_delivery"
        " (reservation_id, kind, attempts, next_attempt_at, last_error, created_at)"
        f" SELECT id, '{kind}', 0, compute_now() + make_interval(secs => %(delivery_retry)s), '',"
        f" compute_now() FROM {source} RETURNING next_attempt_at"
    )


def delivery_params() -> dict[str, float]:
    """The parameters `enqueue_sql` takes."""
    return {"delivery_retry": float(settings.CAPACITY_DELIVERY_RETRY_SECONDS)}


def delivery_enqueue(*, reservation_id: str, kind: str) -> None:
    """Write an outbox row in the caller's transaction; it is delivered after commit.

    The caller's commit runs the delivery at once (`transaction.on_commit`);
    what it could not deliver, the worker retries. The worker is woken (its
    channel) so it knows when this row falls due.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH delivery AS ({enqueue_sql(source='(SELECT %(id)s::varchar AS id) AS r', kind=kind)})"
            " SELECT pg_notify(%(channel)s, to_json(next_attempt_at) #>> '{}') FROM delivery",
            {**delivery_params(), "id": reservation_id, "channel": WORKER_CHANNEL},
        )
    deliver_after_commit(reservation_id=reservation_id)


# Deliveries held back until the HTTP response has gone out (`deliveries_hold`),
# per thread: each of a server's threads serves one request at a time.
_after_response = threading.local()


def deliveries_hold() -> None:
    """From now until this thread's response is written (`request_finished`), its deliveries wait.

    Called by the `DeliverAfterResponse` middleware as a request comes in.
    """
    _after_response.held = []


def deliver_after_commit(*, reservation_id: str) -> None:
    """Deliver the reservation's outbox rows once the caller's transaction commits.

    Inside an HTTP request the delivery waits until the response has been
    written (the client waits for nothing but its transaction); anywhere else
    (the worker, the CLI, a test calling the service) it runs at commit. If the
    process dies first, the row is still in the outbox and the worker sends it.
    """
    transaction.on_commit(lambda: _deliver_or_hold(reservation_id))


def _deliver_or_hold(reservation_id: str) -> None:
    held: list[str] | None = getattr(_after_response, "held", None)
    if held is None:
        outbox_deliver_reservation(reservation_id=reservation_id)
    elif reservation_id not in held:
        held.append(reservation_id)


def _deliver_held(**_: object) -> None:
    """`request_finished`: the server has written the response; send what the request held back."""
    held: list[str] | None = getattr(_after_response, "held", None)
    _after_response.held = None
    for reservation_id in held or ():
        outbox_deliver_reservation(reservation_id=reservation_id)


request_finished.connect(_deliver_held, dispatch_uid="reservations.delivery.outbox.deliver_held")


def _record_failure(*, ids: list[int], error: str) -> None:
    """The rows stay for a later attempt, backed off; the worker hears of the new deadline."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE reservations_delivery SET attempts = attempts + 1, last_error = %(error)s,"
            " next_attempt_at = compute_now()"
            " + make_interval(secs => LEAST(%(cap)s, %(retry)s * power(2, LEAST(attempts, 30))))"
            " WHERE id = ANY(%(ids)s)"
            " RETURNING pg_notify(%(channel)s, to_json(next_attempt_at) #>> '{}')",
            {
                "error": error[:MAX_ERROR_CHARS],
                "cap": MAX_RETRY_SECONDS,
                "retry": float(settings.CAPACITY_DELIVERY_RETRY_SECONDS),
                "ids": ids,
                "channel": WORKER_CHANNEL,
            },
        )


class _Undelivered(Exception):
    """The reservation's rows could not all be sent: roll the claim back, then back the rows off."""

    def __init__(self, *, ids: list[int], error: str) -> None:
        super().__init__(error)
        self.ids = ids
        self.error = error


# The reservation's turn (a transaction-scoped advisory lock) and its rows, taken out of the
# outbox, in one round trip: they are deleted now, and come back if the delivery rolls back.
# No row is touched when the turn was not had (`got` is false).
_CLAIM_SQL = """
WITH turn AS (SELECT pg_try_advisory_xact_lock(hashtextextended('outbox:' || %(id)s, 0)) AS got),
taken AS (
    DELETE FROM reservations_delivery WHERE id IN (
        SELECT d.id FROM reservations_delivery d, turn
         WHERE d.reservation_id = %(id)s AND turn.got FOR UPDATE OF d SKIP LOCKED)
    RETURNING id, kind
)
SELECT turn.got, taken.id, taken.kind FROM turn LEFT JOIN taken ON true
"""


def _deliver_claimed(*, reservation_id: str) -> int | None:
    """Deliver a reservation's rows in order, inside the caller's transaction.

    None when another process holds the reservation's rows; else how many rows
    were delivered. The claim deletes them: they are gone exactly when the
    delivery commits. A run of rows of one kind is one delivery (each brings the
    node up to date: a create's "assign", a release's "shorten"); when one
    fails, `_Undelivered` is raised, the caller rolls the claim back (the rows
    are back, and what the nodes' records took in this transaction is undone)
    and backs every row off. Sending the earlier runs again later is harmless.
    """
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, {"id": reservation_id})
        claimed = cursor.fetchall()
    if not claimed or not claimed[0][0]:
        return None
    rows = sorted((row_id, kind) for _, row_id, kind in claimed if row_id is not None)
    previous: str | None = None
    for _, kind in rows:
        if kind == previous:
            continue
        try:
            sending.delivery_send(reservation_id=reservation_id, kind=kind)
        except Exception as exc:
            logger.warning("delivering %s of reservation %s failed: %s", kind, reservation_id, exc)
            raise _Undelivered(ids=[r[0] for r in rows], error=f"{type(exc).__name__}: {exc}") from exc
        previous = kind
    return len(rows)


def _back_off(failed: _Undelivered) -> None:
    """After the claim rolled back: the rows stay, backed off (another process may have sent them since)."""
    try:
        with transaction.atomic():
            _record_failure(ids=failed.ids, error=failed.error)
    except Exception:
        logger.exception("backing off the outbox rows %s failed; they fall due as they are", failed.ids)


def outbox_deliver_reservation(*, reservation_id: str) -> int:
    """After commit: deliver the reservation's rows now; return how many were delivered.

    Never raises: the change is committed, and what could not be delivered
    stays in the outbox for the worker. A reservation whose rows another
    process is delivering is left to it.
    """
    try:
        with transaction.atomic():
            result = _deliver_claimed(reservation_id=reservation_id)
    except _Undelivered as failed:
        _back_off(failed)
        return 0
    except Exception:
        logger.exception("delivering reservation %s to its nodes failed; the worker retries", reservation_id)
        return 0
    return result or 0


_CLAIM_DUE_SQL = """
SELECT reservation_id FROM reservations_delivery
 WHERE next_attempt_at <= compute_now() AND reservation_id <> ALL(%s)
 ORDER BY next_attempt_at, id
 LIMIT 1
   FOR UPDATE SKIP LOCKED
"""


def outbox_deliver_due(*, limit: int = 200) -> int:
    """Deliver the outbox rows whose next attempt is due; return how many were delivered.

    One reservation per transaction: its due row is claimed `FOR UPDATE SKIP
    LOCKED`, then every row of that reservation is delivered in order. A
    reservation is tried at most once per call (a failure waits for its
    backoff), so a call always ends.
    """
    delivered = 0
    tried: list[str] = []
    while len(tried) < limit:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(_CLAIM_DUE_SQL, [tried])
                    row = cursor.fetchone()
                if row is None:
                    break
                reservation_id = row[0]
                tried.append(reservation_id)
                result = _deliver_claimed(reservation_id=reservation_id)
        except _Undelivered as failed:
            _back_off(failed)
            continue
        delivered += result or 0
    return delivered


def outbox_next_attempt() -> datetime | None:
    """When the earliest outbox row falls due (the worker's schedule); None when the outbox is empty."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(next_attempt_at) FROM reservations_delivery")
        row = cursor.fetchone()
    return None if row is None else row[0]
