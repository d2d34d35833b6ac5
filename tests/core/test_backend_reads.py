"""What the backend reads, and how: timestamps by psycopg's own loader, fetches without a failed look-up.

`core.postgres.timestamps` gives the connection psycopg's loader for
`timestamptz` where Django's zone is UTC: every value must come back as
Django's own loader gives it, errors included. `core.postgres.base`'s cursor
wrappers answer `fetchone`, `rowcount` and the rest as attributes, not
through `CursorWrapper.__getattr__`, and must still turn the driver's errors
into Django's.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.db import connection, connections
from django.db import utils as db_utils
from django.db.backends import utils as backend_utils
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.range import Range

from core.postgres.timestamps import TIMESTAMPTZ_OID, UtcTimestamptzLoader, timestamptz_loader_register

pytestmark = pytest.mark.django_db

_MOMENTS = st.datetimes(
    min_value=datetime.datetime(1, 1, 1, 0, 0),
    max_value=datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
    timezones=st.just(datetime.UTC),
)
# Text PostgreSQL reads as a timestamptz that no Python datetime holds.
_UNREADABLE = ["infinity", "-infinity", "0044-03-15 12:00 BC", "294276-12-31 23:59:59+00"]


def _read(sql: str, params: list[Any], *, djangos: bool) -> list[Any] | str:
    """The row `sql` reads through the service's connection, or its error, with Django's loader if asked."""
    with connection.cursor() as cursor:
        if djangos:
            register_tzloader(connection.timezone, cursor.cursor)
        try:
            cursor.execute(sql, params)
            return list(cursor.fetchone())
        except db_utils.DataError as error:
            return f"DataError: {error}"


def test_the_connection_reads_timestamps_with_psycopgs_loader() -> None:
    connection.ensure_connection()
    assert connection.timezone == datetime.UTC
    assert connection.connection.adapters.get_loader(TIMESTAMPTZ_OID, psycopg.pq.Format.TEXT) is (
        UtcTimestamptzLoader
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moment=_MOMENTS, later=_MOMENTS)
def test_a_timestamp_range_and_array_read_as_djangos_loader_reads_them(
    moment: datetime.datetime, later: datetime.datetime
) -> None:
    low, high = sorted([moment, later])
    sql = "SELECT %s::timestamptz, tstzrange(%s, %s), ARRAY[%s::timestamptz, NULL], %s::timestamp"
    params = [moment, low, high, later, moment.replace(tzinfo=None)]
    ours = _read(sql, params, djangos=False)
    assert ours == _read(sql, params, djangos=True)
    assert isinstance(ours, list)
    assert ours[0] == moment and ours[0].tzinfo is datetime.UTC
    assert ours[1] == (Range(low, high, "[)") if low < high else Range(empty=True))
    assert ours[2] == [later, None]


@pytest.mark.parametrize("text", _UNREADABLE)
def test_a_timestamp_no_datetime_holds_is_the_same_error(text: str) -> None:
    sql = "SELECT %s::timestamptz"
    ours = _read(sql, [text], djangos=False)
    assert isinstance(ours, str) and ours.startswith("DataError")
    assert ours == _read(sql, [text], djangos=True)


def test_a_zone_other_than_utc_keeps_djangos_loader() -> None:
    other = connections.create_connection("default")
    other.settings_dict = {**other.settings_dict, "TIME_ZONE": "Europe/Paris"}
    try:
        other.ensure_connection()
        loader = other.connection.adapters.get_loader(TIMESTAMPTZ_OID, psycopg.pq.Format.TEXT)
        assert loader is not UtcTimestamptzLoader
        assert loader.timezone == ZoneInfo("Europe/Paris")
        with other.cursor() as cursor:
            cursor.execute("SELECT '2026-07-01 10:00+00'::timestamptz")
            assert cursor.fetchone()[0].utcoffset() == datetime.timedelta(hours=2)
    finally:
        other.close()
    assert not timestamptz_loader_register(object(), zone=ZoneInfo("Europe/Paris"))


@pytest.fixture
def lookups_through_getattr(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names Django's `CursorWrapper.__getattr__` is asked for while the test runs."""
    asked: list[str] = []
    djangos = backend_utils.CursorWrapper.__getattr__

    def recording(self: Any, attr: str) -> Any:
        asked.append(attr)
        return djangos(self, attr)

    monkeypatch.setattr(backend_utils.CursorWrapper, "__getattr__", recording)
    yield asked


@pytest.mark.parametrize("debug", [False, True], ids=["cursor", "debug cursor"])
def test_a_statements_fetches_are_found_without_getattr(
    lookups_through_getattr: list[str], debug: bool
) -> None:
    sql = "SELECT n FROM generate_series(1, 5) AS n"
    capture = CaptureQueriesContext(connection) if debug else nullcontext()
    with capture as captured, connection.cursor() as cursor:
        cursor.execute(sql)
        assert cursor.description[0].name == "n"
        assert cursor.rowcount == 5
        assert cursor.fetchone() == (1,)
        assert cursor.fetchmany(2) == [(2,), (3,)]
        assert cursor.fetchall() == [(4,), (5,)]
    # Django's debug cursor renders the statement it logs with the driver's connection, asked by name.
    assert [name for name in lookups_through_getattr if name != "connection" or not debug] == []
    if debug:
        assert [query["sql"] for query in captured.captured_queries] == [sql]


@pytest.mark.parametrize("fetch", ["fetchone", "fetchall", "fetchmany"])
def test_a_failed_fetch_is_djangos_error(fetch: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL work_mem = '4MB'")  # no rows to fetch
        with pytest.raises(db_utils.ProgrammingError):
            getattr(cursor, fetch)()
