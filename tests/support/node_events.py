"""Node events as the tests drive them over HTTP, and the counts `capacity/byPool` shows for them.

Operators act over HTTP (`nodes/*`, `devices/setHealth`), node agents report over HTTP
(`inventory/report`), liveness calls `node_set_connectivity`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework.test import APIClient

from inventory.models import Node, Pool
from reservations.nodes import changes as node_events
from tests.support.api import post

COUNTS = ("allocatable", "allocated", "reserved", "maintenance", "unhealthy", "unreachable")

# A change made to a node by whoever `client` is: an operator over HTTP, or liveness.
Change = Callable[[APIClient, Node], Any]


def by_pool(client: APIClient, pool: Pool) -> dict[str, dict[str, int]]:
    """`capacity/byPool` as {resource: {count: n}}, for the counts a node event moves."""
    answer = post(client, "capacity/byPool", {"tenantId": pool.owner_id, "poolId": pool.id})
    assert answer.status_code == 200, answer.json()
    return {row["resource"]: {name: row[name] for name in COUNTS} for row in answer.json()["rows"]}


def counts(**given: int) -> dict[str, int]:
    """A byPool row's node-event counts: those `given`, every other one 0."""
    return {name: given.get(name, 0) for name in COUNTS}


def api(method: str, **fields: Any) -> Change:
    """A change through `method` on the node, answered 200."""

    def run(client: APIClient, node: Node) -> Any:
        answer = post(client, method, {"nodeId": node.pk, **fields})
        assert answer.status_code == 200, answer.json()

    return run


def health(healthy: bool) -> Change:
    """The node's first GPU (by uid) marked healthy or not."""

    def run(client: APIClient, node: Node) -> Any:
        # The first GPU (by uid) carries the running reservation's booking or is free: either way it moves.
        device = node.devices.order_by("uid").first()
        assert device is not None
        body = {"deviceUid": device.uid, "healthy": healthy, "reason": "xid 79"}
        answer = post(client, "devices/setHealth", body)
        assert answer.status_code == 200, answer.json()

    return run


def connectivity(connected: bool) -> Change:
    """Liveness marking the node connected or not (the client is not used)."""

    def run(client: APIClient, node: Node) -> Any:
        node_events.node_set_connectivity(
            node=node, connected=connected, actor="liveness", reason="no report"
        )

    return run


def a_report(node: Node, *, gpus: int = 1, vcpu: int = 224, mig: list[str] | None = None) -> dict[str, Any]:
    """A report of `gpus` H100s (the first with the MIG instances `mig`, if given) and `vcpu` vCPUs."""
    reported = []
    for index in range(gpus):
        instances = [
            {"gi": gi, "ci": 0, "profile": profile, "memoryMiB": 40192}
            for gi, profile in enumerate(mig or [])
        ]
        reported.append(
            {
                "uuid": f"GPU-{node.hostname}-{index}",
                "product": "NVIDIA H100 80GB HBM3",
                "memoryMiB": 81559,
                "numaNode": 0,
                "mig": {"enabled": bool(mig) and index == 0, "instances": instances if index == 0 else []},
            }
        )
    return {"hostname": node.hostname, "resources": {"vcpu": vcpu, "memoryGiB": 1024}, "gpus": reported}


def report(client: APIClient, node: Node, **shape: Any) -> None:
    """The node agent `client` reports `a_report(node, **shape)`, answered 200."""
    answer = post(client, "inventory/report", {"nodeId": node.pk, "report": a_report(node, **shape)})
    assert answer.status_code == 200, answer.json()
