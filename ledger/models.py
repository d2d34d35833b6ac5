"""The guarded counters: per-pool capacity rollups and per-tenant quota usage.

Both tables were created by the `capacity` app and keep their names; this app
owns them now, and only its modules write them.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest

# The counts of a rollup row, in the contract's order; the API, the CLI and the
# admin all show these columns.
ROLLUP_COUNTS = (
    "total",
    "allocatable",
    "allocated",
    "reserved",
    "available",
    "provisioning",
    "unhealthy",
    "maintenance",
    "unreachable",
)


class PoolCapacityRollup(models.Model):
    """One row per pool and resource; the only thing capacity reads ever scan."""

    pool = models.ForeignKey("inventory.Pool", on_delete=models.CASCADE, related_name="rollups")
    resource = models.CharField(max_length=16)
    total = models.BigIntegerField(default=0)
    allocatable = models.BigIntegerField(default=0)
    allocated = models.BigIntegerField(default=0)
    reserved = models.BigIntegerField(default=0)
    provisioning = models.BigIntegerField(default=0)
    unhealthy = models.BigIntegerField(default=0)
    maintenance = models.BigIntegerField(default=0)
    unreachable = models.BigIntegerField(default=0)
    # Conservative on purpose: an atom booked now and later counts in both.
    available = models.GeneratedField(
        expression=Greatest(Value(0), F("allocatable") - F("allocated") - F("reserved")),
        output_field=models.BigIntegerField(),
        db_persist=True,
    )
    updated_at = models.DateTimeField(db_default=models.Func(function="compute_now"))
    rebuilt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pool_capacity_rollup"
        constraints = [
            models.UniqueConstraint(fields=["pool", "resource"], name="rollup_unique_pool_resource"),
            models.CheckConstraint(
                name="rollup_total_is_sum",
                condition=Q(
                    total=F("allocatable")
                    + F("provisioning")
                    + F("unhealthy")
                    + F("maintenance")
                    + F("unreachable")
                ),
            ),
        ]
        ordering = ["pool_id", "resource"]

    def __str__(self) -> str:
        return f"{self.pool_id} {self.resource}"


class QuotaMode(models.TextChoices):
    """What a quota limits: the sum of every live holding, or the peak of concurrent use over time.

    `counter` (the default) caps `used`, the sum of everything held, whenever
    it is held. `concurrent` caps the tenant's use at every instant: 16 GPUs
    today and 16 next week fit a limit of 16, because the windows never overlap.
    """

    COUNTER = "counter"
    CONCURRENT = "concurrent"


class QuotaUsage(models.Model):
    """A tenant's limit and use of one resource in one pool (guard 5).

    `used` is the sum of the live holdings in both modes (the charge adds, the
    give-back subtracts); only a `counter` row caps it. A `concurrent` row caps
    the peak of the holdings over each new reservation's window instead, which
    the charge computes under this row's lock (`ledger.quota.quota_charge`).
    """

    pool = models.ForeignKey("inventory.Pool", on_delete=models.CASCADE, related_name="quotas")
    tenant = models.ForeignKey("core.Tenant", on_delete=models.CASCADE, related_name="quotas")
    resource = models.CharField(max_length=16)
    used = models.BigIntegerField(default=0)
    max = models.BigIntegerField()
    # `db_default` too: the ledger's own INSERTs (`quota_limit_set`) name no mode.
    mode = models.CharField(
        max_length=16, choices=QuotaMode.choices, default=QuotaMode.COUNTER, db_default=QuotaMode.COUNTER
    )

    class Meta:
        db_table = "quota_usage"
        constraints = [
            models.UniqueConstraint(fields=["pool", "tenant", "resource"], name="quota_unique"),
            # The backstop of guard 5: the guarded UPDATE should never get here. A
            # concurrent row's `used` may pass `max` (16 today plus 16 next week).
            models.CheckConstraint(
                name="quota_used_in_range",
                condition=Q(used__gte=0) & (Q(mode=QuotaMode.CONCURRENT) | Q(used__lte=F("max"))),
            ),
            models.CheckConstraint(name="quota_mode_known", condition=Q(mode__in=QuotaMode.values)),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}@{self.pool_id} {self.resource} {self.used}/{self.max}"
