"""One option of a plan, all members or none: locked (guard 4), booked (guard 1), claimed (guard 3).

Inside a savepoint, a nested `atomic()`, when the option displaces spot
bookings or the create is on its careful second run; otherwise without one,
every member locked before anything is written, and a race lost after
writing restarts the create (`PlacementRestart`):

1. for each member, lock the node `FOR SHARE OF n` under the schedulability
   predicate, then the chosen atoms `FOR SHARE` where healthy and bookable
   (guard 4);
2. in displace mode, decide the window: the displaced one (the spot notice's
   end) only when a spot booking on the option's atoms stands in the plain
   window, and then give notice to the spot reservations booked in it; an
   option that displaces nothing is booked for the plain window;
3. for each member, insert the allocation, then every booking in ONE
   `INSERT ... SELECT ... ON CONFLICT DO NOTHING` (guard 1: the exclusion
   constraint decides), then claim the scalars with the guarded `UPDATE`
   (guard 3).

Any short row count means a concurrent transaction got there first: the
option is passed (inside a savepoint, rolled back) and the commit
(`reservations.placer.commit`) tries the next. Nothing here raises on a race
lost inside a savepoint, so the request's transaction survives it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace

from django.db import IntegrityError, OperationalError, connection, transaction

from core.retry import lost_deadlock
from inventory.schedulability import schedulable_sql
from inventory.services.resources import node_resources_claim
from reservations.models import Allocation, Reservation
from reservations.placer.filters import Window
from reservations.placer.notice import spot_notice
from reservations.placer.plan import Member, Option
from reservations.request.types import ReservationRequest

logger = logging.getLogger(__name__)

# Test seams: called with (point, node_id) at known points of a member's
# commit, so tests can hold a placement open while another transaction acts.
# Points: "before_node_lock", "after_locks".
HOOKS: list[Callable[[str, str], None]] = []

_LOCK_NOT_AVAILABLE = "55P03"


class _LostRace(Exception):
    """A guarded statement returned fewer rows: roll back the savepoint and move on."""


class _Taken(_LostRace):
    """The option's atoms were all taken by concurrent placements, seen before anything was written."""


def _lock_cycle(exc: OperationalError) -> bool:
    """PostgreSQL broke a lock cycle, or a lock was not to be had: a race lost, not a fault."""
    return lost_deadlock(exc) or getattr(exc.__cause__, "sqlstate", None) == _LOCK_NOT_AVAILABLE


def _passed(option: Option, why: Exception, *, after_writing: bool = False) -> None:
    """Say why an option was passed: operators (and the benchmark) count these lines."""
    node_id = option.members[0].node_id
    if isinstance(why, _Taken):
        logger.info("placement passed over option %s: %s", node_id, why)
    elif after_writing:
        logger.info("placement lost a race on option %s after writing: %s", node_id, why)
    else:
        logger.info("placement lost a race on option %s: %s", node_id, why)


def _hook(point: str, node_id: str) -> None:
    for hook in list(HOOKS):
        hook(point, node_id)


# Guard 4. A cordon, taint, maintenance, liveness or trust write UPDATEs this
# row. If it committed first, this statement waits for it and re-checks the
# predicate on the new row version (0 rows); if this lock is taken first,
# the writer waits until the placement commits. Either way the second sees
# the first, so no booking is made on a node that was just made unschedulable.
_LOCK_NODE_SQL = (
    "SELECT n.id FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id"
    " WHERE n.id = %s AND n.pool_id = %s AND p.archived_at IS NULL"
    f" AND {schedulable_sql('n', 'p.owner_id')} FOR SHARE OF n"
)


def _lock_node(*, node_id: str, pool_id: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_NODE_SQL, [node_id, pool_id])
        return cursor.fetchone() is not None


