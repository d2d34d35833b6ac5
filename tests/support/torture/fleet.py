"""A small fleet that the torture runs fight over: two pools, an offering with quota, scalars.

The guest's quota is a counter in the first pool and `concurrent` in the second
(a limit on its use at every instant: calendar creates of overlapping windows
fight for it). Small on purpose: 48 GPUs shared by 1,000 operations keeps every guard busy
(most creates race for the last atoms of some node), where a large fleet would
let the operations pass each other by.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from core.models import Tenant
from inventory.models import Device, Node, NodeResource, Pool
from ledger.models import QuotaMode
from reservations.rollups.recount import rollup_rebuild_all
from tests.support.factories import OfferingFactory, PoolFactory, QuotaUsageFactory, TenantFactory
from tests.support.torture.commitlog import commitlog_install, commitlog_uninstall


@dataclass
class Fleet:
    """Ids the operation mix picks from; plain strings so any thread or process can use them."""

    tenants: list[str]
    # (pool id, tenant allowed to book there)
    bookers: list[tuple[str, str]]
    pool_ids: list[str]
    node_ids: list[str]
    device_uids: list[str]
    quota: dict[tuple[str, str, str], int] = field(default_factory=dict)


def fleet_build(*, nodes_per_pool: tuple[int, ...] = (8, 4), gpus_per_node: int = 4, vcpu: int = 32) -> Fleet:
    """Create tenants, pools, nodes, GPUs and scalars, all schedulable and healthy; rebuild rollups."""
    owner = TenantFactory.create(id="torture-owner")
    guest = TenantFactory.create(id="torture-guest")
    pools: list[Pool] = []
    bookers: list[tuple[str, str]] = []
    quota: dict[tuple[str, str, str], int] = {}
    node_ids: list[str] = []
    uids: list[str] = []
    for index, count in enumerate(nodes_per_pool):
        pool = PoolFactory.create(owner=owner, name=f"torture-{index}", gpu_model="H100")
        pools.append(pool)
        bookers.append((pool.id, owner.id))
        # The guest books under a quota smaller than the pool, so guard 5 is attacked too:
        # a counter in the first pool, the peak over time in the others.
        OfferingFactory(pool=pool, tenant=guest)
        mode = QuotaMode.COUNTER if index == 0 else QuotaMode.CONCURRENT
        # A concurrent limit frees up as windows end, so it is set tighter to stay contested.
        gpu_max = max(4, count * gpus_per_node // (2 if mode == QuotaMode.COUNTER else 4))
        QuotaUsageFactory(pool=pool, tenant=guest, resource="gpu", max=gpu_max, mode=mode)
        QuotaUsageFactory(pool=pool, tenant=guest, resource="vcpu", max=vcpu * count // 2, mode=mode)
        quota[(pool.id, guest.id, "gpu")] = gpu_max
        bookers.append((pool.id, guest.id))
        for n in range(count):
            node = Node.objects.create(
                pool=pool, hostname=f"torture-{index}-{n:02d}", labels={"fabric": f"ib-{index}", "rack": "r1"}
            )
            node_ids.append(node.id)
            NodeResource.objects.create(node=node, resource="vcpu", allocatable=vcpu)
            for g in range(gpus_per_node):
                uid = f"GPU-torture-{index}-{n:02d}-{g}"
                Device.objects.create(
                    node=node,
                    uid=uid,
                    device_class="gpu",
                    attributes={
                        "gpuProduct": "NVIDIA H100 80GB HBM3",
                        "gpuModel": "H100",
                        "vramGiB": 80,
                        "numaNode": g // 2,
                    },
                )
                uids.append(uid)
    rollup_rebuild_all()
    assert Tenant.objects.filter(pk__in=[owner.id, guest.id]).count() == 2
    return Fleet(
        tenants=[owner.id, guest.id],
        bookers=bookers,
        pool_ids=[p.id for p in pools],
        node_ids=node_ids,
        device_uids=uids,
        quota=quota,
    )


def fleet_restore(fleet: Fleet) -> None:
    """Lift every cordon, taint, maintenance and quarantine (through `reservations.nodes.changes`, which
    moves the rollups with each change), so every node is schedulable and every atom counted again."""
    from inventory.models import Taint
    from operations.services import device_set_health, node_set_maintenance, node_uncordon, node_untaint

    for node in Node.objects.filter(pk__in=fleet.node_ids):
        node_uncordon(node=node, actor="torture-restore")
        node_set_maintenance(node=node, on=False, reason="", actor="torture-restore")
        for key in Taint.objects.filter(node=node).values_list("key", flat=True):
            node_untaint(node=node, key=key, actor="torture-restore")
    for device in Device.objects.filter(uid__in=fleet.device_uids, healthy=False):
        device_set_health(device=device, healthy=True, reason="", actor="torture-restore")


@contextmanager
def fleet_logged() -> Iterator[Fleet]:
    """The torture fleet, with the commit-order log installed while it is in use."""
    built = fleet_build()
    commitlog_install()
    try:
        yield built
    finally:
        commitlog_uninstall()
