"""Operator actions on nodes and devices: cordon, taint, maintenance, connectivity and device health.

Each runs in one transaction and writes the node (or device) row, because that
row is what the placer locks `FOR SHARE` under the schedulability predicate
(guard 4): whichever of a placement and an operator action commits second sees
the first. None of them cancels existing bookings; they stop new placements.
Each real change writes an `AuditEvent`; repeating an action that is already in
effect changes nothing and writes nothing (the caller can compare the node it
passed with the one it gets back).

These are the inventory halves. Callers go through `reservations.nodes.changes`,
which runs each inside the same transaction as the rollup deltas it causes.
"""

from __future__ import annotations

import re
from datetime import datetime

from django.db import transaction
from django.db.models import Func, Q
from django.db.models.functions import Now

from core.errors import InvalidInput
from core.retry import deadlock_retried
from core.services import audit_record
from inventory.choices import Connectivity
from inventory.models import Device, Node, NodeResource, Taint, TaintEffect

# Kubernetes-style keys (`gpu.example.com/xid-79`), so operators can reuse their names.
TAINT_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,251}[A-Za-z0-9])?$")
TAINT_VALUE_MAX = 253


def _compute_now() -> Func:
    return Func(function="compute_now")


def _node_audit(node: Node, *, actor: str, action: str, reason: str, **data: object) -> None:
    audit_record(
        actor=actor,
        action=action,
        subject_type="node",
        subject_id=node.pk,
        reason=reason,
        data={"hostname": node.hostname, **data},
    )


def _reload(node: Node) -> Node:
    node.refresh_from_db()
    return node


@deadlock_retried
def node_cordon(*, node: Node, reason: str, actor: str) -> Node:
    """Stop new placements on the node; its atoms belong to the `maintenance` bucket."""
    if not reason.strip():
        raise InvalidInput.field("reason", "a cordon needs a reason")
    with transaction.atomic():
        # Guarded UPDATE: cordoning twice keeps the first reason, actor and time.
        changed = Node.objects.filter(pk=node.pk, cordoned=False).update(
            cordoned=True,
            cordon_reason=reason,
            cordoned_by=actor,
            cordoned_at=_compute_now(),
            updated_at=Now(),
        )
        if changed:
            _node_audit(node, actor=actor, action="node.cordon", reason=reason)
    return _reload(node)


@deadlock_retried
def node_uncordon(*, node: Node, actor: str, reason: str = "") -> Node:
    """Let the node take new placements again (if nothing else keeps it unschedulable)."""
    with transaction.atomic():
        changed = Node.objects.filter(pk=node.pk, cordoned=True).update(
            cordoned=False, cordon_reason="", cordoned_by="", cordoned_at=None, updated_at=Now()
        )
        if changed:
            _node_audit(node, actor=actor, action="node.uncordon", reason=reason)
    return _reload(node)


@deadlock_retried
def node_set_maintenance(*, node: Node, on: bool, reason: str, actor: str) -> Node:
    """Put the node in (or take it out of) maintenance.

    The reason is optional, as the contract has it (`{nodeId, on, reason?}`);
    the audit trail records who did it either way.
    """
    with transaction.atomic():
        changed = Node.objects.filter(pk=node.pk, maintenance=not on).update(
            maintenance=on, maintenance_reason=reason if on else "", updated_at=Now()
        )
        if changed:
            action = "node.maintenance.on" if on else "node.maintenance.off"
            _node_audit(node, actor=actor, action=action, reason=reason)
    return _reload(node)


@deadlock_retried
def node_set_connectivity(
    *, node: Node, connected: bool, actor: str, reason: str, heartbeat_before: datetime | None = None
) -> Node:
    """Mark the node `connected` or `disconnected` (liveness, or an operator); audited when it changes.

    With `heartbeat_before`, a disconnect happens only while the node's last
    report is older than it (or it never reported): the guarded UPDATE then
    loses to a report that committed first, so a live node is not flapped.
    """
    target = Connectivity.CONNECTED if connected else Connectivity.DISCONNECTED
    with transaction.atomic():
        guarded = Node.objects.filter(pk=node.pk).exclude(connectivity=target)
        if not connected and heartbeat_before is not None:
            guarded = guarded.filter(
                Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=heartbeat_before)
            )
        changed = guarded.update(connectivity=target, updated_at=Now())
        if changed:
            action = "node.connected" if connected else "node.disconnected"
            _node_audit(node, actor=actor, action=action, reason=reason)
    return _reload(node)


