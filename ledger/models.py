"""Who may use a pool and how much: offerings and per-tenant quota usage (guard 5).

`quota_usage` was created by the `capacity` app and keeps its name; this app
owns it now, and only its modules write it. The pool rollups moved on to
`reservations`, beside the bookings they count.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from core.models import Tenant
from inventory.models import Pool


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
    the charge computes under this row's lock (`ledger.services.quota.quota_charge`).
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


class Offering(models.Model):
    """The pool is offered to another tenant; its limits are the tenant's `QuotaUsage` rows."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="offerings")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="offerings")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Created by `inventory`, which owned offerings until they joined their quotas here.
        db_table = "inventory_offering"
        constraints = [models.UniqueConstraint(fields=["pool", "tenant"], name="offering_unique_pool_tenant")]

    def __str__(self) -> str:
        return f"{self.pool} → {self.tenant_id}"
