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
before shorten), by one process at a time: the rows are claimed `FOR UPDATE
SKIP LOCKED` together with a transaction-scoped advisory lock on the
reservation (which also covers rows written after the claim), so two workers,
or a worker and a request, never deliver one reservation at once. The delivery
runs inside the claiming transaction, so the row is deleted in the same
commit as the node's record changes.
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


def _deliver_claimed(*, reservation_id: str) -> int | None:
    """Deliver a reservation's rows in order, inside the caller's transaction.

    None when another process holds the reservation's rows; else how many rows
    were delivered (and deleted). A row that failed stays, backed off, with the
    rows after it (they wait for it: the order holds).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox:' || %s, 0))", [reservation_id]
        )
        row = cursor.fetchone()
        if row is None or not row[0]:
            return None
        cursor.execute(
            "SELECT id, kind FROM reservations_delivery WHERE reservation_id = %s ORDER BY id"
            " FOR UPDATE SKIP LOCKED",
            [reservation_id],
        )
        rows = cursor.fetchall()
    done: list[int] = []
    previous: str | None = None
    for index, (row_id, kind) in enumerate(rows):
        if kind != previous:  # a run of one kind is one delivery: each brings the node up to date
            try:
                with transaction.atomic():
                    sending.delivery_send(reservation_id=reservation_id, kind=kind)
            except Exception as exc:
                logger.warning("delivering %s of reservation %s failed: %s", kind, reservation_id, exc)
                _record_failure(ids=[r[0] for r in rows[index:]], error=f"{type(exc).__name__}: {exc}")
                break
        done.append(row_id)
        previous = kind
    if done:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM reservations_delivery WHERE id = ANY(%s)", [done])
    return len(done)


def outbox_deliver_reservation(*, reservation_id: str) -> int:
    """After commit: deliver the reservation's rows now; return how many were delivered.

    Never raises: the change is committed, and what could not be delivered
    stays in the outbox for the worker. A reservation whose rows another
    process is delivering is left to it.
    """
    try:
        with transaction.atomic():
            result = _deliver_claimed(reservation_id=reservation_id)
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
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(_CLAIM_DUE_SQL, [tried])
                row = cursor.fetchone()
            if row is None:
                break
            reservation_id = row[0]
            tried.append(reservation_id)
            result = _deliver_claimed(reservation_id=reservation_id)
        delivered += result or 0
    return delivered


def outbox_next_attempt() -> datetime | None:
    """When the earliest outbox row falls due (the worker's schedule); None when the outbox is empty."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(next_attempt_at) FROM reservations_delivery")
        row = cursor.fetchone()
    return None if row is None else row[0]
