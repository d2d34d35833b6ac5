"""The database's instruction counter: the backend's work between two marks, counted apart and repeatably.

`bench.db_instructions` starts PostgreSQL under callgrind, dumping at every
`pg_backend_pid()`, and reads the dumps of the one backend that served the
marked requests. Here that backend runs known work between marks on an empty
cluster: the same work must read the same, twice the work about twice as
much, a dump no mark asked for must be refused, and a server this machine
cannot start under callgrind is left out, not guessed at.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bench.clock import Clock
from bench.database import Server
from bench.db_instructions import (
    backend_counts,
    cluster_init,
    database_instructions_measure,
    mark,
    server_under_callgrind,
)
from tests.support.valgrind import valgrind_or_skip

_WORK = "SELECT count(*) FROM generate_series(1, %s) AS s(i) WHERE i %% 7 = 3"


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """A folder right under the system's temporary one: the server's user cannot reach pytest's."""
    with tempfile.TemporaryDirectory(prefix="test-db-callgrind-") as tmp:
        yield Path(tmp)


def _counted(tmp_path: Path, *, stray: bool = False) -> dict[str, list[int]]:
    valgrind = valgrind_or_skip()
    data, dumps = tmp_path / "cluster" / "data", tmp_path / "dumps"
    cluster_init(data)
    dumps.mkdir()
    labels: list[str] = []
    with (
        server_under_callgrind(data, dumps=dumps, valgrind=valgrind) as server,
        psycopg.connect(server.conninfo("postgres"), autocommit=True) as conn,
        conn.cursor() as cursor,
    ):
        for _ in range(3):  # the catalog caches warmed, as the bench's warm-up pairs do
            cursor.execute(_WORK, [1000])
        pid = mark(cursor, labels, "small")
        cursor.execute(_WORK, [20_000])
        assert mark(cursor, labels, "large") == pid
        cursor.execute(_WORK, [40_000])
        mark(cursor, labels, "small")
        cursor.execute(_WORK, [20_000])
        if stray:
            cursor.execute("SELECT pg_backend_pid()")
        mark(cursor, labels, "end")
    return backend_counts(dumps, pid, labels)


def test_the_backends_work_between_marks_is_counted_apart_and_repeatably(server_dir: Path) -> None:
    counted = _counted(server_dir)
    (first, second), (large,) = counted["small"], counted["large"]
    assert first > 1_000_000  # twenty thousand rows are counted, not only the protocol around them
    # The same statement reads the same count (the marks' own few instructions aside) ...
    assert abs(first - second) < 0.02 * first
    # ... and twice the rows about twice as much.
    assert 1.7 * first < large < 2.2 * first


def test_a_dump_no_mark_asked_for_is_refused(server_dir: Path) -> None:
    with pytest.raises(RuntimeError, match="something else called pg_backend_pid"):
        _counted(server_dir, stray=True)


def test_a_server_it_cannot_start_is_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    # Only the embedded server's data can be copied and started with the binaries here.
    elsewhere = Server(host="127.0.0.1", port="5432", user="postgres", password="")
    assert database_instructions_measure(server=elsewhere, clock=Clock(), samples=1, warmup=0) is None
    assert "left out" in capsys.readouterr().out
