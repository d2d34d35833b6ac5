"""Node reports applied: what a node says it has becomes its devices, scalars and heartbeat.

A report is applied set-based (one statement per kind of change, for one node or
a batch of nodes), inside one transaction, after locking the node rows
`FOR UPDATE`: two reports for one node serialize, and a placement (which locks
the node `FOR SHARE`, guard 4) either sees the old devices or the new ones.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from core.errors import Conflict, InvalidInput, NotFound
from core.services import audit_record
from inventory.choices import SLOT_SHARING, Connectivity
from inventory.models import DeviceClass, Node, Pool
from inventory.reports import SCALARS, GpuReport, NodeReport
from inventory.services.device_health import node_reports_health_apply, reported_health

logger = logging.getLogger(__name__)


@dataclass
class _Want:
    """A device the report says exists, before it has a database id."""

    uid: str
    node_id: str
    device_class: str
    parent_uid: str | None
    attributes: dict[str, Any]
    bookable: bool


def _gpu_attributes(gpu: GpuReport) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gpuProduct": gpu.product,
        "gpuModel": gpu.model,
        # memoryMiB / 1024 rounded to nearest (81559 MiB → 80 GiB), half up.
        "vramGiB": math.floor(gpu.memory_mib / 1024 + 0.5),
    }
    if gpu.numa_node is not None:
        attrs["numaNode"] = gpu.numa_node
    if gpu.pci_bus_id is not None:
        attrs["pciBusId"] = gpu.pci_bus_id
    if gpu.nvlink_domain is not None:
        attrs["nvlinkDomain"] = gpu.nvlink_domain
    return attrs


def _desired_devices(*, node: Node, pool: Pool, report: NodeReport) -> list[_Want]:
    """Every device the report implies, parents before children (the upsert relies on it)."""
    wants = [_Want(node.id, node.id, DeviceClass.NODE, None, {}, True)]
    slotted = pool.sharing in SLOT_SHARING and (pool.slots_per_gpu or 0) > 0
    for gpu in report.gpus:
        attrs = _gpu_attributes(gpu)
        if gpu.mig_enabled:
            # MIG wins over the pool's sharing: it is what the hardware is doing.
            # A MIG instance has no vramGiB of the whole GPU (a 1g.10gb atom must not
            # match `vramGiB >= 80`); its own size is memoryGiB.
            wants.append(_Want(gpu.uuid, node.id, DeviceClass.GPU, None, attrs, False))
            child_base = {k: v for k, v in attrs.items() if k != "vramGiB"}
            for inst in gpu.mig_instances:
                wants.append(
                    _Want(
                        f"{gpu.uuid}/gi{inst.gi}/ci{inst.ci}",
                        node.id,
                        DeviceClass.GPU_MIG,
                        gpu.uuid,
                        {
                            **child_base,
                            "migProfile": inst.profile,
                            "memoryGiB": math.floor(inst.memory_mib / 1024 + 0.5),
                        },
                        True,
                    )
                )
        elif slotted:
            wants.append(_Want(gpu.uuid, node.id, DeviceClass.GPU, None, attrs, False))
            for k in range(pool.slots_per_gpu or 0):
                wants.append(
                    _Want(
                        f"{gpu.uuid}/s{k}",
                        node.id,
                        DeviceClass.GPU_SLOT,
                        gpu.uuid,
                        {**attrs, "slotIndex": k},
                        True,
                    )
                )
        else:
            wants.append(_Want(gpu.uuid, node.id, DeviceClass.GPU, None, attrs, True))
    for nic in report.nics:
        for vf in nic.vfs:
            vf_attrs: dict[str, Any] = {"pciBusId": vf}
            if nic.link_gbps is not None:
                vf_attrs["linkGbps"] = nic.link_gbps
            if nic.numa_node is not None:
                vf_attrs["numaNode"] = nic.numa_node
            wants.append(_Want(f"{node.hostname}/{vf}", node.id, DeviceClass.NIC_VF, None, vf_attrs, True))
    for disk in report.disks:
        disk_attrs: dict[str, Any] = {"sizeGiB": disk.size_gib}
        if disk.media is not None:
            disk_attrs["media"] = disk.media
        wants.append(_Want(f"{node.hostname}/{disk.id}", node.id, DeviceClass.DISK, None, disk_attrs, True))
    return wants


# The rows travel as one JSON document rather than parallel arrays: PostgreSQL parses
# it in C, where adapting 100,000 strings into text arrays costs seconds in Python.
_UPSERT_SQL = """
INSERT INTO inventory_device (uid, node_id, device_class, parent_id, attributes, healthy, bookable,
    vanished_at, created_at, updated_at)
