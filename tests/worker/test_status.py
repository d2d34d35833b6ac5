"""What `/healthz` and the admin's index say about the worker: its last pass, and each job's lag, failures
and runs that take too long."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from core.clock import compute_now
from core.models import WorkerJob
from core.worker_status import HEARTBEAT_ROW, worker_job_finished, worker_job_started


def healthz(client: Client) -> tuple[int, dict[str, Any]]:
    response = client.get("/healthz")
    return response.status_code, response.json()


def age_rows(seconds: float, *names: str) -> None:
    """Make the rows look as if they were written `seconds` ago."""
    then = compute_now() - timedelta(seconds=seconds)
    WorkerJob.objects.filter(name__in=names).update(
        last_started_at=then, last_finished_at=then, last_ok_at=then
    )


@pytest.mark.django_db
def test_healthz_is_503_until_a_worker_has_run(client: Client) -> None:
    status, body = healthz(client)
    assert status == 503
    assert body["status"] == "unavailable" and body["reason"] == "worker has not run yet"


@pytest.mark.django_db
def test_healthz_is_200_with_each_job_when_the_worker_is_fresh_and_503_when_stale(
    client: Client, settings: Any
) -> None:
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 60
    settings.CAPACITY_WORKER_LAG_SECONDS = 30
    worker_job_finished(name=HEARTBEAT_ROW, holder="host:1", seconds=0.2, count=2)
    worker_job_finished(name="lease-expire", holder="host:1", seconds=0.01, count=3)

    status, body = healthz(client)
    assert status == 200, body
    assert body["status"] == "ok"
    assert body["worker"]["holder"] == "host:1" and body["worker"]["passAge"] < 60
    job = body["worker"]["jobs"]["lease-expire"]
    assert job["lastOk"] is not None and job["lag"] == 0 and job["behind"] is False and job["count"] == 3

    # A pass older than the max sleep plus the lag: no worker is running.
    age_rows(100, HEARTBEAT_ROW)
    status, body = healthz(client)
    assert status == 503
    assert body["reason"].startswith("worker: last pass 100 s ago")

    age_rows(70, HEARTBEAT_ROW)  # inside 60 + 30: fresh again
    assert healthz(client)[0] == 200

    # A job that has run for a while (a sweep of a large fleet) is not behind until the same limit.
    worker_job_started(name="rollup-rebuild", holder="host:1")
    WorkerJob.objects.filter(name="rollup-rebuild").update(
        last_started_at=compute_now() - timedelta(seconds=80)
    )
    status, body = healthz(client)
    assert status == 200 and body["worker"]["jobs"]["rollup-rebuild"]["running"] is True
    WorkerJob.objects.filter(name="rollup-rebuild").update(
        last_started_at=compute_now() - timedelta(seconds=95)
    )
    status, body = healthz(client)
    assert status == 503 and body["reason"] == "worker job rollup-rebuild: running for 95 s"


@pytest.mark.django_db
def test_healthz_is_503_when_a_job_has_been_failing_for_longer_than_the_lag(
    client: Client, settings: Any
) -> None:
    settings.CAPACITY_WORKER_LAG_SECONDS = 30
    worker_job_finished(name=HEARTBEAT_ROW, holder="host:1", seconds=0.1, count=1)
    worker_job_finished(name="bookings-advance", holder="host:1", seconds=0.1, count=5)
    age_rows(10, "bookings-advance")
    worker_job_finished(
        name="bookings-advance", holder="host:1", seconds=0.1, count=0, error="DeadlockDetected: x"
    )

    # Failing, but it succeeded 10 s ago: within the lag.
    status, body = healthz(client)
    assert status == 200, body
    assert body["worker"]["jobs"]["bookings-advance"]["lastError"] == "DeadlockDetected: x"

    WorkerJob.objects.filter(name="bookings-advance").update(last_ok_at=compute_now() - timedelta(seconds=45))
    status, body = healthz(client)
    assert status == 503
    assert body["reason"] == "worker job bookings-advance: failing for 45 s: DeadlockDetected: x"
    assert body["worker"]["jobs"]["bookings-advance"]["behind"] is True


def admin_index_from_the_landing_page(client: Client) -> str:
    """Open the landing page and follow its admin link, as an operator would."""
    landing = client.get("/").content.decode()
    link = re.search(r'<a href="([^"]+)">Operator admin</a>', landing)
    assert link, landing
    response = client.get(link.group(1))
    assert response.status_code == 200
    return str(response.content.decode())


@pytest.mark.django_db
def test_the_admin_index_shows_the_worker_and_each_jobs_lag_in_red_when_behind(admin_client: Client) -> None:
    worker_job_finished(name=HEARTBEAT_ROW, holder="host:7", seconds=0.1, count=1)
    worker_job_finished(name="lease-expire", holder="host:7", seconds=0.02, count=4)
    page = admin_index_from_the_landing_page(admin_client)
    panel = page[page.index('id="worker-status"') :]
    assert "on time" in panel and "host:7" in panel
    assert re.search(r'<tr class="worker-on-time">\s*<td>lease-expire</td>', panel)
    assert "Site administration" in page or "Fleet, capacity and reservations" in page  # the apps still there

    age_rows(1000, HEARTBEAT_ROW, "lease-expire")
    worker_job_finished(
        name="lease-expire", holder="host:7", seconds=0.02, count=0, error="OperationalError: gone"
    )
    page = admin_index_from_the_landing_page(admin_client)
    panel = page[page.index('id="worker-status"') :]
    assert 'class="worker-panel behind"' in page
    assert "Behind: worker: last pass 1000 s ago" in panel
    row = re.search(r'<tr class="worker-behind">\s*<td>lease-expire</td>(.*?)</tr>', panel, re.S)
    assert row and "1000 s" in row.group(1) and "OperationalError: gone" in row.group(1)


@pytest.mark.django_db
def test_the_admin_index_asks_for_a_login_first(client: Client) -> None:
    response = client.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
