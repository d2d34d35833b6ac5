"""The operation mix: reservations (create, release) against cordons, taints, maintenance and health flips,
with BookingRepair interleaved.

An `Op` is plain data drawn from a seeded generator, so the same schedule can
be run through the service layer (`op_run_service`) or the HTTP API
(`op_run_http`). Which reservation a release takes is decided when it runs
(from the `Ledger` of live reservations), because that depends on what the
creates before it achieved; so is which node a "cordon a node booked in the
future" takes and which GPU a "booked GPU turns unhealthy" takes (one holding
a future booking when the operation runs). "repair" runs `bookings_repair()`,
as the worker does when a node change asks for it. "window" schedules a
maintenance window on a node, starting a little ahead, and "window-cancel"
cancels one of the live windows (which one is decided when it runs).
"""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.support.torture.fleet import Fleet

# Relative weights of the operation kinds; creates dominate so the atoms stay contested.
WEIGHTS: dict[str, int] = {
    "create": 40,
    "release": 22,
    "cordon": 4,
    "uncordon": 7,
    "taint": 4,
    "untaint": 7,
    "maintenance": 6,
    "health": 10,
    # A node or a GPU that holds a future booking leaves the schedulable set; repair moves it.
    "cordon-booked": 5,
    "health-booked": 4,
    "repair": 6,
    # Maintenance windows scheduled ahead on a node (future creates are moved off it or marked
    # at risk) and cancelled again.
    "window": 3,
    "window-cancel": 2,
}
TAINT_KEYS = ("torture/xid", "torture/ecc")
# Seconds after "now" a calendar reservation starts; None starts now.
START_OFFSETS: tuple[int | None, ...] = (None, None, None, 1800, 7200)

# What an operation ended as; anything else (an exception, a 5xx) is a failure of the run.
EXPECTED = {
    "created",
    "replayed",
    "no-capacity",
    "quota",
    "released",
    "nothing-to-release",
    "node-op",
    "nothing-booked",
    "repaired",
    "window",
    "window-refused",
    "window-cancelled",
    "no-window",
}

# The nodes and GPUs holding a future allocation booking now, for the "-booked" kinds to pick from.
_BOOKED_NODES_SQL = (
    "SELECT DISTINCT d.node_id FROM device_bookings b JOIN inventory_device d ON d.id = b.device_id"
    " WHERE b.allocation_id IS NOT NULL AND lower(b.during) > compute_now() AND d.node_id = ANY(%s)"
    " ORDER BY 1"
)
_BOOKED_GPUS_SQL = (
    "SELECT DISTINCT d.uid FROM device_bookings b JOIN inventory_device d ON d.id = b.device_id"
    " WHERE b.allocation_id IS NOT NULL AND lower(b.during) > compute_now() AND d.healthy"
    " AND d.uid = ANY(%s) ORDER BY 1"
)


@dataclass(frozen=True)
class Op:
    kind: str
    args: dict[str, Any]


@dataclass
class Ledger:
    """Live reservations (tenant, id) that a release may pick; thread-safe."""

    live: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, tenant_id: str, reservation_id: str) -> None:
        with self.lock:
            self.live.append((tenant_id, reservation_id))

    def take(self, pick: float) -> tuple[str, str] | None:
        with self.lock:
            if not self.live:
                return None
            return self.live.pop(int(pick * len(self.live)))


