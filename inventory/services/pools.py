"""Pools as operators manage them (`pools/*`) and fleet files declare them: one path for both.

Every change is one service here, audited with its actor in the same
transaction, and refused whole (nothing changed) when it would break a rule:
a name taken by the owner's other pool, a sharing mode that the pool's atoms
contradict, slots that do not fit the mode. A change made through the API
(`via_api=True`) stamps `api_changed_at`: fleet files leave such a pool, its
offerings and their quotas alone from then on (`fleets.load`).
"""

from __future__ import annotations

import re
from typing import Any

from django.db.models import Func, QuerySet

from core.errors import Conflict, InvalidInput, NotFound
from core.models import Tenant
from core.services import audit_record
from inventory.choices import SLOT_SHARING, DeviceClass, Sharing
from inventory.models import Device, Pool

POOL_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
# The GPU atom class each sharing mode books; a pool's GPU atoms must all be of it.
SHARING_CLASS = {
    Sharing.EXCLUSIVE: DeviceClass.GPU,
    Sharing.MIG: DeviceClass.GPU_MIG,
    Sharing.TIMESLICE: DeviceClass.GPU_SLOT,
    Sharing.MPS: DeviceClass.GPU_SLOT,
}
GPU_ATOM_CLASSES = (DeviceClass.GPU, DeviceClass.GPU_MIG, DeviceClass.GPU_SLOT)
# What `pool_update` may change, by the field names of `Pool`.
UPDATABLE = ("name", "gpu_model", "sharing", "slots_per_gpu", "notice_seconds", "labels", "gang_topology_key")


def _now() -> Func:
    return Func(function="compute_now")


def pool_find(*, pool_id: str, lock: bool = False) -> Pool:
    """The pool (locked `FOR UPDATE` when asked), or NOT_FOUND."""
    pools = Pool.objects.select_for_update() if lock else Pool.objects.all()
    pool = pools.filter(pk=pool_id).first()
    if pool is None:
        raise NotFound("pool not found")
    return pool


def _check_slots(sharing: str, slots_per_gpu: int | None) -> None:
    if sharing in SLOT_SHARING and slots_per_gpu is None:
        raise InvalidInput.field("slotsPerGpu", f"required for a {sharing} pool")
    if sharing not in SLOT_SHARING and slots_per_gpu is not None:
        raise InvalidInput.field("slotsPerGpu", "only for timeslice or mps pools")


def _contradicting_atoms(pool: Pool, sharing: str) -> int:
    """How many bookable GPU atoms of the pool are of another class than `sharing` books."""
    wanted = SHARING_CLASS[Sharing(sharing)]
    return (
        Device.objects.filter(node__pool=pool, bookable=True, device_class__in=GPU_ATOM_CLASSES)
        .exclude(device_class=wanted)
        .count()
    )


def pool_create(
    *,
    owner_id: str,
    name: str,
    actor: str,
    gpu_model: str = "",
    sharing: str = Sharing.EXCLUSIVE,
    slots_per_gpu: int | None = None,
    notice_seconds: int = 30,
    labels: dict[str, str] | None = None,
    gang_topology_key: str = "",
    archived: bool = False,
    via_api: bool = True,
) -> Pool:
    """Create a pool; CONFLICT when the owner already has one of that name."""
    if not Tenant.objects.filter(pk=owner_id).exists():
        raise InvalidInput.field("ownerTenantId", f"unknown tenant {owner_id}")
    _check_slots(sharing, slots_per_gpu)
    if Pool.objects.filter(owner_id=owner_id, name=name).exists():
        raise Conflict(f"{owner_id} already has a pool named {name}")
    pool = Pool.objects.create(
        owner_id=owner_id,
        name=name,
        gpu_model=gpu_model,
        sharing=sharing,
        slots_per_gpu=slots_per_gpu,
        notice_seconds=notice_seconds,
        labels=labels or {},
        gang_topology_key=gang_topology_key,
    )
    stamp: dict[str, Any] = {"api_changed_at": _now()} if via_api else {}
    if archived or stamp:
        Pool.objects.filter(pk=pool.pk).update(**stamp, **({"archived_at": _now()} if archived else {}))
        pool.refresh_from_db()
    pool_audit(
        pool.pk, "pool.create", actor=actor, via_api=via_api, owner=owner_id, name=name, sharing=sharing
    )
    return pool


