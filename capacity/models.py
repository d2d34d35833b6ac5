"""Capacity reads the rollups and the bookings below it; it owns only the hourly usage.

`HourlyUsage` is what was held per hour, tenant, pool, project, resource and
spot flag, written by the worker's `usage-close` job once an hour has closed
(`capacity.services`); `UsageHour` marks each closed hour. Both are history: a
trigger (migration 0003) refuses to update or delete a row, and a late change
is recorded as a correction row (a higher `revision`), never as an edit.
"""

from __future__ import annotations

from django.db import models


class UsageHour(models.Model):
    """One closed hour: its usage rows were written in the same transaction, once."""

    # The hour's start (UTC, on the hour). The primary key is the guard against closing it twice.
    hour = models.DateTimeField(primary_key=True)
    closed_at = models.DateTimeField(db_default=models.Func(function="compute_now"))
    rows = models.IntegerField(default=0)

    class Meta:
        ordering = ["-hour"]

    def __str__(self) -> str:
        return self.hour.isoformat()


class HourlyUsage(models.Model):
    """What a tenant held in one closed hour: atom-microseconds or unit-microseconds of one resource.

    Ids are plain columns, not foreign keys: usage is history and must outlive
    (and never block) a project or pool that goes away. `project_id` is `""`
    for reservations without a project, so the key has no NULL in it.
    """

    id = models.BigAutoField(primary_key=True)
    hour = models.DateTimeField()
    tenant_id = models.CharField(max_length=128)
    pool_id = models.CharField(max_length=57)
    project_id = models.CharField(max_length=56, blank=True, default="")
    # An atom class (`gpu`, `gpu.mig`, ...) or a host scalar (`vcpu`, `memoryGiB`, ...).
    resource = models.CharField(max_length=16)
    spot = models.BooleanField(default=False)
    # Quantity times microseconds held within the hour: exact, summed without rounding.
    usage_us = models.BigIntegerField()
    # 0: written when the hour closed; 1, 2, ...: corrections (deltas) for a late change.
    revision = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(db_default=models.Func(function="compute_now"))

    class Meta:
        verbose_name_plural = "hourly usage"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "hour", "pool_id", "project_id", "resource", "spot", "revision"],
                name="hourly_usage_unique",
            )
        ]
        # `usage/hourly` reads a tenant's hours in key order through the unique index;
        # the admin lists by hour.
        indexes = [models.Index(fields=["-hour"], name="hourly_usage_hour")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.hour:%Y-%m-%dT%H}Z {self.resource}"