SELECT t.uid, t.node_id, t.cls, t.parent_id, t.attrs, true, t.bookable, NULL, now(), now()
  FROM json_to_recordset(%s::json)
       AS t(uid text, node_id text, cls text, parent_id bigint, attrs jsonb, bookable boolean)
ON CONFLICT (uid) DO UPDATE
   SET node_id = EXCLUDED.node_id, device_class = EXCLUDED.device_class, parent_id = EXCLUDED.parent_id,
       attributes = EXCLUDED.attributes, bookable = EXCLUDED.bookable,
       -- A device that comes back is restored; a present device keeps its health
       -- (an operator's quarantine is not undone by the next heartbeat).
       healthy = CASE WHEN inventory_device.vanished_at IS NOT NULL THEN true
                      ELSE inventory_device.healthy END,
       vanished_at = NULL, updated_at = now()
RETURNING id, uid
"""


def _upsert(rows: Sequence[tuple[_Want, int | None]]) -> dict[str, int]:
    if not rows:
        return {}
    document = json.dumps(
        [
            {
                "uid": w.uid,
                "node_id": w.node_id,
                "cls": str(w.device_class),
                "parent_id": parent_id,
                "attrs": w.attributes,
                "bookable": w.bookable,
            }
            for w, parent_id in rows
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT_SQL, [document])
        return {uid: pk for pk, uid in cursor.fetchall()}


def _fetch_existing(node_ids: list[str]) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT id, uid, node_id, device_class, parent_id, attributes, bookable, vanished_at
              FROM inventory_device WHERE node_id = ANY(%s)
            """,
            [node_ids],
        )
        cols = [c.name for c in cursor.description or ()]
        rows = [dict(zip(cols, row, strict=True)) for row in cursor.fetchall()]
    for row in rows:
        if isinstance(row["attributes"], str):
            row["attributes"] = json.loads(row["attributes"])
    return rows


@dataclass(frozen=True)
class LayoutChange:
    """A GPU whose MIG or slot layout a report changes: its atoms before and after."""

    gpu_uid: str
    node_id: str
    # The GPU itself and the children it had; none of them may carry a live or future booking.
    old_atom_ids: list[int]
    # The children it has now, booked for the change window with the old ones.
    new_atom_ids: list[int]


@dataclass(frozen=True)
class ReportsApplied:
    """What applying reports did that a layer above must act on in the same transaction."""

    layout_changes: list[LayoutChange]


def layout_window_seconds() -> float:
    """How long a layout change books the GPU's atoms (`CAPACITY_LAYOUT_CHANGE_SECONDS`)."""
    # A zero window would make an empty range, which the bookings' CHECK refuses.
    return max(1.0, float(settings.CAPACITY_LAYOUT_CHANGE_SECONDS))


