"""A fleet file's maintenance windows: each scheduled once; a bad one refuses the whole file."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.errors import Conflict, InvalidInput
from core.models import AuditEvent, Tenant
from fleets.load import fleet_load
from inventory.models import Node, Pool
from reservations.models import DeviceBooking, MaintenanceWindow
from tests.support.paths import ROOT

DEMO = json.loads((ROOT / "fleets" / "demo.json").read_text())


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fleet_with(*windows: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(DEMO)
    data["maintenance"] = list(windows)
    return data


def window(
    reason: str = "firmware", *, hours: int = 24, length: int = 4, nodes: list[str] | None = None
) -> dict[str, Any]:
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=hours)
    return {
        "nodes": nodes or ["gpu-a-001", "gpu-a-002"],
        "from": stamp(start),
        "to": stamp(start + timedelta(hours=length)),
        "reason": reason,
    }


@pytest.mark.django_db
def test_a_window_in_the_file_is_scheduled_and_a_reload_schedules_nothing_twice() -> None:
    data = fleet_with(window())
    answer = fleet_load(data=data)
    assert answer["maintenance"]["found"] == [] and answer["maintenance"]["past"] == []
    (window_id,) = answer["maintenance"]["scheduled"]
    held = MaintenanceWindow.objects.get(pk=window_id)
    node_ids = sorted(answer["nodes"][h] for h in ("gpu-a-001", "gpu-a-002"))
    assert (held.reason, held.state) == ("firmware", "scheduled")
    assert sorted(held.members.values_list("node_id", flat=True)) == node_ids
    bookings = DeviceBooking.objects.filter(window_id=window_id).count()
    assert bookings == Node.objects.get(pk=node_ids[0]).devices.filter(bookable=True).count() * 2 > 0
    assert AuditEvent.objects.filter(subject_id=window_id, action="maintenance.scheduled").count() == 1

    again = fleet_load(data=data)
    assert again["maintenance"] == {"scheduled": [], "found": [window_id], "past": []}
    assert MaintenanceWindow.objects.count() == 1
    assert DeviceBooking.objects.filter(window_id=window_id).count() == bookings
    assert AuditEvent.objects.filter(subject_id=window_id).count() == 1


@pytest.mark.django_db
def test_a_window_an_operator_cancelled_stays_cancelled_and_a_past_window_is_skipped() -> None:
    from reservations.maintenance.services import maintenance_cancel

    # One window, written twice: a second `window()` could fall in the next second.
    held, past = window(), window("old", hours=-10)
    answer = fleet_load(data=fleet_with(held, past))
    (window_id,) = answer["maintenance"]["scheduled"]
    assert answer["maintenance"]["past"] == ["maintenance[1]"]
    maintenance_cancel(window_id=window_id, actor="alice")

    again = fleet_load(data=fleet_with(held, past))
    assert again["maintenance"]["found"] == [window_id] and again["maintenance"]["scheduled"] == []
    assert list(MaintenanceWindow.objects.values_list("state", flat=True)) == ["cancelled"]


@pytest.mark.django_db
def test_a_bad_window_refuses_the_file_whole_naming_each_field() -> None:
    start = window()
    bad = [
        {**start, "nodes": ["gpu-a-001", "no-such-host"]},
        {**start, "from": "2030-01-07T06:00:00"},
        {**start, "to": start["from"]},
        {**start, "reason": "  ", "extra": 1},
        {"nodes": ["gpu-a-001"], "from": start["from"]},
    ]
    with pytest.raises(InvalidInput) as refused:
        fleet_load(data=fleet_with(*bad))
    fields = {d["field"]: d["message"] for d in refused.value.details}
    assert fields["maintenance[0].nodes[1]"] == "'no-such-host' is not the hostname of a node in this file"
    assert fields["maintenance[1].from"] == "must name its zone (Z or an offset such as +02:00)"
    assert fields["maintenance[2].to"] == "must be after from"
    assert fields["maintenance[3].extra"] == "unknown field"
    assert "non-empty string" in fields["maintenance[3].reason"]
    assert fields["maintenance[4].to"] == fields["maintenance[4].reason"] == "required"
    with pytest.raises(InvalidInput) as not_a_list:
        fleet_load(data={**DEMO, "maintenance": {"nodes": []}})
    assert not_a_list.value.details == [{"field": "maintenance", "message": "must be a list"}]
    assert not (Pool.objects.exists() or Node.objects.exists() or MaintenanceWindow.objects.exists())


@pytest.mark.django_db
def test_a_window_that_meets_a_live_one_refuses_the_whole_load_naming_it() -> None:
    held = window()
    fleet_load(data=fleet_with(held))
    data = fleet_with(held, window("psu", hours=26, nodes=["gpu-a-002"]))
    data["tenants"].append({"id": "delta", "name": "Delta"})
    with pytest.raises(Conflict, match="nodes already held by maintenance window 'firmware'"):
        fleet_load(data=data)
    assert MaintenanceWindow.objects.count() == 1
    assert not Tenant.objects.filter(pk="delta").exists()
