"""The worker end to end: the Procfile's processes started as `make run` starts them (honcho), on the test
database, watched over HTTP as a user would.

With nothing else running: a reservation that reaches its end gives back its quota within 5 s, a 30 s
lease is gone by 35 s, a future booking moves from `reserved` to `allocated` within 5 s of its start, a
cordon moves the pool's GPUs to `maintenance` without a rebuild, and Ctrl-C stops both processes. A
worker killed in the middle of a job and started again loses nothing and does nothing twice.

Real durations, not a moved clock: the processes keep their database sessions, and the promise is about
the clock they read. Only the test's own session moves its clock back while it makes a reservation, so
that one made a minute ago, with its end seconds away, is on the server when the watch begins. The
"within 5 s" checks compare against the database clock (`compute_now()`), and poll; they are the
service's stated deadlines, not measurements of this machine's speed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from django.db import connection, transaction

from core.clock import compute_now, set_clock_offset
from core.models import AuditEvent, WorkerJob
from core.services import token_issue
from core.worker_status import HEARTBEAT_ROW
from inventory.models import Node, Pool
from ledger.models import QuotaUsage
from reservations.models import Reservation
from reservations.request.types import ReservationRequest
from reservations.rollups.recount import rollup_rebuild
from reservations.selectors import reservation_payload
from reservations.services import reservation_create
from tests.support.factories import QuotaUsageFactory
from tests.support.paths import ROOT
from tests.support.placement import gpu_request
from tests.support.records import snapshot, snapshot_after_rebuild
from tests.worker.watch import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Only bounds that stop a broken run from hanging the suite.
START_SECONDS = 60.0
STOP_SECONDS = 30.0
# The service's promise: time-driven work is done within this long after its deadline.
DEADLINE_SECONDS = 5.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _process_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a process started against the test database, as the torture servers get it."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env |= {
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "DJANGO_SETTINGS_MODULE": "tests.support.torture.server_settings",
        "TORTURE_DB_NAME": str(connection.settings_dict["NAME"]),
        "DEBUG": "0",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    return env


def _descendants(pid: int) -> set[int]:
    """Every process under `pid` (honcho starts each of its processes in a process group of its own)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return "Z" not in (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


@dataclass
class Running:
    """`honcho start` of the Procfile: its process (the leader of its own process group), URL and log."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    # The processes honcho started (the shells, gunicorn and its worker, the worker), once both are up.
    children: set[int] = field(default_factory=set)

    def call(self, method: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
        response = requests.post(
            f"{self.url}/api/compute/{method}",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        return response.status_code, response.json()

    def healthz(self) -> tuple[int, Any]:
        response = requests.get(f"{self.url}/healthz", timeout=10)
        return response.status_code, response.json()

    def ctrl_c(self) -> int:
        """What Ctrl-C in `make run`'s terminal does: SIGINT to honcho and every process it started."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(STOP_SECONDS)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def procfile_running(tmp_path: Path) -> Iterator[Running]:
    """`make run`'s last step (honcho start, web + worker), against the test database; stopped after."""
    port = _free_port()
    empty_env = tmp_path / "empty.env"  # not the developer's .env: this database, these settings
    empty_env.write_text("")
    log = tmp_path / "honcho.log"
    honcho = str(Path(sys.executable).with_name("honcho"))
    env = _process_env(
        tmp_path,
        HOST="127.0.0.1",
        PORT=str(port),
        AGENTS_PORT=str(_free_port()),
        WEB_CONCURRENCY="1",
        WEB_THREADS="8",
    )
    process = subprocess.Popen(
        [honcho, "start", "--no-colour", "-e", str(empty_env)],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    running = Running(process=process, url=f"http://127.0.0.1:{port}", log=log)
    try:

        def up() -> bool:
            assert process.poll() is None, f"honcho exited:\n{running.output()[-3000:]}"
            try:
                running.healthz()
            except requests.RequestException:
                return False
            return WorkerJob.objects.filter(name=HEARTBEAT_ROW).exists()

        assert wait_for(up, seconds=START_SECONDS), (
            f"web or worker did not start:\n{running.output()[-3000:]}"
        )
        running.children = _descendants(process.pid)
        yield running
    finally:
        running.children |= _descendants(process.pid)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_SECONDS)
        for pid in running.children:
            if _alive(pid) and not wait_for(lambda pid=pid: not _alive(pid), seconds=STOP_SECONDS):
                os.kill(pid, signal.SIGKILL)


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def _db_time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=compute_now().tzinfo)