def inventory_apply_reports(
    *,
    items: Iterable[tuple[Node, NodeReport]],
    actor: str,
    ratios: dict[str, dict[str, float]] | None = None,
    connect: bool = True,
) -> ReportsApplied:
    """Write parsed reports for several nodes at once: devices, scalars, heartbeat.

    Guard 2 is the caller's half: the returned layout changes must be booked
    (`reservations.nodes.reports.node_reports_apply` does both in one transaction).

    Runs in the caller's transaction (opening one if there is none). `ratios` maps a
    node id to overcommit ratios per scalar (the fleet loader's); without it each
    scalar keeps its ratio. With `connect`, each node is marked `connected` with a
    heartbeat at `compute_now()` (a report is proof of life, and a node that was
    `disconnected` is audited as `node.connected`); the fleet loader sets
    connectivity itself, and its reports lift no node's hold on a GPU
    (`inventory.services.device_health`). Raises `InvalidInput` or `Conflict` with
    nothing applied.

    The rollups are the caller's too: `reservations.nodes.reports.node_reports_apply`
    runs this inside `reservations.nodes.changes.nodes_changing`.
    """
    items = list(items)
    if not items:
        return ReportsApplied(layout_changes=[])
    with transaction.atomic():
        ids = sorted({node.pk for node, _ in items})
        locked = _nodes_lock(ids=ids, items=items)
        wants = _wanted_devices(items=items, locked=locked)
        existing = _fetch_existing(ids)
        by_uid = {row["uid"]: row for row in existing}
        _refuse_foreign_uids([w.uid for w in wants if w.uid not in by_uid])

        changed_gpus, old_atoms = _layout_changes(wants=wants, existing=existing, by_uid=by_uid)
        ids_by_uid = _devices_upsert(wants=wants, existing=existing, by_uid=by_uid)
        gone = _devices_vanish(existing=existing, want_uids={w.uid for w in wants})
        layout_changes = _layout_changes_record(
            changed_gpus=changed_gpus, old_atoms=old_atoms, ids_by_uid=ids_by_uid, wants=wants, actor=actor
        )
        parents: dict[str, list[str]] = {}
        for want in wants:
            if want.parent_uid is not None:
                parents.setdefault(want.parent_uid, []).append(want.uid)
        # After the upsert and the vanishing. Only the node's own report lifts a hold (the
        # fleet loader's file, `connect=False`, is the operator's word on the hardware, not
        # the node's on what runs on it).
        node_reports_health_apply(
            node_ids=ids if connect else [],
            health=reported_health((r for _, r in items), parents),
            actor=actor,
        )
        _upsert_resources(items=items, ratios=ratios or {})
        if connect:
            _nodes_connect(ids=ids, locked=locked, actor=actor)
        logger.debug("applied %d reports for %s (%d devices vanished)", len(items), actor, gone)
        return ReportsApplied(layout_changes=layout_changes)


def _nodes_lock(*, ids: list[str], items: list[tuple[Node, NodeReport]]) -> dict[str, Node]:
    """The node rows locked `FOR UPDATE` with their pools; NOT_FOUND for a missing node.

    In id order so two batches cannot deadlock: two reports for one node
    serialize, and the placer's FOR SHARE on the node (guard 4) waits for the
    new devices rather than placing on the old ones. A report for another
    hostname than the node's is INVALID_INPUT.
    """
    locked = {
        n.pk: n
        for n in Node.objects.select_for_update(of=("self",))
        .select_related("pool")
        .filter(pk__in=ids)
        .order_by("pk")
    }
    missing = [pk for pk in ids if pk not in locked]
    if missing:
        raise NotFound(f"node {missing[0]} does not exist")
    bad = [
        {"field": "hostname", "message": f"report is for {report.hostname}, not {node.hostname}"}
        for node, report in items
        if node.pk in locked and locked[node.pk].hostname != report.hostname
    ]
    if bad:
        raise InvalidInput(bad[0]["message"], bad)
    return locked


def _wanted_devices(*, items: list[tuple[Node, NodeReport]], locked: dict[str, Node]) -> list[_Want]:
    """Every device the batch's reports imply; a uid two nodes report is INVALID_INPUT."""
    wants: list[_Want] = []
    for node, report in items:
        current = locked[node.pk]
        wants.extend(_desired_devices(node=current, pool=current.pool, report=report))
    counts = Counter(w.uid for w in wants)
    if len(counts) != len(wants):
        dupes = sorted(uid for uid, n in counts.items() if n > 1)
        raise InvalidInput(
            f"two nodes in one batch report the same device {dupes[0]}",
            [{"field": "uid", "message": f"{uid} is reported twice"} for uid in dupes],
        )
    return wants


