"""Loading a parsed fleet file: one transaction, set-based and in batches, idempotent.

Loading the same file twice leaves the same rows. Pools, offerings and quota
limits go through their owners' services; node reports through the same path
as `inventory/report`.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from core.services import tenants_upsert
from fleets.spec import BATCH_NODES, NodeSpec, PoolSpec, Progress, fleet_parse
from inventory.models import Node
from inventory.registration import NodeDeclaration, nodes_register, offering_ensure, pool_register
from ledger.quota import quota_limit_set
from reservations.layouts import node_reports_apply
from reservations.node_events import nodes_changing


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
        tenants_upsert(names=spec.tenants)
        pool_ids = _load_pools(spec.pools)
        node_ids = _load_nodes(spec.nodes, pool_ids, actor=actor, progress=progress)
    return {"pools": pool_ids, "nodes": node_ids}


def _load_pools(pools: list[PoolSpec]) -> dict[str, str]:
    pool_ids: dict[str, str] = {}
    for spec in pools:
        pool = pool_register(
            owner_id=spec.owner,
            name=spec.name,
            sharing=spec.sharing,
            slots_per_gpu=spec.slots_per_gpu,
            gpu_model=spec.gpu_model,
            notice_seconds=spec.notice_seconds,
            archived=spec.archived,
        )
        pool_ids[spec.key] = pool.pk
        for tenant, quota in spec.offers.items():
            offering_ensure(pool_id=pool.pk, tenant_id=tenant)
            for resource, limit in quota.items():
                quota_limit_set(pool_id=pool.pk, tenant_id=tenant, resource=resource, limit=limit)
    return pool_ids


def _load_nodes(
    nodes: list[NodeSpec], pool_ids: dict[str, str], *, actor: str, progress: Progress | None
) -> dict[str, str]:
    node_ids: dict[str, str] = {}
    done = 0
    for start in range(0, len(nodes), BATCH_NODES):
        batch = nodes[start : start + BATCH_NODES]
        # A reload that cordons, moves or disconnects a known node moves its
        # rollup counts in the same transaction, as an operator's action does;
        # new nodes are counted by the reports that bring their devices.
        existing = Node.objects.filter(hostname__in=[s.hostname for s in batch]).values_list("pk", flat=True)
        with nodes_changing(list(existing)):
            by_host = _load_batch(batch, pool_ids, actor=actor)
        for spec in batch:
            node_ids[spec.hostname] = by_host[spec.hostname].pk
        done += len(batch)
        if progress is not None:
            progress(done, len(nodes))
    return node_ids


def _load_batch(batch: list[NodeSpec], pool_ids: dict[str, str], *, actor: str) -> dict[str, Node]:
    by_host = nodes_register(
        nodes=[
            NodeDeclaration(
                hostname=spec.hostname,
                pool_id=pool_ids[spec.pool],
                fields=spec.fields,
                taints=spec.taints,
            )
            for spec in batch
        ],
        actor=actor,
    )
    node_reports_apply(
        items=[(by_host[s.hostname], s.report) for s in batch if s.report is not None],
        actor=actor,
        ratios={by_host[s.hostname].pk: s.ratios for s in batch},
        connect=False,
    )
    return by_host
