"""The pages outside the API: the landing page, the health check, the admin's index with the worker."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.response import TemplateResponse

from core.replica import replica_health, writes_health
from core.worker_status import JobStatus, WorkerStatus, worker_status


def landing(request: HttpRequest) -> HttpResponse:
    """What a newcomer opening the server's address sees: where the admin, the API and its docs are."""
    return render(request, "core/landing.html")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _job_json(job: JobStatus) -> dict[str, Any]:
    return {
        "lastOk": _iso(job.last_ok_at),
        "lastRun": _iso(job.last_finished_at),
        "running": job.running,
        "seconds": round(job.seconds, 3),
        "count": job.count,
        "lag": round(job.lag, 1) if job.lag is not None else None,
        "behind": job.behind,
        "lastError": job.error,
    }


def _worker_json(status: WorkerStatus) -> dict[str, Any]:
    return {
        "lastPass": _iso(status.last_pass_at),
        "passAge": round(status.pass_age, 1) if status.pass_age is not None else None,
        "holder": status.holder,
        "jobs": {job.name: _job_json(job) for job in status.jobs},
    }


def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the service can answer AND keeps its ledger true over time, else 503 with the reason.

    503 when the database does not reply, or when the worker is behind: no
    worker has ever run, its last pass is older than the max sleep plus
    `CAPACITY_WORKER_LAG_SECONDS`, or a job has failed (or run) for longer than
    that (the rules: `core.worker_status`). The answer carries each job's last
    success and lag. It reads no tenant data. With a replica configured it also
    says where the reads that may lag go now (`replica.readsFrom`) and why.
    `writes` says where the writes go (`to`: the server's address, the
    leader's in a cluster, with its `timeline`); a 503 when that server does
    not take writes (a standby: a failover is under way).
    """
    try:
        status = worker_status()
        writes = writes_health()
    except DatabaseError as error:
        return JsonResponse(
            {"status": "unavailable", "reason": f"database: {error.__class__.__name__}"}, status=503
        )
    worker = _worker_json(status)
    extra: dict[str, Any] = {"writes": writes}
    # With a replica configured: where the reads that may lag go now, and why (a replica that
    # is down or lags is not a 503: those reads are answered by the primary meanwhile).
    replica = replica_health()
    if replica is not None:
        extra["replica"] = replica
    if not writes["accepting"]:
        reason = f"database: {writes['to']} does not take writes (a standby)"
        body = {"status": "unavailable", "reason": reason, "worker": worker, **extra}
        return JsonResponse(body, status=503)
    if not status.healthy:
        return JsonResponse(
            {"status": "unavailable", "reason": status.reason, "worker": worker, **extra}, status=503
        )
    return JsonResponse({"status": "ok", "worker": worker, **extra})


def admin_index(request: HttpRequest) -> TemplateResponse:
    """The admin's index with the worker's last pass and each job's lag above the apps (red when behind)."""
    try:
        status: WorkerStatus | None = worker_status()
    except DatabaseError:
        status = None
    return admin.site.index(request, extra_context={"worker": status, "worker_checked": True})
