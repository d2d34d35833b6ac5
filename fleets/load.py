"""Loading a parsed fleet file: one transaction, set-based and in batches, idempotent.

Loading the same file twice leaves the same rows. Pools, offerings and quota
limits go through their owners' services; node reports through the same path
as `inventory/report`.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Func

from core.models import Tenant
from fleets.spec import BATCH_NODES, NodeSpec, PoolSpec, Progress, fleet_parse
from inventory.models import (
    Connectivity,
    Node,
    Offering,
    Pool,
    Taint,
    TaintEffect,
)
from inventory.services import NODE_REGISTRATION_FIELDS
from ledger.quota import quota_limit_set
from reservations.layouts import node_reports_apply


def fleet_load(
    *, data: Any, actor: str = "fleet-loader", progress: Progress | None = None
) -> dict[str, dict[str, str]]:
    """Load a fleet document (validated whole first) in one transaction; return the ids.

    Idempotent: tenants, pools, offerings, quotas, nodes, taints and devices are
    upserted by their natural keys. Quotas keep their `used`; a `max` below the
    current `used` is raised to `used` (the CHECK allows nothing less, and refusing
    would make a reload fail while workloads run). Records absent from the file are
    left alone: a fleet file adds and updates, it never deletes.
    """
    spec = fleet_parse(data=data)
    with transaction.atomic():
        Tenant.objects.bulk_create(
            [Tenant(id=tid, name=name) for tid, name in spec.tenants.items()],
            update_conflicts=True,
            unique_fields=["id"],
            update_fields=["name"],
        )
        pool_ids = _load_pools(spec.pools)
        node_ids = _load_nodes(spec.nodes, pool_ids, actor=actor, progress=progress)
    return {"pools": pool_ids, "nodes": node_ids}


def _load_pools(pools: list[PoolSpec]) -> dict[str, str]:
    pool_ids: dict[str, str] = {}
    for spec in pools:
        pool, _ = Pool.objects.get_or_create(
            owner_id=spec.owner,
            name=spec.name,
            defaults={"sharing": spec.sharing, "slots_per_gpu": spec.slots_per_gpu},
        )
        Pool.objects.filter(pk=pool.pk).update(
            gpu_model=spec.gpu_model,
            sharing=spec.sharing,
            slots_per_gpu=spec.slots_per_gpu,
            notice_seconds=spec.notice_seconds,
        )
        # Archive keeps the first archive time, so a reload does not move it.
        if spec.archived:
            Pool.objects.filter(pk=pool.pk, archived_at__isnull=True).update(archived_at=_now())
        else:
            Pool.objects.filter(pk=pool.pk).update(archived_at=None)
        pool_ids[spec.key] = pool.pk
        for tenant, quota in spec.offers.items():
            Offering.objects.get_or_create(pool_id=pool.pk, tenant_id=tenant)
            for resource, limit in quota.items():
                quota_limit_set(pool_id=pool.pk, tenant_id=tenant, resource=resource, limit=limit)
    return pool_ids


def _now() -> Func:
    return Func(function="compute_now")


def _load_nodes(
    nodes: list[NodeSpec], pool_ids: dict[str, str], *, actor: str, progress: Progress | None
) -> dict[str, str]:
    node_ids: dict[str, str] = {}
    done = 0
    for start in range(0, len(nodes), BATCH_NODES):
        batch = nodes[start : start + BATCH_NODES]
        rows = [
            Node(
                hostname=spec.hostname,
                pool_id=pool_ids[spec.pool],
                noschedule_taints=sum(1 for t in spec.taints if t["effect"] == TaintEffect.NO_SCHEDULE),
                cordon_reason="fleet file" if spec.fields["cordoned"] else "",
                cordoned_by="fleet-loader" if spec.fields["cordoned"] else "",
                maintenance_reason="fleet file" if spec.fields["maintenance"] else "",
                **spec.fields,
            )
            for spec in batch
        ]
        Node.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["hostname"],
            update_fields=["pool", *NODE_REGISTRATION_FIELDS, "noschedule_taints", "updated_at"],
        )
        by_host = {n.hostname: n for n in Node.objects.filter(hostname__in=[s.hostname for s in batch])}
        hosts = list(by_host)
        Node.objects.filter(hostname__in=hosts, cordoned=True, cordoned_at__isnull=True).update(
            cordoned_at=_now()
        )
        Node.objects.filter(hostname__in=hosts, cordoned=False, cordoned_at__isnull=False).update(
            cordoned_at=None
        )
        Node.objects.filter(hostname__in=hosts, connectivity=Connectivity.CONNECTED).update(
            last_heartbeat_at=_now()
        )
        _load_taints(batch, by_host)
        node_reports_apply(
            items=[(by_host[s.hostname], s.report) for s in batch if s.report is not None],
            actor=actor,
            ratios={by_host[s.hostname].pk: s.ratios for s in batch},
            connect=False,
        )
        for spec in batch:
            node_ids[spec.hostname] = by_host[spec.hostname].pk
        done += len(batch)
        if progress is not None:
            progress(done, len(nodes))
    return node_ids


def _load_taints(batch: list[NodeSpec], by_host: dict[str, Node]) -> None:
    """The file's taints become the node's taints: upserted by (node, key), others removed."""
    node_pks = [by_host[s.hostname].pk for s in batch]
    wanted = {(by_host[s.hostname].pk, t["key"]) for s in batch for t in s.taints}
    stale = [
        pk
        for pk, node_id, key in Taint.objects.filter(node_id__in=node_pks).values_list("pk", "node_id", "key")
        if (node_id, key) not in wanted
    ]
    if stale:
        Taint.objects.filter(pk__in=stale).delete()
    rows = [
        Taint(
            node_id=by_host[s.hostname].pk,
            key=t["key"],
            value=t["value"],
            effect=t["effect"],
            reason=t["reason"],
            created_by="fleet-loader",
        )
        for s in batch
        for t in s.taints
    ]
    if rows:
        Taint.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["node", "key"],
            update_fields=["value", "effect", "reason"],
        )
