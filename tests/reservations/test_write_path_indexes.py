"""The write path's tables keep no index twice: each row version writes an entry in every one."""

from __future__ import annotations

import pytest
from django.db import connection

# Written by every create and release (a booking row version per atom, the
# reservation's at create and at release, an allocation, an outbox row).
WRITE_PATH_TABLES = (
    "device_bookings",
    "reservations_reservation",
    "reservations_allocation",
    "reservations_delivery",
)

_INDEXES = """
SELECT i.indexrelid::regclass::text AS name, t.relname AS table_name, am.amname AS method,
       i.indisunique AS is_unique, i.indpred IS NOT NULL AS is_partial,
       (SELECT array_agg(k ORDER BY n) FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS u(k, n)
         WHERE n <= i.indnkeyatts) AS keys,
       (SELECT array_agg(o.opcname::text) FROM unnest(i.indclass::oid[]) AS c(oid)
          JOIN pg_opclass o ON o.oid = c.oid) AS opclasses
  FROM pg_index i
  JOIN pg_class t ON t.oid = i.indrelid
  JOIN pg_class ic ON ic.oid = i.indexrelid
  JOIN pg_am am ON am.oid = ic.relam
 WHERE t.relname = ANY(%s)
"""


def _indexes() -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(_INDEXES, [list(WRITE_PATH_TABLES)])
        columns = [col.name for col in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


@pytest.mark.django_db
def test_no_write_path_index_is_a_like_copy() -> None:
    # Django adds a `varchar_pattern_ops` copy of every indexed text column for `LIKE`,
    # which no query of the service runs.
    like = [
        ix["name"] for ix in _indexes() if {"varchar_pattern_ops", "text_pattern_ops"} & set(ix["opclasses"])
    ]
    assert like == []


@pytest.mark.django_db
def test_no_write_path_index_repeats_the_lead_of_another() -> None:
    indexes = _indexes()
    copies = []
    for plain in indexes:
        if plain["method"] != "btree" or plain["is_unique"] or plain["is_partial"] or 0 in plain["keys"]:
            continue
        width = len(plain["keys"])
        for other in indexes:
            covers = (
                other["name"] != plain["name"]
                and other["table_name"] == plain["table_name"]
                and other["method"] == "btree"
                and not other["is_partial"]
                and len(other["keys"]) >= width
                and other["keys"][:width] == plain["keys"]
            )
            if covers and (len(other["keys"]) > width or other["is_unique"] or other["name"] < plain["name"]):
                copies.append((plain["name"], other["name"]))
    assert copies == []


@pytest.mark.django_db
def test_the_check_finds_a_copy_where_there_is_one() -> None:
    # What the test above looks for: a foreign key's own index beside one that leads with it.
    with connection.cursor() as cursor:
        cursor.execute("CREATE INDEX test_copy_of_device ON device_bookings (device_id)")
        cursor.execute(
            "CREATE INDEX test_like_of_tenant ON reservations_reservation (tenant_id varchar_pattern_ops)"
        )
    with pytest.raises(AssertionError, match="test_copy_of_device"):
        test_no_write_path_index_repeats_the_lead_of_another()
    with pytest.raises(AssertionError, match="test_like_of_tenant"):
        test_no_write_path_index_is_a_like_copy()