def _taints_changed(locked: Node, *, actor: str, action: str, reason: str, **data: object) -> None:
    """After a taint write under the node's lock: recount, then audit with the new count.

    The node's NoSchedule taints are counted onto the node row, because the
    schedulability predicate reads only that row.
    """
    count = Taint.objects.filter(node_id=locked.pk, effect=TaintEffect.NO_SCHEDULE).count()
    Node.objects.filter(pk=locked.pk).update(noschedule_taints=count, updated_at=Now())
    _node_audit(locked, actor=actor, action=action, reason=reason, **data, noScheduleTaints=count)


@deadlock_retried
def node_taint(*, node: Node, key: str, value: str, effect: str, reason: str, actor: str) -> Node:
    """Add or replace the taint `key`; a NoSchedule taint makes the node unschedulable (`unhealthy`)."""
    if not TAINT_KEY_RE.fullmatch(key):
        raise InvalidInput.field("key", "must be 1-253 letters, digits, '.', '_', '/' or '-'")
    if len(value) > TAINT_VALUE_MAX:
        raise InvalidInput.field("value", f"at most {TAINT_VALUE_MAX} characters")
    if effect not in TaintEffect.values:
        raise InvalidInput.field("effect", f"must be one of {', '.join(TaintEffect.values)}")
    with transaction.atomic():
        # Lock the node row first: concurrent taint writes on one node queue here,
        # so the recount below is exact, and the write conflicts with a placer
        # holding the row FOR SHARE (guard 4).
        locked = Node.objects.select_for_update().get(pk=node.pk)
        existing = Taint.objects.filter(node=locked, key=key).first()
        if existing is not None and (existing.value, existing.effect) == (value, effect):
            return _reload(node)
        if existing is None:
            Taint.objects.create(
                node=locked, key=key, value=value, effect=effect, reason=reason, created_by=actor
            )
        else:
            Taint.objects.filter(pk=existing.pk).update(
                value=value, effect=effect, reason=reason, created_by=actor
            )
        _taints_changed(
            locked,
            actor=actor,
            action="node.taint",
            reason=reason,
            key=key,
            value=value,
            effect=effect,
            previous=None if existing is None else {"value": existing.value, "effect": existing.effect},
        )
    return _reload(node)


@deadlock_retried
def node_untaint(*, node: Node, key: str, actor: str, reason: str = "") -> Node:
    """Remove the taint `key`; removing a taint that is not there changes nothing."""
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        existing = Taint.objects.filter(node=locked, key=key).first()
        if existing is None:
            return _reload(node)
        existing.delete()
        _taints_changed(
            locked,
            actor=actor,
            action="node.untaint",
            reason=reason,
            key=key,
            value=existing.value,
            effect=existing.effect,
        )
    return _reload(node)


@deadlock_retried
def device_set_health(*, device: Device, healthy: bool, reason: str, actor: str) -> Device:
    """Mark a device healthy or unhealthy; a partitioned GPU's MIG or slot atoms follow their parent.

    The atom rows change, which is what the placer locks `FOR SHARE` where
    healthy and bookable (guard 4). The operator's word is the last one: a hold
    the node put on the device (`Device.node_hold`) is dropped either way, so a
    quarantine of a held GPU is not lifted by the node's next report.
    """
    if not healthy and not reason.strip():
        raise InvalidInput.field("reason", "marking a device unhealthy needs a reason")
    with transaction.atomic():
        devices = Device.objects.filter(Q(pk=device.pk) | Q(parent_id=device.pk))
        # Both in one UPDATE: the CHECK `device_hold_is_unhealthy` holds at every row.
        changed = devices.filter(Q(healthy=not healthy) | ~Q(node_hold="")).update(
            healthy=healthy, node_hold="", updated_at=Now()
        )
        if changed:
            audit_record(
                actor=actor,
                action="device.healthy" if healthy else "device.unhealthy",
                subject_type="device",
                subject_id=device.uid,
                reason=reason,
                data={"nodeId": device.node_id, "devicesChanged": changed},
            )
    device.refresh_from_db()
    return device


def node_resource_save(*, resource: NodeResource, actor: str) -> NodeResource:
    """Save an operator's capacity and overcommit ratio for one scalar of a node, audited.

    `allocated` is not written here: it moves only through guard 3's guarded UPDATE.
    """
    with transaction.atomic():
        resource.save(update_fields=["allocatable", "ratio"])
        audit_record(
            actor=actor,
            action="node.resource",
            subject_type="node",
            subject_id=resource.node_id,
            data={
                "resource": resource.resource,
                "allocatable": resource.allocatable,
                "ratio": float(resource.ratio),
            },
        )
    return resource
