"""The one definition of "schedulable" and of the bucket a node lands in.

The rollups, the placer's `FOR SHARE` lock (guard 4) and the admin all use
these. The SQL reads only the node row (plus its pool's owner), which is what
lets the placer's lock re-check it when a concurrent cordon, taint or
maintenance write commits first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inventory.models import Node

SCHEDULABLE_PROVISION_STATES = ("adopted", "deployed")

EXCLUDED = "excluded"
PROVISIONING = "provisioning"
MAINTENANCE = "maintenance"
UNREACHABLE = "unreachable"
UNHEALTHY = "unhealthy"
SCHEDULABLE = "schedulable"
BUCKETS = (PROVISIONING, UNHEALTHY, MAINTENANCE, UNREACHABLE)


def schedulable_sql(n: str = "n", pool_owner: str = "p.owner_id") -> str:
    """The predicate over node alias `n`; `pool_owner` is an SQL expression for the pool's owner."""
    return (
        f"({n}.role = 'host' AND NOT {n}.maintenance AND NOT {n}.cordoned"
        f" AND {n}.provision_state IN ('adopted', 'deployed')"
        f" AND {n}.connectivity = 'connected' AND {n}.noschedule_taints = 0"
        f" AND {n}.converged_specs >= 1"
        f" AND ({n}.trust = 'platform'"
        f" OR ({n}.trust = 'tenant-owned' AND {n}.owner_id = {pool_owner})))"
    )


def bucket_sql(n: str = "n", pool_owner: str = "p.owner_id") -> str:
    """The node's bucket, first match wins; 'schedulable' when it is in none."""
    return (
        "CASE"
        f" WHEN {n}.role <> 'host' OR {n}.trust = 'tenant-controlled'"
        f" OR ({n}.trust = 'tenant-owned' AND {n}.owner_id IS DISTINCT FROM {pool_owner})"
        f" THEN '{EXCLUDED}'"
        f" WHEN {n}.provision_state NOT IN ('adopted', 'deployed') OR {n}.converged_specs < 1"
        f" THEN '{PROVISIONING}'"
        f" WHEN {n}.maintenance OR {n}.cordoned THEN '{MAINTENANCE}'"
        f" WHEN {n}.connectivity <> 'connected' THEN '{UNREACHABLE}'"
        f" WHEN {n}.noschedule_taints > 0 THEN '{UNHEALTHY}'"
        f" ELSE '{SCHEDULABLE}' END"
    )


@dataclass(frozen=True)
class Term:
    """One term of the predicate, for showing an operator which one fails."""

    name: str
    ok: bool
    detail: str


def predicate_terms(node: Node) -> list[Term]:
    """The predicate term by term, in Python, for the admin's node page."""
    pool_owner = node.pool.owner_id
    trust_ok = node.trust == "platform" or (node.trust == "tenant-owned" and node.owner_id == pool_owner)
    return [
        Term("role is host", node.role == "host", node.role),
        Term("not in maintenance", not node.maintenance, node.maintenance_reason),
        Term("not cordoned", not node.cordoned, node.cordon_reason),
        Term(
            "provisioned",
            node.provision_state in SCHEDULABLE_PROVISION_STATES,
            node.provision_state,
        ),
        Term("connected", node.connectivity == "connected", node.connectivity),
        Term("no NoSchedule taint", node.noschedule_taints == 0, f"{node.noschedule_taints} NoSchedule"),
        Term("a converged spec", node.converged_specs >= 1, f"{node.converged_specs} converged"),
        Term("trusted", trust_ok, node.trust),
    ]


def node_bucket(node: Node) -> str:
    """The same classification as `bucket_sql`, for one loaded node."""
    pool_owner = node.pool.owner_id
    if (
        node.role != "host"
        or node.trust == "tenant-controlled"
        or (node.trust == "tenant-owned" and node.owner_id != pool_owner)
    ):
        return EXCLUDED
    if node.provision_state not in SCHEDULABLE_PROVISION_STATES or node.converged_specs < 1:
        return PROVISIONING
    if node.maintenance or node.cordoned:
        return MAINTENANCE
    if node.connectivity != "connected":
        return UNREACHABLE
    if node.noschedule_taints > 0:
        return UNHEALTHY
    return SCHEDULABLE
