"""The stand-in daemon reads its record of a reservation's atoms by the atom, not by scanning it.

The record keeps every holder an atom ever had (a release cuts a row, it does
not delete it), so it grows with the fleet's history. A delivery compares the
reservation's atoms with what the node holds of them; read as a semi-join,
PostgreSQL scanned the whole record for it, a cost that grew with every
create (0.6 ms at 3,400 rows in the bench).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction

from core.clock import compute_now
from inventory.models import Device
from reservations.delivery.daemon import daemon_holdings
from reservations.delivery.sending import reservation_deliver
from reservations.services import reservation_create
from tests.support.factories import PoolFactory
from tests.support.placement import gpu_request
from tests.support.races import one_node

# A month of history, as the bench's fleet leaves it: many atoms, each held by many reservations.
HISTORY_ATOMS = 200
HOLDERS_PER_ATOM = 20
# A reservation of a few atoms, as a node's share of a larger one is.
GPUS = 4


def _rows_read() -> int:
    """The record's rows this transaction has read so far, by any scan."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
            " WHERE relname = 'fake_daemon_assignments'"
        )
        row = cursor.fetchone()
    return 0 if row is None else int(row[0])


@pytest.mark.django_db(transaction=True)
def test_a_delivery_reads_the_nodes_record_by_atom_whatever_its_history() -> None:
    pool = PoolFactory()
    node = one_node(pool, GPUS)
    uids = list(Device.objects.filter(node=node).values_list("uid", flat=True))
    now = compute_now()
    with connection.cursor() as cursor:
        # Past holders, ended long ago, of these atoms and of many others.
        cursor.execute(
            "INSERT INTO fake_daemon_assignments"
            " (node_id, device_uid, reservation_id, allocation_id, starts_at, ends_at)"
            " SELECT %(node)s,"
            "        CASE WHEN a < %(mine)s THEN (%(uids)s::varchar[])[a + 1] ELSE 'GPU-old-' || a END,"
            "        'rsv_old_' || a || '_' || h, 'alloc_old_' || a || '_' || h,"
            "        %(then)s - make_interval(hours => h + 1), %(then)s - make_interval(hours => h)"
            "   FROM generate_series(0, %(atoms)s - 1) a, generate_series(1, %(holders)s) h",
            {
                "node": node.id,
                "uids": uids,
                "mine": len(uids),
                "then": now - timedelta(days=1),
                "atoms": HISTORY_ATOMS,
                "holders": HOLDERS_PER_ATOM,
            },
        )
    reservation, created = reservation_create(request=gpu_request(pool, GPUS), actor="t")
    assert created
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # statistics that know the record's history and the bookings
    with transaction.atomic():
        before = _rows_read()
        # Delivered again (it is idempotent): the same comparison of its atoms with the record.
        assert reservation_deliver(reservation_id=reservation.id)
        read = _rows_read() - before
    # What the node holds of the reservation's atoms, each read once at most; none of the others.
    assert 0 < read <= GPUS * (HOLDERS_PER_ATOM + 1), f"{read} rows of the record read"
    for uid in uids:
        holders = [holder for holder, _, _ in daemon_holdings(device_uid=uid)]
        assert reservation.id in holders and len(holders) == HOLDERS_PER_ATOM + 1