def _lock_atoms(*, node_id: str, device_ids: list[int]) -> bool:
    # Guard 4 for devices: a health flip, a quarantine or a report that makes a
    # device unbookable UPDATEs the device row, so it serializes with this lock
    # exactly as the node's does. Ordered by id so concurrent lockers agree.
    # `FOR NO KEY UPDATE`, as the one-atom claim takes, not `FOR SHARE`: two placements
    # of one atom then book one after the other. Under `FOR SHARE` both inserted their
    # bookings, each then waited for the other's at the exclusion check (a plain
    # insert checks after inserting), and PostgreSQL broke the cycle only after
    # `deadlock_timeout`. It does not block the bookings' foreign-key checks (`KEY SHARE`).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM inventory_device WHERE id = ANY(%s) AND node_id = %s AND healthy AND bookable"
            " ORDER BY id FOR NO KEY UPDATE",
            [device_ids, node_id],
        )
        return len(cursor.fetchall()) == len(device_ids)


# The allocation and every booking of a member in one statement. Guard 1: the exclusion
# constraint refuses an atom booked by a concurrent commit, and the refusal is a lost
# race: the statement fails, and the caller's savepoint, or the create's restart, takes
# back what the transaction wrote. Not `ON CONFLICT DO NOTHING`, which answered a short
# count instead: it checks the constraint before the insert as well as after, two scans
# of the GiST index where one does, 1.1 M of the 3.5 M instructions PostgreSQL ran for
# this statement. The atoms' locks and the claim's check as of now make the refusal rare.
# (The bookings' foreign key to the allocation is checked at commit; the row is there by
# then, or both are rolled back.)
_BOOK_SQL = """
WITH allocation AS (
    INSERT INTO reservations_allocation
           (id, reservation_id, node_id, resources, placement, released, created_at)
    VALUES (%(allocation)s, %(reservation)s, %(node)s, %(resources)s::jsonb, NULL, false, DEFAULT)
    RETURNING created_at
), booked AS (
    INSERT INTO device_bookings (device_id, allocation_id, purpose, during)
    SELECT d.id, %(allocation)s, 'allocation', tstzrange(%(start)s, %(end)s, '[)')
      FROM unnest(%(devices)s::bigint[]) AS d(id) ORDER BY d.id
    RETURNING 1
)
SELECT (SELECT created_at FROM allocation), (SELECT count(*) FROM booked)
"""
_EXCLUSION_VIOLATION = "23P01"


def _insert_bookings(*, allocation: Allocation, device_ids: list[int], window: Window) -> bool:
    """Insert the allocation and its bookings; False when a booking lost to a concurrent one (guard 1).

    After False the transaction (or its savepoint) is failed: the caller rolls it back.
    """
    with connection.cursor() as cursor:
        try:
            cursor.execute(
                _BOOK_SQL,
                {
                    "allocation": allocation.id,
                    "reservation": allocation.reservation_id,
                    "node": allocation.node_id,
                    "resources": json.dumps(allocation.resources),
                    "start": window.start,
                    "end": window.end,
                    "devices": device_ids,
                },
            )
        except IntegrityError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == _EXCLUSION_VIOLATION:
                return False
            raise
        row = cursor.fetchone()
    assert row is not None
    allocation.created_at = row[0]
    allocation._state.adding = False
    return int(row[1]) == len(device_ids)


