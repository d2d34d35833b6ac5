"""An ordered log of what committed, for checking guard 4 (linearizable eligibility) after a run.

Wall clocks cannot order transactions, and `track_commit_timestamp` needs a
server restart and may be off. Instead the test installs, for the length of a
run, triggers that write into `torture_events` inside the very transactions
they observe:

* a node UPDATE that changes `cordoned`, `maintenance` or `noschedule_taints`
  logs whether the node is now schedulable (THE predicate,
  `inventory.schedulability.schedulable_sql`);
* a device UPDATE that changes `healthy` or `bookable` logs whether it is an
  eligible atom now;
* every allocation booking INSERT logs its node and atom.

A deferred constraint trigger stamps each transaction that logged anything
with `nextval('torture_commit_seq')` as its last act before COMMIT. Two
transactions that touch the same node or device row serialize on its lock
(the placer holds it FOR SHARE, the writer needs it FOR UPDATE), so the second
cannot even reach its stamp before the first has committed: for every pair the
check cares about, stamp order is commit order. A transaction that rolled
back (a lost race's savepoint, a killed connection) leaves no stamp, and its
events are ignored.

The check: no booking may have committed while the last committed state of
its node (or of its atom) before it said "not eligible".
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from inventory.schedulability import schedulable_sql

TABLES = ("torture_events", "torture_commits")


_TABLES_SQL = """
CREATE SEQUENCE torture_commit_seq;
CREATE TABLE torture_events (
    id bigserial PRIMARY KEY,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    kind text NOT NULL,
    node_id text,
    device_id bigint,
    allocation_id text,
    eligible boolean
);
CREATE INDEX torture_events_node ON torture_events (kind, node_id);
CREATE INDEX torture_events_device ON torture_events (kind, device_id);
CREATE TABLE torture_commits (xid xid8 PRIMARY KEY, seq bigint NOT NULL);
"""


def _row_trigger_sql(
    name: str, function: str, *, after: str, body: str, when: str = "", deferred: bool = False
) -> str:
    """The plpgsql `function` (`body`, then RETURN NULL) and the row trigger `name` that runs it `after`.

    `when` is the trigger's condition, if any; a `deferred` trigger is a constraint trigger run at COMMIT.
    """
    create = "CONSTRAINT TRIGGER" if deferred else "TRIGGER"
    timing = f"AFTER {after}" + (" DEFERRABLE INITIALLY DEFERRED" if deferred else "")
    condition = f" WHEN ({when})" if when else ""
    return f"""
    CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {body}
        RETURN NULL;
    END $$;
    CREATE {create} {name} {timing}
        FOR EACH ROW{condition} EXECUTE FUNCTION {function}();
    """


def _install_sql() -> str:
    predicate = schedulable_sql("n", "p.owner_id")
    node_state = _row_trigger_sql(
        "torture_node_state",
        "torture_log_node",
        after="UPDATE ON inventory_node",
        body=f"""IF (OLD.cordoned, OLD.maintenance, OLD.noschedule_taints)
           IS DISTINCT FROM (NEW.cordoned, NEW.maintenance, NEW.noschedule_taints) THEN
            INSERT INTO torture_events (kind, node_id, eligible)
            SELECT 'node', n.id, {predicate}
              FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id WHERE n.id = NEW.id;
        END IF;""",
    )
    device_state = _row_trigger_sql(
        "torture_device_state",
        "torture_log_device",
        after="UPDATE ON inventory_device",
        body="""IF (OLD.healthy, OLD.bookable) IS DISTINCT FROM (NEW.healthy, NEW.bookable) THEN
            INSERT INTO torture_events (kind, node_id, device_id, eligible)
            VALUES ('device', NEW.node_id, NEW.id, NEW.healthy AND NEW.bookable);
        END IF;""",
    )
    booking = _row_trigger_sql(
        "torture_booking",
        "torture_log_booking",
        after="INSERT ON device_bookings",
        when="NEW.allocation_id IS NOT NULL",
        body="""INSERT INTO torture_events (kind, node_id, device_id, allocation_id)
        SELECT 'booking', d.node_id, d.id, NEW.allocation_id
          FROM inventory_device d WHERE d.id = NEW.device_id;""",
    )
    # Runs at COMMIT, after everything else the transaction did: the stamp is its commit order.
    stamp = _row_trigger_sql(
        "torture_stamp",
        "torture_stamp",
        after="INSERT ON torture_events",
        deferred=True,
        body="""INSERT INTO torture_commits (xid, seq)
        VALUES (pg_current_xact_id(), nextval('torture_commit_seq'))
        ON CONFLICT (xid) DO NOTHING;""",
    )
    # Whatever an interrupted run left is dropped first.
    return "".join([UNINSTALL_SQL, _TABLES_SQL, node_state, device_state, booking, stamp])


UNINSTALL_SQL = """
DROP TRIGGER IF EXISTS torture_node_state ON inventory_node;
DROP TRIGGER IF EXISTS torture_device_state ON inventory_device;
DROP TRIGGER IF EXISTS torture_booking ON device_bookings;
DROP TABLE IF EXISTS torture_events, torture_commits;
DROP SEQUENCE IF EXISTS torture_commit_seq;
DROP FUNCTION IF EXISTS torture_log_node(), torture_log_device(), torture_log_booking(), torture_stamp();
"""

_VIOLATIONS_SQL = """
WITH ev AS (
    SELECT e.*, c.seq FROM torture_events e JOIN torture_commits c ON c.xid = e.xid
), judged AS (
    SELECT b.node_id, b.device_id, b.allocation_id, b.seq,
        (SELECT s.eligible FROM ev s WHERE s.kind = 'node' AND s.node_id = b.node_id AND s.seq < b.seq
          ORDER BY s.seq DESC, s.id DESC LIMIT 1) AS node_ok,
        (SELECT s.eligible FROM ev s WHERE s.kind = 'device' AND s.device_id = b.device_id AND s.seq < b.seq
          ORDER BY s.seq DESC, s.id DESC LIMIT 1) AS device_ok
    FROM ev b WHERE b.kind = 'booking'
)
SELECT node_id, device_id, allocation_id, seq, node_ok, device_ok FROM judged
 WHERE node_ok IS FALSE OR device_ok IS FALSE ORDER BY seq