def pool_update(*, pool_id: str, changes: dict[str, Any], actor: str, via_api: bool = True) -> Pool:
    """Change the named settings of a pool; only what differs is written and audited.

    Sharing may change only while no bookable GPU atom of the pool is of
    another class than the new mode books (CONFLICT otherwise): the atoms come
    from the nodes' reports, and a mode they contradict would make the pool
    unplaceable. Slots go with the mode (`slots_per_gpu` required for
    timeslice and mps, absent otherwise).
    """
    unknown = set(changes) - set(UPDATABLE)
    if unknown:
        raise ValueError(f"not a pool setting: {sorted(unknown)}")
    pool = pool_find(pool_id=pool_id, lock=True)
    before = {name: getattr(pool, name) for name in UPDATABLE}
    after = {**before, **changes}
    if "sharing" in changes and changes["sharing"] not in SLOT_SHARING and "slots_per_gpu" not in changes:
        after["slots_per_gpu"] = None
    differ = {name: after[name] for name in UPDATABLE if after[name] != before[name]}
    if not differ:
        return pool
    _check_slots(after["sharing"], after["slots_per_gpu"])
    if "name" in differ and Pool.objects.filter(owner_id=pool.owner_id, name=after["name"]).exists():
        raise Conflict(f"{pool.owner_id} already has a pool named {after['name']}")
    if "sharing" in differ:
        contradicting = _contradicting_atoms(pool, after["sharing"])
        if contradicting:
            raise Conflict(
                f"the pool's nodes report {contradicting} GPU atoms that a {after['sharing']} pool"
                f" cannot book; change their layout first"
            )
    stamp: dict[str, Any] = {"api_changed_at": _now()} if via_api else {}
    Pool.objects.filter(pk=pool.pk).update(**differ, **stamp)
    was = {name: before[name] for name in differ}
    pool_audit(pool.pk, "pool.update", actor=actor, via_api=via_api, before=was, after=differ)
    pool.refresh_from_db()
    return pool


def pool_set_archived(*, pool_id: str, archived: bool, actor: str, via_api: bool = True) -> Pool:
    """Archive (hidden from every tenant but its owner, no new reservation) or unarchive a pool.

    Reservations already made stay as they are: they run, and their tenants
    can still get, renew and release them. Archiving twice keeps the first time.
    """
    pool = pool_find(pool_id=pool_id, lock=True)
    if pool.archived == archived:
        return pool
    stamp: dict[str, Any] = {"api_changed_at": _now()} if via_api else {}
    Pool.objects.filter(pk=pool.pk).update(archived_at=_now() if archived else None, **stamp)
    pool_audit(pool.pk, "pool.archive" if archived else "pool.unarchive", actor=actor, via_api=via_api)
    pool.refresh_from_db()
    return pool


def pool_audit(pool_id: str, action: str, *, actor: str, via_api: bool, **data: Any) -> None:
    """Audit a change of the pool (or of an offering of it) with what made it: the API or a fleet file."""
    audit_record(
        actor=actor,
        action=action,
        subject_type="pool",
        subject_id=pool_id,
        data={**data, "via": "api" if via_api else "fleet"},
    )


def pool_mark_api_changed(*, pool_id: str) -> None:
    """Stamp the pool as changed through the API (an offering or quota of it was)."""
    Pool.objects.filter(pk=pool_id).update(api_changed_at=_now())


def pools_list(
    *, owner_id: str | None = None, archived: bool | None = None, after: str | None = None, limit: int = 100
) -> QuerySet[Pool]:
    """Pools in id order (creation order), after the cursor's id, at most `limit`."""
    pools = Pool.objects.order_by("id")
    if owner_id is not None:
        pools = pools.filter(owner_id=owner_id)
    if archived is not None:
        pools = pools.filter(archived_at__isnull=not archived)
    if after is not None:
        pools = pools.filter(pk__gt=after)
    return pools[:limit]


def pool_payload(pool: Pool) -> dict[str, Any]:
    """A pool as the management API answers it."""
    return {
        "poolId": pool.pk,
        "ownerTenantId": pool.owner_id,
        "name": pool.name,
        "gpuModel": pool.gpu_model,
        "sharing": pool.sharing,
        "slotsPerGpu": pool.slots_per_gpu,
        "noticeSeconds": pool.notice_seconds,
        "labels": pool.labels,
        "gangTopologyKey": pool.gang_topology_key,
        "archived": pool.archived,
        "archivedAt": _ms(pool.archived_at),
        "apiChangedAt": _ms(pool.api_changed_at),
    }


def _ms(value: Any) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)