@dataclass
class Tally:
    """Outcomes per kind, thread-safe."""

    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, op: Op, outcome: str) -> None:
        with self.lock:
            self.counts[outcome] += 1
            if outcome not in EXPECTED:
                self.failures.append(f"{op.kind} {op.args}: {outcome}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def ops_generate(*, fleet: Fleet, seed: int, count: int, now_ms: int, key_prefix: str) -> list[Op]:
    """`count` operations drawn from `seed`: the same arguments always give the same schedule."""
    rng = random.Random(seed)
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    ops: list[Op] = []
    for index in range(count):
        kind = rng.choices(kinds, weights)[0]
        node_id = rng.choice(fleet.node_ids)
        if kind == "create":
            pool_id, tenant_id = rng.choice(fleet.bookers)
            body: dict[str, Any] = {
                "tenantId": tenant_id,
                "poolId": pool_id,
                "devices": [{"class": "gpu", "count": rng.choice((1, 1, 2, 2, 3, 4))}],
                "duration": rng.choice(("1h", "90m", "2h")),
                "idempotencyKey": f"{key_prefix}-{seed}-{index}",
            }
            offset = rng.choice(START_OFFSETS)
            if offset is not None:
                body["start"] = now_ms + offset * 1000
            if rng.random() < 0.5:
                body["resources"] = {"vcpu": rng.choice((2, 4, 8, 16))}
            ops.append(Op("create", {"body": body}))
        elif kind == "release":
            ops.append(Op("release", {"pick": rng.random()}))
        elif kind in ("cordon", "uncordon"):
            ops.append(Op(kind, {"nodeId": node_id}))
        elif kind == "taint":
            effect = rng.choice(("NoSchedule", "NoSchedule", "PreferNoSchedule"))
            ops.append(Op("taint", {"nodeId": node_id, "key": rng.choice(TAINT_KEYS), "effect": effect}))
        elif kind == "untaint":
            ops.append(Op("untaint", {"nodeId": node_id, "key": rng.choice(TAINT_KEYS)}))
        elif kind == "maintenance":
            ops.append(Op("maintenance", {"nodeId": node_id, "on": rng.random() < 0.45}))
        elif kind in ("cordon-booked", "health-booked"):
            ops.append(Op(kind, {"pick": rng.random()}))
        elif kind == "repair":
            ops.append(Op("repair", {}))
        elif kind == "window":
            start = now_ms + rng.choice((600, 1800, 3600, 5400)) * 1000
            end = start + rng.choice((1800, 3600, 7200)) * 1000
            ops.append(Op("window", {"nodeId": node_id, "from": start, "to": end}))
        elif kind == "window-cancel":
            ops.append(Op("window-cancel", {"pick": rng.random()}))
        else:
            ops.append(Op("health", {"uid": rng.choice(fleet.device_uids), "healthy": rng.random() < 0.65}))
    return ops


def booked_pick(op: Op, fleet_ids: list[str]) -> str | None:
    """For a "-booked" kind: the node (or GPU uid) holding a future booking now that `pick` chooses."""
    from django.db import connection

    sql = _BOOKED_NODES_SQL if op.kind == "cordon-booked" else _BOOKED_GPUS_SQL
    with connection.cursor() as cursor:
        cursor.execute(sql, [fleet_ids])
        found = [row[0] for row in cursor.fetchall()]
    if not found:
        return None
    return str(found[int(op.args["pick"] * len(found))])


def window_pick(op: Op) -> str | None:
    """For "window-cancel": the live window `pick` chooses, or None when there is none."""
    from reservations.models import MaintenanceWindow

    live = list(
        MaintenanceWindow.objects.filter(state__in=("scheduled", "active"))
        .order_by("id")
        .values_list("pk", flat=True)
    )
    return live[int(op.args["pick"] * len(live))] if live else None


def window_run_service(op: Op, actor: str) -> str:
    """Schedule or cancel a maintenance window through the service, as `nodes/*Maintenance` does."""
    from datetime import UTC, datetime

    from core.errors import Conflict
    from reservations.maintenance.services import maintenance_cancel, maintenance_schedule

    if op.kind == "window-cancel":
        window_id = window_pick(op)
        if window_id is None:
            return "no-window"
        try:
            maintenance_cancel(window_id=window_id, actor=actor)
        except Conflict:  # ended or cancelled by someone else meanwhile
            return "no-window"
        return "window-cancelled"
    try:
        maintenance_schedule(
            node_ids=[op.args["nodeId"]],
            starts_at=datetime.fromtimestamp(op.args["from"] / 1000, tz=UTC),
            ends_at=datetime.fromtimestamp(op.args["to"] / 1000, tz=UTC),
            reason="torture",
            actor=actor,
        )
    except Conflict:  # another window holds the node then
        return "window-refused"
    return "window"


def window_run_http(op: Op, *, base_url: str, operator: str) -> str:
    """The same over HTTP."""
    if op.kind == "window-cancel":
        window_id = window_pick(op)
        if window_id is None:
            return "no-window"
        status, answer = http_post(base_url, "nodes/cancelMaintenance", operator, {"windowId": window_id})
        if status == 409:
            return "no-window"
        return "window-cancelled" if status == 200 else f"cancel answered {status} {answer!r}"
    body = {"nodeIds": [op.args["nodeId"]], "from": op.args["from"], "to": op.args["to"], "reason": "torture"}
    status, answer = http_post(base_url, "nodes/scheduleMaintenance", operator, body)
    if status == 409:
        return "window-refused"
    return "window" if status == 201 else f"schedule answered {status} {answer!r}"


def repair_run() -> str:
    """BookingRepair, as the worker runs it after a node change or a release."""
    from reservations.lifecycle.repair_sweep import bookings_repair

    bookings_repair()
    return "repaired"


def op_run_service(op: Op, ledger: Ledger, fleet: Fleet | None = None) -> str:
    """Run one operation through the service layer, on the calling thread's connection.

    Node and device changes go through `reservations.nodes.changes`, as every
    caller's do. The "-booked" kinds need the `fleet` (whose nodes and GPUs they
    pick among); without it they find nothing booked.
    """
    from core.errors import NoCapacity, QuotaExceeded
    from inventory.models import Device, Node
    from operations import services as operations
    from reservations.models import Reservation
    from reservations.request.parse import parse_reservation_request
    from reservations.services import reservation_create, reservation_release

    actor = "torture"
    if op.kind == "create":
        request = parse_reservation_request(op.args["body"])
        try:
            reservation, created = reservation_create(request=request, actor=actor)
        except NoCapacity:
            return "no-capacity"
        except QuotaExceeded:
            return "quota"
        ledger.add(request.tenant_id, reservation.pk)
        return "created" if created else "replayed"
    if op.kind == "release":
        target = ledger.take(op.args["pick"])
        if target is None:
            return "nothing-to-release"
        reservation_release(reservation=Reservation.objects.get(pk=target[1]), actor=actor)
        return "released"
    if op.kind == "repair":
        return repair_run()
    if op.kind in ("window", "window-cancel"):
        return window_run_service(op, actor)
    if op.kind == "health-booked":
        uid = booked_pick(op, fleet.device_uids) if fleet is not None else None
        if uid is None:
            return "nothing-booked"
        operations.device_set_health(
            device=Device.objects.get(uid=uid), healthy=False, reason="torture: booked GPU fails", actor=actor
        )
        return "node-op"
    if op.kind == "health":
        device = Device.objects.get(uid=op.args["uid"])
        operations.device_set_health(
            device=device, healthy=op.args["healthy"], reason="torture flip", actor=actor
        )
        return "node-op"
    if op.kind == "cordon-booked":
        node_id = booked_pick(op, fleet.node_ids) if fleet is not None else None
        if node_id is None:
            return "nothing-booked"
        operations.node_cordon(node=Node.objects.get(pk=node_id), reason="torture: booked node", actor=actor)
        return "node-op"
    node = Node.objects.get(pk=op.args["nodeId"])
    if op.kind == "cordon":
        operations.node_cordon(node=node, reason="torture", actor=actor)
    elif op.kind == "uncordon":
        operations.node_uncordon(node=node, actor=actor)
    elif op.kind == "taint":
        operations.node_taint(
            node=node, key=op.args["key"], value="", effect=op.args["effect"], reason="torture", actor=actor
        )
    elif op.kind == "untaint":
        operations.node_untaint(node=node, key=op.args["key"], actor=actor)
    elif op.kind == "maintenance":
        operations.node_set_maintenance(node=node, on=op.args["on"], reason="torture", actor=actor)
    else:  # pragma: no cover - the generator makes only the kinds above
        raise AssertionError(op.kind)
    return "node-op"


def op_run_service_retrying(op: Op, ledger: Ledger, lost: Counter[str], fleet: Fleet | None = None) -> str:
    """`op_run_service`, run again on a new connection after each one lost (counted in `lost` by kind).

    A create retried this way carries the same idempotencyKey, so it is answered the
    reservation it made if its first try committed.
    """
    from django.db import InterfaceError, OperationalError, connections

    while True:
        try:
            return op_run_service(op, ledger, fleet)
        except (OperationalError, InterfaceError):
            lost[op.kind] += 1
            connections.close_all()


def http_post(
    base_url: str, path: str, token: str, body: dict[str, Any], timeout: float = 60
) -> tuple[int, Any]:
    """POST a JSON body; return (status, parsed answer). Never raises on an HTTP error status."""
    request = urllib.request.Request(  # noqa: S310 (http to a local test server)
        f"{base_url}/api/compute/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        raw = error.read()  # may raise IncompleteRead if the server dies mid-answer; callers retry
        try:
            return error.code, json.loads(raw or b"null")
        except ValueError:
            return error.code, raw.decode(errors="replace")


def op_run_http(
    op: Op, ledger: Ledger, *, base_url: str, tokens: dict[str, str], fleet: Fleet | None = None
) -> str:
    """Run one operation through the API; `tokens` maps each tenant id and "operator" to a bearer token.

    The "-booked" kinds choose their node or GPU from the database, then act
    over HTTP; "repair" runs here, as the worker beside the servers would.
    """
    if op.kind == "repair":
        return repair_run()
    if op.kind in ("window", "window-cancel"):
        return window_run_http(op, base_url=base_url, operator=tokens["operator"])
    if op.kind in ("cordon-booked", "health-booked"):
        if fleet is None:
            return "nothing-booked"
        picked = booked_pick(op, fleet.node_ids if op.kind == "cordon-booked" else fleet.device_uids)
        if picked is None:
            return "nothing-booked"
        if op.kind == "cordon-booked":
            op = Op("cordon", {"nodeId": picked})
        else:
            op = Op("health", {"uid": picked, "healthy": False})
    if op.kind == "create":
        body = op.args["body"]
        status, answer = http_post(base_url, "reservations/create", tokens[body["tenantId"]], body)
        if status in (200, 201):
            ledger.add(body["tenantId"], answer["id"])
            return "created" if status == 201 else "replayed"
        code = answer.get("error", {}).get("code") if isinstance(answer, dict) else None
        if status == 409 and code == "NO_CAPACITY":
            return "no-capacity"
        if status == 409 and code == "QUOTA_EXCEEDED":
            return "quota"
        return f"create answered {status} {answer!r}"
    if op.kind == "release":
        target = ledger.take(op.args["pick"])
        if target is None:
            return "nothing-to-release"
        tenant_id, reservation_id = target
        status, answer = http_post(
            base_url,
            "reservations/release",
            tokens[tenant_id],
            {"tenantId": tenant_id, "reservationId": reservation_id},
        )
        return (
            "released" if status == 200 and answer["state"] == "released" else f"release {status} {answer!r}"
        )
    operator = tokens["operator"]
    if op.kind == "health":
        body = {"deviceUid": op.args["uid"], "healthy": op.args["healthy"]}
        if not op.args["healthy"]:
            body["reason"] = "torture flip"
        status, answer = http_post(base_url, "devices/setHealth", operator, body)
    else:
        path, body = {
            "cordon": ("nodes/cordon", {"nodeId": op.args["nodeId"], "reason": "torture"}),
            "uncordon": ("nodes/uncordon", {"nodeId": op.args["nodeId"]}),
            "taint": (
                "nodes/taint",
                {"nodeId": op.args["nodeId"], "key": op.args.get("key"), "effect": op.args.get("effect")},
            ),
            "untaint": ("nodes/untaint", {"nodeId": op.args["nodeId"], "key": op.args.get("key")}),
            "maintenance": (
                "nodes/setMaintenance",
                {"nodeId": op.args["nodeId"], "on": op.args.get("on"), "reason": "torture"},
            ),
        }[op.kind]
        status, answer = http_post(base_url, path, operator, body)
    return "node-op" if status == 200 else f"{op.kind} answered {status} {answer!r}"