class Promises:
    """Conditions that must each come true by their own deadline on the database clock, polled together."""

    def __init__(self) -> None:
        self.checks: dict[str, tuple[datetime, Callable[[], bool]]] = {}
        self.met: dict[str, datetime] = {}

    def expect(self, name: str, by: datetime, condition: Callable[[], bool]) -> None:
        self.checks[name] = (by, condition)

    def watch(self) -> dict[str, datetime | None]:
        """Poll until every condition held or the clock passed every deadline; when each first held."""
        latest = max(by for by, _ in self.checks.values())
        while True:
            now = compute_now()
            for name, (_by, condition) in self.checks.items():
                if name not in self.met and condition():
                    self.met[name] = now
            if len(self.met) == len(self.checks) or now > latest + timedelta(seconds=1):
                return {name: self.met.get(name) for name in self.checks}
            time.sleep(0.2)

    def late(self) -> dict[str, str]:
        """The conditions that did not hold by their deadline, and when (if ever) they did."""
        out = {}
        for name, (by, _) in self.checks.items():
            met = self.met.get(name)
            if met is None or met > by:
                out[name] = f"due by {by.isoformat()}, held at {met.isoformat() if met else 'never'}"
        return out


def _gpu_row(running: Running, token: str, pool: Pool) -> dict[str, Any]:
    status, body = running.call("capacity/byPool", token, {"tenantId": pool.owner_id, "poolId": pool.pk})
    assert status == 200, body
    return next(row for row in body["rows"] if row["resource"] == "gpu")


def _acme_whole_quota(pool: Pool, key: str) -> dict[str, Any]:
    """A create of acme's whole quota (two GPUs) for the shortest duration there is."""
    devices = [{"class": "gpu", "count": 2}]
    return {"poolId": pool.pk, "devices": devices, "tenantId": "acme", "duration": 60, "idempotencyKey": key}


def _made_ago(seconds: float, request: ReservationRequest) -> dict[str, Any]:
    """A reservation made `seconds` ago (the test's clock moved back while the service makes it), so
    that its end or its lease falls due within seconds rather than a minute: the shortest duration
    there is, and the shortest lease, are both longer than this test needs to wait."""
    set_clock_offset(timedelta(seconds=-seconds))
    try:
        created = reservation_create(request=request, actor="e2e")
    finally:
        set_clock_offset(timedelta(0))
    # The contract's object, as the create's answer carries it.
    return reservation_payload(created.reservation, allocations=created.allocations)