def _spot_in_the_way(*, device_ids: list[int], window: Window, displaced: Window) -> tuple[bool, list[str]]:
    """Whether a spot booking on these atoms stands in the plain window, and the spot reservations to cut.

    One statement over both windows (the displaced one starts and ends no
    earlier than the plain one). A spot booking overlapping the plain window
    is why the request cannot have it: the option then takes the displaced
    window, and every spot reservation booked in that window gets a notice.
    With none in the plain window, nothing is displaced and the option takes
    the plain window: the atoms are simply free.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.id, bool_or(b.during && tstzrange(%s, %s, '[)')),"
            " bool_or(b.during && tstzrange(%s, %s, '[)'))"
            " FROM device_bookings b"
            " JOIN reservations_allocation a ON a.id = b.allocation_id"
            " JOIN reservations_reservation r ON r.id = a.reservation_id"
            " WHERE b.device_id = ANY(%s) AND b.during && tstzrange(%s, %s, '[)') AND r.spot"
            " GROUP BY r.id ORDER BY r.id",
            [
                window.start,
                window.end,
                displaced.start,
                displaced.end,
                device_ids,
                window.start,
                max(window.end, displaced.end),
            ],
        )
        rows = cursor.fetchall()
    in_the_way = any(in_plain for _, in_plain, _ in rows)
    return in_the_way, [reservation_id for reservation_id, _, in_displaced in rows if in_displaced]


def _lock_one_of(*, node_id: str, candidates: list[int], window: Window) -> int | None:
    # Guard 4 for a one-atom member, and a claim: the first of the planned atom
    # and its alternates that is healthy, bookable, free for the window as of
    # now (not as of the plan's snapshot: a placement that committed since has
    # booked it) and not held by another placement right now. `FOR NO KEY
    # UPDATE SKIP LOCKED` passes over an atom a concurrent placement holds (it
    # conflicts with that one's lock) instead of booking it too and losing at
    # the exclusion constraint after its commit. Guard 1 still decides.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT d.id FROM inventory_device d WHERE d.id = ANY(%(ids)s) AND d.node_id = %(node)s"
            " AND d.healthy AND d.bookable AND NOT EXISTS (SELECT 1 FROM device_bookings b"
            " WHERE b.device_id = d.id AND COALESCE(upper(b.during), 'infinity'::timestamptz) > %(start)s"
            " AND lower(b.during) < %(end)s)"
            " ORDER BY array_position(%(ids)s, d.id) LIMIT 1 FOR NO KEY UPDATE OF d SKIP LOCKED",
            {"ids": candidates, "node": node_id, "start": window.start, "end": window.end},
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def _lock_member(*, request: ReservationRequest, member: Member, window: Window, claim: bool) -> Member:
    """Guard 4 for one member: its node, then its atoms; the member as locked, or `_LostRace`.

    With `claim`, a one-atom member takes the first of its planned atom and its
    alternates that no concurrent placement holds or has booked since the plan
    (`_lock_one_of`), and when there is none the option is passed over
    (`_Taken`) before anything is written.
    """
    _hook("before_node_lock", member.node_id)
    if not _lock_node(node_id=member.node_id, pool_id=request.pool_id):
        raise _LostRace("node no longer schedulable")
    if claim and len(member.device_ids) == 1 and not member.displaced:
        planned = [(member.device_ids[0], member.atoms[0]), *member.alternates]
        taken = _lock_one_of(
            node_id=member.node_id, candidates=[device_id for device_id, _ in planned], window=window
        )
        if taken is None:
            raise _Taken("every free atom of the node is booked or held by another placement")
        uid = dict(planned)[taken]
        member = replace(member, device_ids=(taken,), atoms=(uid,), alternates=())
    elif not _lock_atoms(node_id=member.node_id, device_ids=sorted(member.device_ids)):
        raise _LostRace("atoms no longer healthy and bookable")
    _hook("after_locks", member.node_id)
    return member


def _book_member(
    *, reservation: Reservation, request: ReservationRequest, member: Member, window: Window
) -> Allocation:
    """The allocation, its bookings (guard 1) and its scalar claims (guard 3); a lost race raises."""
    claims = {name: amount for name, amount in sorted(request.resources.items()) if amount > 0}
    allocation = Allocation(reservation=reservation, node_id=member.node_id, resources=claims)
    if not _insert_bookings(allocation=allocation, device_ids=sorted(member.device_ids), window=window):
        raise _LostRace("atoms booked concurrently")
    if not node_resources_claim(node_id=member.node_id, resources=claims):
        raise _LostRace("scalars claimed concurrently")
    return allocation


class PlacementRestart(Exception):
    """The savepoint-free commit lost a race after it wrote (or PostgreSQL broke a lock cycle).

    The request's transaction cannot undo that piece alone: the create rolls
    back whole and runs again with `careful` set (`reservations.services`).
    """


_Booked = tuple[list[tuple[Allocation, Member]], list[str], Window]


def try_option(
    *,
    reservation: Reservation,
    request: ReservationRequest,
    option: Option,
    window: Window,
    displaced: Window | None,
    careful: bool,
) -> _Booked | None:
    """All members or none. The usual option is tried without a savepoint (`_try_option_direct`).

    A displacing option gives spot reservations notice before it books, and a
    `careful` commit (the second run of a create that had to restart) may not
    restart again: both keep the savepoint around the whole option.
    """
    if displaced is not None or careful:
        return _try_option_in_savepoint(
            reservation=reservation, request=request, option=option, window=window, displaced=displaced
        )
    return _try_option_direct(reservation=reservation, request=request, option=option, window=window)


def _try_option_direct(
    *, reservation: Reservation, request: ReservationRequest, option: Option, window: Window
) -> _Booked | None:
    """Every member locked first, then booked: no savepoint (two statements fewer per create).

    A race lost while locking wrote nothing, so the next option is tried in
    the same transaction (the locks taken stay until it ends; they are shares
    on rows a writer waits a moment for). A race lost once the allocation is
    written, rare because the claim's check is as of now, and a broken lock
    cycle raise `PlacementRestart`.
    """
    try:
        try:
            members = [
                _lock_member(request=request, member=member, window=window, claim=True)
                for member in option.members
            ]
        except _LostRace as lost:  # nothing written: the next option, in this transaction
            _passed(option, lost)
            return None
        try:
            booked = [
                (_book_member(reservation=reservation, request=request, member=member, window=window), member)
                for member in members
            ]
        except _LostRace as lost:
            _passed(option, lost, after_writing=True)
            raise PlacementRestart(str(lost)) from lost
    except OperationalError as exc:
        if _lock_cycle(exc):
            raise PlacementRestart(str(exc)) from exc
        raise
    return booked, [], window


def _try_option_in_savepoint(
    *,
    reservation: Reservation,
    request: ReservationRequest,
    option: Option,
    window: Window,
    displaced: Window | None,
) -> _Booked | None:
    """All members or none: one savepoint around the whole option (a gang rolls back whole).

    `displaced` is the displace-mode window. It is taken only when a spot
    booking on the option's atoms stands in the plain `window` (and the spot
    reservations booked in it get their notice); an option that displaces
    nothing is booked for the plain window, whatever the plan expected.
    """
    try:
        with transaction.atomic():
            # A displacing option may move to a later window: it books exactly what it planned.
            members = [
                _lock_member(
                    request=request,
                    member=member,
                    window=window,
                    claim=displaced is None,
                )
                for member in option.members
            ]
            chosen = window
            cut: list[str] = []
            if displaced is not None:
                # Not `member.displaced`: the plan's flag is as of its snapshot, and a
                # spot already under notice ends before the displaced window, unflagged.
                in_the_way, spots = _spot_in_the_way(
                    device_ids=sorted(i for member in members for i in member.device_ids),
                    window=window,
                    displaced=displaced,
                )
                if in_the_way:
                    chosen = displaced
                    cut = [
                        spot_id
                        for spot_id in spots
                        if spot_notice(reservation_id=spot_id, ends_at=displaced.start, now=displaced.now)
                    ]
            taken = [
                (_book_member(reservation=reservation, request=request, member=member, window=chosen), member)
                for member in members
            ]
            return taken, cut, chosen
    except _LostRace as lost:
        # A `_Taken` wrote nothing: the claim saw the atoms taken and moved on, as a
        # queue consumer skips a locked job. Counted apart from lost races.
        _passed(option, lost)
        return None
    except OperationalError as exc:
        # Two placements locking or booking the same atoms in opposite orders:
        # PostgreSQL breaks the cycle by failing one statement; the savepoint
        # absorbs it and this placement moves on like any other lost race.
        if _lock_cycle(exc):
            _passed(option, exc)
            return None
        raise