"""


@dataclass(frozen=True)
class LogSummary:
    bookings: int
    state_changes: int
    violations: list[str]


def commitlog_install() -> None:
    """Create the log, the triggers and the commit stamp (dropping any left by an interrupted run)."""
    with connection.cursor() as cursor:
        cursor.execute(_install_sql())


def commitlog_uninstall() -> None:
    """Remove everything `commitlog_install` created, so other tests see the schema as migrated."""
    with connection.cursor() as cursor:
        cursor.execute(UNINSTALL_SQL)


def commitlog_check() -> LogSummary:
    """Judge every committed booking against the committed node and atom states before it."""
    with connection.cursor() as cursor:
        cursor.execute(_VIOLATIONS_SQL)
        rows = cursor.fetchall()
        cursor.execute(
            "SELECT count(*) FILTER (WHERE e.kind = 'booking'), count(*) FILTER (WHERE e.kind <> 'booking')"
            " FROM torture_events e JOIN torture_commits c ON c.xid = e.xid"
        )
        bookings, changes = cursor.fetchone()
    violations = [
        f"booking of device {device} (allocation {allocation}, commit #{seq}) on node {node} committed while"
        f" {'the node was unschedulable' if node_ok is False else 'the atom was not eligible'}"
        for node, device, allocation, seq, node_ok, _device_ok in rows
    ]
    return LogSummary(bookings=bookings, state_changes=changes, violations=violations)