def _create_what_falls_due(
    running: Running, acme: str, beta: str, pool: Pool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """acme's whole quota for a minute, made 52 s ago (a second create is refused), then beta's 30 s
    lease made 22 s ago and never renewed, and its booking that starts in 10 s: the reservation that
    ends, the lease, the later booking, each due about 8 s after the server has them."""
    ending = _made_ago(
        52, gpu_request(pool, 2, tenant_id="acme", duration_seconds=60, idempotency_key="ends")
    )
    status, refused = running.call("reservations/create", acme, _acme_whole_quota(pool, "more"))
    assert status == 409 and refused["error"]["code"] == "QUOTA_EXCEEDED", refused
    leased = _made_ago(22, gpu_request(pool, 1, tenant_id="beta", lease_seconds=30, idempotency_key="lease"))
    one = {"poolId": pool.pk, "devices": [{"class": "gpu", "count": 1}]}
    starts = _ms(compute_now()) + 10_000
    status, later = running.call(
        "reservations/create",
        beta,
        {**one, "tenantId": "beta", "start": starts, "duration": 60, "idempotencyKey": "later"},
    )
    assert status == 201, later
    return ending, leased, later


def test_with_only_the_procfile_running_ends_leases_and_starts_are_acted_on_within_5s(
    tmp_path: Path, owned_pool: Pool, gpu_node: Node
) -> None:
    QuotaUsageFactory.create(pool=owned_pool, tenant=owned_pool.owner, resource="gpu", max=2)
    rollup_rebuild(pool_id=owned_pool.pk)
    acme = token_issue(tenant_id="acme", role="member", name="e2e acme")[1]
    beta = token_issue(tenant_id="beta", role="member", name="e2e beta")[1]

    with procfile_running(tmp_path) as running:
        ending, leased, later = _create_what_falls_due(running, acme, beta, owned_pool)
        row = _gpu_row(running, acme, owned_pool)
        assert (row["allocated"], row["reserved"]) == (3, 1)

        def quota_used() -> int:
            return QuotaUsage.objects.get(pool=owned_pool, tenant_id="acme", resource="gpu").used

        def state(reservation_id: str, tenant: str, token: str) -> str:
            status, body = running.call(
                "reservations/get", token, {"tenantId": tenant, "reservationId": reservation_id}
            )
            assert status == 200, body
            return str(body["state"])

        slack = timedelta(seconds=DEADLINE_SECONDS)
        watch = Promises()
        watch.expect(
            "quota given back at the end", _db_time(ending["end"]) + slack, lambda: quota_used() == 0
        )
        watch.expect(
            "lease released",
            _db_time(leased["leaseExpiresAt"]) + slack,
            lambda: state(leased["id"], "beta", beta) == "released",
        )
        watch.expect(
            "future booking counted as allocated once started",
            _db_time(later["start"]) + slack,
            lambda: _gpu_row(running, acme, owned_pool)["reserved"] == 0,
        )
        watch.watch()
        assert watch.late() == {}, running.output()[-3000:]

        # What the user sees: the quota is back, the lease is gone, the later booking runs.
        status, again = running.call("reservations/create", acme, _acme_whole_quota(owned_pool, "more"))
        assert status == 201, again
        assert state(ending["id"], "acme", acme) == "ended"
        assert state(later["id"], "beta", beta) == "active"
        row = _gpu_row(running, acme, owned_pool)
        assert (row["allocated"], row["reserved"]) == (3, 0)  # `again`'s two GPUs and `later`'s one
        code, health = running.healthz()
        assert code == 200, health
    assert snapshot([owned_pool.pk]) == snapshot_after_rebuild(owned_pool)


def test_a_cordon_moves_the_pools_gpus_to_maintenance_without_a_rebuild(
    tmp_path: Path, owned_pool: Pool, gpu_node: Node
) -> None:
    rollup_rebuild(pool_id=owned_pool.pk)
    operator = token_issue(tenant_id=None, role="operator", name="e2e operator")[1]
    acme = token_issue(tenant_id="acme", role="member", name="e2e acme")[1]
    with procfile_running(tmp_path) as running:
        before = _gpu_row(running, acme, owned_pool)
        assert (before["allocatable"], before["maintenance"]) == (8, 0)
        status, body = running.call("nodes/cordon", operator, {"nodeId": gpu_node.pk, "reason": "xid 79"})
        assert status == 200, body
        after = _gpu_row(running, acme, owned_pool)
        assert (after["allocatable"], after["maintenance"]) == (0, 8)
        status, body = running.call("nodes/uncordon", operator, {"nodeId": gpu_node.pk})
        assert status == 200, body
        back = _gpu_row(running, acme, owned_pool)
        assert (back["allocatable"], back["maintenance"]) == (8, 0)


def test_ctrl_c_stops_the_web_server_and_the_worker(tmp_path: Path, gpu_node: Node) -> None:
    with procfile_running(tmp_path) as running:
        periodic = {"bookings-repair", "rollup-rebuild", "rate-windows-prune"}

        def periodic_ran() -> bool:
            code, health = running.healthz()
            return code == 200 and set(health["worker"]["jobs"]) >= periodic

        # The periodic jobs run at start (in their own lane, so maybe just after the
        # first pass of the deadline jobs); the others when something falls due.
        assert wait_for(periodic_ran, seconds=START_SECONDS), running.healthz()
        commands = {(Path("/proc") / str(pid) / "cmdline").read_bytes() for pid in running.children}
        assert any(b"gunicorn" in c for c in commands) and any(b"worker" in c for c in commands), commands
        running.ctrl_c()
        # honcho stopped both processes (and gunicorn its worker) before it exited.
        assert [pid for pid in running.children if _alive(pid)] == []
        out = running.output()
        assert "worker stopped after" in out, out[-3000:]
        with pytest.raises(requests.ConnectionError):
            running.healthz()


# --- a worker killed mid-job -----------------------------------------------------------------


def _worker_process(tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "worker"],
        cwd=ROOT,
        env=_process_env(tmp_path),
        stdout=(tmp_path / f"{name}.log").open("wb"),
        stderr=subprocess.STDOUT,
    )


