"""Pools, projects, nodes, taints, node resources and devices: what the fleet has.

Node and device rows are also the rows the placer locks `FOR SHARE` (guard 4):
every operator action that changes eligibility writes one of them, so a
placement and that action serialize on the same row.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from core import ids
from core.models import Tenant
from inventory.choices import (
    SLOT_SHARING,
    Connectivity,
    DeviceClass,
    ProvisionState,
    Role,
    ScalarResource,
    Sharing,
    TaintEffect,
    Trust,
)


class Project(models.Model):
    id = models.CharField(primary_key=True, max_length=56, default=ids.id_default(ids.PROJECT))
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="projects")
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="project_unique_name_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"


class Pool(models.Model):
    id = models.CharField(primary_key=True, max_length=57, default=ids.id_default(ids.POOL))
    owner = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="owned_pools")
    name = models.CharField(max_length=128)
    gpu_model = models.CharField(max_length=64, blank=True, help_text="Empty means 'other'.")
    sharing = models.CharField(max_length=16, choices=Sharing.choices, default=Sharing.EXCLUSIVE)
    slots_per_gpu = models.PositiveSmallIntegerField(null=True, blank=True)
    notice_seconds = models.PositiveIntegerField(default=30)
    archived_at = models.DateTimeField(null=True, blank=True)
    # Free labels an operator sets (`pools/update`), e.g. {"region": "eu-west"}.
    labels = models.JSONField(default=dict, blank=True, db_default={})
    # The node label a gang request of this pool groups by when it names none; "" means `fabric`.
    gang_topology_key = models.CharField(max_length=128, blank=True, default="", db_default="")
    # When the pool, its offerings or their quotas were last changed through the
    # management API: from then on fleet files leave them alone (`fleets.load`).
    api_changed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="pool_unique_name_per_owner"),
            models.CheckConstraint(
                name="pool_slots_match_sharing",
                condition=(
                    Q(sharing__in=list(SLOT_SHARING), slots_per_gpu__gte=1)
                    | (~Q(sharing__in=list(SLOT_SHARING)) & Q(slots_per_gpu__isnull=True))
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.owner_id}/{self.name}"

    @property
    def archived(self) -> bool:
        return self.archived_at is not None


class Node(models.Model):
    id = models.CharField(primary_key=True, max_length=57, default=ids.id_default(ids.NODE))
    hostname = models.CharField(max_length=253, unique=True)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="nodes")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.HOST)
    trust = models.CharField(max_length=20, choices=Trust.choices, default=Trust.PLATFORM)
    owner = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="owned_nodes",
        help_text="The owner of a tenant-owned node.",
    )
    provision_state = models.CharField(
        max_length=16, choices=ProvisionState.choices, default=ProvisionState.DEPLOYED
    )
    connectivity = models.CharField(
        max_length=16, choices=Connectivity.choices, default=Connectivity.CONNECTED
    )
    maintenance = models.BooleanField(default=False)
    maintenance_reason = models.TextField(blank=True)
    cordoned = models.BooleanField(default=False)
    cordon_reason = models.TextField(blank=True)
    cordoned_by = models.CharField(max_length=200, blank=True)
    cordoned_at = models.DateTimeField(null=True, blank=True)
    # Kept equal to the node's NoSchedule taints by the taint services, in the
    # same transaction. It lives on the node row so that the schedulability
    # predicate reads one row, and a taint write conflicts with the placer's
    # FOR SHARE lock on that row (guard 4); a predicate that looked into the
    # taint table would not be re-checked when the lock wait ends.
    noschedule_taints = models.PositiveSmallIntegerField(default=0)
    converged_specs = models.PositiveIntegerField(default=1)
    labels = models.JSONField(default=dict, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Registered by its own agent (`nodes/register`): its assignments go to the agent
    # (`nodes/assignments`); demo and fleet-file nodes keep the stand-in daemon.
    agent = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            # The placer and the rebuild walk a pool's nodes.
            models.Index(fields=["pool", "id"], name="node_pool"),
            # Liveness: the connected node that reported longest ago (nodes that
            # never reported, such as fleet-file nodes, are not watched).
            models.Index(
                fields=["last_heartbeat_at"],
                name="node_heartbeat_watch",
                condition=Q(connectivity="connected", last_heartbeat_at__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                name="node_owner_iff_tenant_owned",
                condition=(Q(trust="tenant-owned", owner__isnull=False) | ~Q(trust="tenant-owned")),
            ),
        ]
        # Staff without it can look at the fleet in the admin but not act on nodes.
        permissions = [("operate_nodes", "Can cordon, taint and put nodes in maintenance")]

    def __str__(self) -> str:
        return self.hostname


class Taint(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="taints")
    key = models.CharField(max_length=253)
    value = models.CharField(max_length=253, blank=True)
    effect = models.CharField(max_length=20, choices=TaintEffect.choices)
    reason = models.TextField(blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "key"], name="taint_unique_key")]

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"


class NodeResource(models.Model):
    """A scalar on a node. Claimed only by the guarded UPDATE of guard 3."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="resources")
    resource = models.CharField(max_length=16, choices=ScalarResource.choices)
    allocatable = models.BigIntegerField()
    ratio = models.DecimalField(max_digits=6, decimal_places=3, default=1)
    allocated = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "resource"], name="noderesource_unique"),
            models.CheckConstraint(name="noderesource_allocatable_gte_0", condition=Q(allocatable__gte=0)),
            models.CheckConstraint(name="noderesource_ratio_gt_0", condition=Q(ratio__gt=0)),
            # The backstop of guard 3: the guarded UPDATE should never get here.
            models.CheckConstraint(
                name="noderesource_allocated_in_range",
                condition=Q(allocated__gte=0)
                & Q(allocated__lte=models.Func(F("allocatable") * F("ratio"), function="floor")),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node_id} {self.resource} {self.allocated}/{self.allocatable}x{self.ratio}"


class Device(models.Model):
    """A piece of hardware. Bookable devices are atoms; only atoms are booked."""

    id = models.BigAutoField(primary_key=True)
    uid = models.CharField(max_length=255, unique=True)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="devices")
    device_class = models.CharField("class", max_length=16, choices=DeviceClass.choices)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    attributes = models.JSONField(default=dict, blank=True)
    healthy = models.BooleanField(default=True)
    # Why the node's agent holds the device back for a cause it will see go away (a process
    # using the GPU from outside every reservation); blank when no hold. A held device is
    # unhealthy, and the node's next report that does not hold it makes it healthy again.
    node_hold = models.TextField(blank=True, default="", db_default="")
    bookable = models.BooleanField(default=True)
    # Set when a report stops listing the device; the row stays while bookings refer to it.
    vanished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # A hold is a reason to be unhealthy: a healthy device holds nothing back.
            models.CheckConstraint(
                name="device_hold_is_unhealthy", condition=Q(node_hold="") | Q(healthy=False)
            ),
        ]
        indexes = [
            # The placer's candidate scan and the rebuild: a node's atoms of one class.
            models.Index(
                fields=["node", "device_class"],
                name="device_atoms",
                condition=Q(bookable=True),
            ),
        ]

    def __str__(self) -> str:
        return self.uid