def _devices_upsert(
    *, wants: list[_Want], existing: list[dict[str, Any]], by_uid: dict[str, dict[str, Any]]
) -> dict[str, int]:
    """Write what is new, changed or coming back, parents first so children can name them; every id by uid."""
    ids_by_uid = {row["uid"]: row["id"] for row in existing}

    def dirty(w: _Want, parent_id: int | None) -> bool:
        row = by_uid.get(w.uid)
        return (
            row is None
            or row["vanished_at"] is not None
            or row["node_id"] != w.node_id
            or row["device_class"] != w.device_class
            or row["parent_id"] != parent_id
            or row["bookable"] != w.bookable
            or row["attributes"] != w.attributes
        )

    tops = [(w, None) for w in wants if w.parent_uid is None]
    ids_by_uid.update(_upsert([(w, p) for w, p in tops if dirty(w, p)]))
    children = [(w, ids_by_uid[w.parent_uid]) for w in wants if w.parent_uid is not None]
    ids_by_uid.update(_upsert([(w, p) for w, p in children if dirty(w, p)]))
    return ids_by_uid


def _devices_vanish(*, existing: list[dict[str, Any]], want_uids: set[str]) -> int:
    """Devices no longer reported: unbookable and unhealthy, never deleted (bookings refer to them)."""
    gone = [row["id"] for row in existing if row["uid"] not in want_uids and row["vanished_at"] is None]
    if gone:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE inventory_device
                   SET bookable = false, healthy = false, vanished_at = compute_now(), updated_at = now(),
                       -- Gone, not held: a device that comes back is restored healthy, as any other.
                       node_hold = ''
                 WHERE id = ANY(%s)
                """,
                [gone],
            )
    return len(gone)


def _layout_changes_record(
    *,
    changed_gpus: dict[str, str],
    old_atoms: dict[int, str],
    ids_by_uid: dict[str, int],
    wants: list[_Want],
    actor: str,
) -> list[LayoutChange]:
    """Each changed GPU's atoms before and after (by device id), each audited as `device.layout-change`."""
    layout_changes = [
        LayoutChange(
            gpu_uid=gpu_uid,
            node_id=node_id,
            old_atom_ids=sorted(device_id for device_id, gpu in old_atoms.items() if gpu == gpu_uid),
            new_atom_ids=sorted(ids_by_uid[w.uid] for w in wants if w.parent_uid == gpu_uid),
        )
        for gpu_uid, node_id in sorted(changed_gpus.items())
    ]
    for change in layout_changes:
        audit_record(
            actor=actor,
            action="device.layout-change",
            subject_type="node",
            subject_id=change.node_id,
            data={"gpu": change.gpu_uid, "windowSeconds": layout_window_seconds()},
        )
    return layout_changes


def _nodes_connect(*, ids: list[str], locked: dict[str, Node], actor: str) -> None:
    """A report is proof of life: `connected`, a heartbeat now; a node that was disconnected is audited."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE inventory_node SET connectivity = 'connected', last_heartbeat_at = compute_now(),
                   updated_at = now(),
                   -- An agent's node joins the schedulable fleet with its first report.
                   provision_state = CASE WHEN agent AND provision_state = 'discovered' THEN 'deployed'
                                          ELSE provision_state END
             WHERE id = ANY(%s)
            """,
            [ids],
        )
    for pk in ids:
        if locked[pk].connectivity == Connectivity.DISCONNECTED:
            audit_record(
                actor=actor,
                action="node.connected",
                subject_type="node",
                subject_id=pk,
                reason="the node reported",
                data={"hostname": locked[pk].hostname},
            )