def _blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        # Inside a transaction the statistics views are a snapshot taken once: take a fresh one.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def test_a_worker_killed_in_the_middle_of_a_job_loses_nothing_and_repeats_nothing(
    tmp_path: Path, owned_pool: Pool, gpu_node: Node
) -> None:
    QuotaUsageFactory.create(pool=owned_pool, tenant=owned_pool.owner, resource="gpu", max=8)
    ids = []
    for _ in range(4):
        created = reservation_create(
            request=gpu_request(owned_pool, 2, lease_seconds=30, tenant_id="acme"), actor="test"
        )
        ids.append(created.reservation.pk)
    rollup_rebuild(pool_id=owned_pool.pk)
    # Every lease is overdue.
    Reservation.objects.filter(pk__in=ids).update(lease_expires_at=compute_now() - timedelta(seconds=1))

    # Hold the tenant's quota row: the worker's first release stops inside its transaction, at the give-back.
    first = None
    try:
        with transaction.atomic():
            QuotaUsage.objects.select_for_update().get(pool=owned_pool, tenant_id="acme", resource="gpu")
            first = _worker_process(tmp_path, "first")
            assert wait_for(_blocked_on_a_lock, seconds=START_SECONDS), (tmp_path / "first.log").read_text()
            first.send_signal(signal.SIGKILL)  # mid-pass, mid-transaction
            first.wait(STOP_SECONDS)
    finally:
        if first is not None and first.poll() is None:
            first.kill()
            first.wait(STOP_SECONDS)
    # Its backend notices the client is gone once the lock is granted, and rolls back.
    assert wait_for(lambda: not _blocked_on_a_lock(), seconds=STOP_SECONDS)

    second = _worker_process(tmp_path, "second")
    try:
        assert wait_for(
            lambda: Reservation.objects.filter(pk__in=ids, state="released").count() == len(ids),
            seconds=START_SECONDS,
        ), (tmp_path / "second.log").read_text()
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(STOP_SECONDS)

    released = AuditEvent.objects.filter(action="reservation.release", subject_id__in=ids)
    assert sorted(released.values_list("subject_id", flat=True)) == sorted(ids)  # each exactly once
    assert QuotaUsage.objects.get(pool=owned_pool, tenant_id="acme", resource="gpu").used == 0
    assert snapshot([owned_pool.pk]) == snapshot_after_rebuild(owned_pool)


def test_an_at_risk_mark_clears_within_5s_of_the_uncordon_that_lifts_its_cause(
    tmp_path: Path, owned_pool: Pool, gpu_node: Node
) -> None:
    """A cordon right before uses the worker's turn; the uncordon still repairs at once, not 30 s later."""
    rollup_rebuild(pool_id=owned_pool.pk)
    operator = token_issue(tenant_id=None, role="operator", name="e2e operator")[1]
    acme = token_issue(tenant_id="acme", role="member", name="e2e acme")[1]
    with procfile_running(tmp_path) as running:
        body = {
            "tenantId": "acme",
            "poolId": owned_pool.pk,
            "devices": [{"class": "gpu", "count": 8}],
            "start": _ms(compute_now()) + 600_000,
            "duration": "1h",
            "idempotencyKey": "later",
        }
        status, later = running.call("reservations/create", acme, body)
        assert status == 201, later
        ref = {"tenantId": "acme", "reservationId": later["id"]}

        def at_risk() -> Any:
            status, got = running.call("reservations/get", acme, ref)
            assert status == 200, got
            return got["atRisk"]

        status, answer = running.call("nodes/cordon", operator, {"nodeId": gpu_node.pk, "reason": "xid 79"})
        assert status == 200, answer
        assert wait_for(lambda: at_risk() is not None, seconds=DEADLINE_SECONDS), running.output()[-3000:]
        status, answer = running.call("nodes/uncordon", operator, {"nodeId": gpu_node.pk})
        assert status == 200, answer
        watch = Promises()
        watch.expect(
            "at-risk mark cleared",
            compute_now() + timedelta(seconds=DEADLINE_SECONDS),
            lambda: at_risk() is None,
        )
        watch.watch()
        assert watch.late() == {}, running.output()[-3000:]
