"""Loading a parsed fleet file: one transaction, set-based and in batches, idempotent.

Loading the same file twice leaves the same rows. Pools, offerings and quota
limits go through the same services as the management API (`inventory.services.pools`,
`ledger.services.offerings`); node reports through the same path as `inventory/report`.

A pool changed through the API (`pools/*`, `offerings/*`) belongs to the API
from then on: a file that names it still loads its nodes, but leaves the
pool's settings, its offerings and their quotas as the API left them, and
says so in its answer (`keptByApi`), so nothing is undone silently.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from core.services import tenants_upsert
from fleets.maintenance import windows_load
from fleets.spec import BATCH_NODES, NodeSpec, PoolSpec, Progress, fleet_parse
from inventory.models import Node, Pool
from inventory.services.pools import pool_create, pool_set_archived, pool_update
from inventory.services.registration import NodeDeclaration, nodes_register
from ledger.services.offerings import offering_declare
from reservations.nodes.changes import nodes_changing
from reservations.nodes.reports import node_reports_apply


def fleet_load(*, data: Any, actor: str = "fleet-loader", progress: Progress | None = None) -> dict[str, Any]:
    """Load a fleet document (validated whole first) in one transaction; return the ids.

    Idempotent: tenants, pools, offerings, quotas, nodes, taints and devices are
    upserted by their natural keys. Quotas keep their `used`; a `max` below the
    current `used` is raised to `used` (the CHECK allows nothing less, and refusing
    would make a reload fail while workloads run); a `concurrent` limit is stored
    as given. An offer's `quotaMode` applies to its quota rows; without one a
    row keeps its mode (`counter` when new). Records absent from the file are
    left alone: a fleet file adds and updates, it never deletes. Pools changed
    through the API are kept as they are and listed under `keptByApi`. Maintenance
    windows are scheduled once (`fleets.maintenance`) and answered under `maintenance`.
    """
    spec = fleet_parse(data=data)
    with transaction.atomic():
        tenants_upsert(names=spec.tenants)
        pool_ids, kept = _load_pools(spec.pools, actor=actor)
        node_ids = _load_nodes(spec.nodes, pool_ids, actor=actor, progress=progress)
        # After the nodes (a window names them); a refused window refuses the whole file.
        windows = windows_load(spec.maintenance, node_ids, actor=actor) if spec.maintenance else None
    answer: dict[str, Any] = {"pools": pool_ids, "nodes": node_ids}
    if windows is not None:
        answer["maintenance"] = windows
    if kept:
        answer["keptByApi"] = kept
    return answer


def _load_pools(pools: list[PoolSpec], *, actor: str) -> tuple[dict[str, str], list[str]]:
    """Create or update each pool and its offers; the ids, and the pools left as the API set them."""
    pool_ids: dict[str, str] = {}
    kept: list[str] = []
    for spec in pools:
        existing = Pool.objects.filter(owner_id=spec.owner, name=spec.name).first()
        if existing is not None and existing.api_changed_at is not None:
            pool_ids[spec.key] = existing.pk
            kept.append(spec.key)
            continue
        # The pool settings a file declares, the same for a new pool and a known one.
        settings: dict[str, Any] = {
            "gpu_model": spec.gpu_model,
            "sharing": spec.sharing,
            "slots_per_gpu": spec.slots_per_gpu,
            "notice_seconds": spec.notice_seconds,
        }
        if existing is None:
            pool = pool_create(
                owner_id=spec.owner,
                name=spec.name,
                actor=actor,
                archived=spec.archived,
                via_api=False,
                **settings,
            )
        else:
            pool_update(pool_id=existing.pk, changes=settings, actor=actor, via_api=False)
            pool = pool_set_archived(pool_id=existing.pk, archived=spec.archived, actor=actor, via_api=False)
        pool_ids[spec.key] = pool.pk
        for tenant, quota in spec.offers.items():
            offering_declare(
                pool=pool, tenant_id=tenant, quota=quota, mode=spec.quota_modes.get(tenant), actor=actor
            )
    return pool_ids, kept


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