def _refuse_foreign_uids(uids: list[str]) -> None:
    """A uid is global: a GPU uuid already on another node is refused, not silently moved.

    Moving the row would carry its bookings to a node that never held them; an
    operator retires the old node's device first.
    """
    if not uids:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT d.uid, n.hostname FROM inventory_device d JOIN inventory_node n ON n.id = d.node_id
             WHERE d.uid = ANY(%s) LIMIT 20
            """,
            [uids],
        )
        clashes = cursor.fetchall()
    if clashes:
        details = [
            {"field": "uid", "message": f"{uid} already belongs to node {host}"} for uid, host in clashes
        ]
        raise Conflict(f"device {clashes[0][0]} already belongs to node {clashes[0][1]}", details)


def _layout_changes(
    *, wants: list[_Want], existing: list[dict[str, Any]], by_uid: dict[str, dict[str, Any]]
) -> tuple[dict[str, str], dict[int, str]]:
    """Guard 2's input: the GPUs whose MIG or slot layout changes, and their old atoms.

    A layout is the set of a GPU's children with their MIG profile. For a GPU that
    vanished and comes back, its old layout is the children that vanished with it.
    Returns {gpu uid: node id} of the changed GPUs and {old atom id: gpu uid}.
    """
    children_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in existing:
        if row["parent_id"] is not None:
            children_of[row["parent_id"]].append(row)
    new_children: dict[str, set[tuple[str, Any]]] = defaultdict(set)
    for w in wants:
        if w.parent_uid is not None:
            new_children[w.parent_uid].add((w.uid, w.attributes.get("migProfile")))

    changed: dict[str, str] = {}
    to_book: dict[int, str] = {}
    for w in wants:
        if w.device_class != DeviceClass.GPU or w.uid not in by_uid:
            continue
        parent = by_uid[w.uid]
        old = [
            c
            for c in children_of.get(parent["id"], [])
            if c["vanished_at"] == parent["vanished_at"]  # both None while the GPU is present
        ]
        old_layout = {(c["uid"], c["attributes"].get("migProfile")) for c in old}
        if old_layout == new_children.get(w.uid, set()):
            continue
        changed[w.uid] = w.node_id
        to_book[parent["id"]] = w.uid
        for c in old:
            to_book[c["id"]] = w.uid
    return changed, to_book


def _upsert_resources(*, items: list[tuple[Node, NodeReport]], ratios: dict[str, dict[str, float]]) -> None:
    """Scalars from the report; every scalar is written (missing ones as 0).

    Lowering allocatable below what is already claimed would break
    `allocated <= floor(allocatable * ratio)`. We keep the claims (they are live
    workloads) and store the smallest allocatable that still covers them,
    `ceil(allocated / ratio)`: nothing new fits until they are released, and the
    next report after that lowers it fully.
    """
    rows: list[dict[str, Any]] = []
    for node, report in items:
        for name in SCALARS:
            ratio = ratios.get(node.pk, {}).get(name)
            rows.append({"n": node.pk, "r": name, "a": report.resources.get(name, 0), "q": ratio})
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO inventory_noderesource (node_id, resource, allocatable, ratio, allocated)
            SELECT t.n, t.r, t.a,
                   COALESCE(t.q::numeric(6, 3),
                            (SELECT x.ratio FROM inventory_noderesource x
                              WHERE x.node_id = t.n AND x.resource = t.r),
                            1),
                   0
              FROM json_to_recordset(%s::json) AS t(n text, r text, a bigint, q float8)
            ON CONFLICT (node_id, resource) DO UPDATE
               SET ratio = EXCLUDED.ratio,
                   allocatable = GREATEST(EXCLUDED.allocatable,
                                          CEIL(inventory_noderesource.allocated / EXCLUDED.ratio)::bigint)
             WHERE (inventory_noderesource.ratio, inventory_noderesource.allocatable)
                   IS DISTINCT FROM (EXCLUDED.ratio, GREATEST(EXCLUDED.allocatable,
                                     CEIL(inventory_noderesource.allocated / EXCLUDED.ratio)::bigint))
            """,
            [json.dumps(rows)],
        )
