"""Layout changes in node reports and the atom rule (guard 2): a MIG or slot layout change books every atom
of the GPU for the change window, or is refused whole while one of them is booked."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from core.clock import compute_now
from core.errors import Conflict
from inventory.models import Device
from reservations.models import DeviceBooking
from reservations.nodes.reports import node_report_apply
from tests.support.factories import NodeFactory, PoolFactory
from tests.support.records import book
from tests.support.reports import gpu, mig, report


@pytest.mark.django_db
def test_a_mig_layout_change_is_refused_while_a_mig_atom_has_a_future_booking() -> None:
    node = NodeFactory(pool=PoolFactory(gpu_model="A100", sharing="mig"))
    node_report_apply(
        node=node, report=report(node.hostname, [gpu(0, mig=mig("3g.40gb", "3g.40gb"))]), actor="t"
    )
    atom = Device.objects.get(uid=f"{gpu(0)['uuid']}/gi2/ci0")
    book(atom, timedelta(days=1), timedelta(days=2))
    before = list(Device.objects.order_by("uid").values_list("uid", "bookable", "attributes"))
    with pytest.raises(Conflict) as refused:
        node_report_apply(
            node=node,
            report=report(node.hostname, [gpu(0, mig=mig("1g.10gb", "1g.10gb", "1g.10gb"))]),
            actor="t",
        )
    assert gpu(0)["uuid"] in refused.value.message
    assert list(Device.objects.order_by("uid").values_list("uid", "bookable", "attributes")) == before
    assert DeviceBooking.objects.filter(purpose="layout-change").count() == 0


@pytest.mark.django_db
def test_a_mig_layout_change_without_bookings_books_old_and_new_atoms_for_the_change_window() -> None:
    node = NodeFactory(pool=PoolFactory(gpu_model="A100", sharing="mig"))
    node_report_apply(
        node=node, report=report(node.hostname, [gpu(0, mig=mig("3g.40gb", "3g.40gb"))]), actor="t"
    )
    uuid = gpu(0)["uuid"]
    new_layout = [
        {"gi": 1, "ci": 0, "profile": "3g.40gb", "memoryMiB": 40192},
        {"gi": 5, "ci": 0, "profile": "1g.10gb", "memoryMiB": 9728},
        {"gi": 6, "ci": 0, "profile": "1g.10gb", "memoryMiB": 9728},
    ]
    node_report_apply(
        node=node,
        report=report(node.hostname, [gpu(0, mig=new_layout), gpu(1, mig=mig("7g.80gb"))]),
        actor="t",
    )
    removed = Device.objects.get(uid=f"{uuid}/gi2/ci0")
    assert not removed.bookable and removed.vanished_at is not None
    assert Device.objects.get(uid=f"{uuid}/gi5/ci0").bookable
    booked = set(DeviceBooking.objects.filter(purpose="layout-change").values_list("device__uid", flat=True))
    # The parent and the old children, and the new atoms for the same window.
    assert booked == {uuid, f"{uuid}/gi1/ci0", f"{uuid}/gi2/ci0", f"{uuid}/gi5/ci0", f"{uuid}/gi6/ci0"}
    window = timedelta(seconds=settings.CAPACITY_LAYOUT_CHANGE_SECONDS)
    now = compute_now()
    for b in DeviceBooking.objects.filter(purpose="layout-change"):
        assert b.allocation_id is None
        assert b.during.lower <= now < b.during.upper
        assert b.during.upper - b.during.lower == window
    # The second GPU is new, not a layout change: none of its atoms are booked.
    assert not DeviceBooking.objects.filter(device__uid__startswith=gpu(1)["uuid"]).exists()


@pytest.mark.django_db
def test_enabling_mig_on_a_whole_gpu_with_a_live_booking_is_refused() -> None:
    node = NodeFactory()
    node_report_apply(node=node, report=report(node.hostname, [gpu(0)]), actor="t")
    book(Device.objects.get(uid=gpu(0)["uuid"]), timedelta(0), timedelta(hours=1))
    with pytest.raises(Conflict):
        node_report_apply(node=node, report=report(node.hostname, [gpu(0, mig=mig("7g.80gb"))]), actor="t")
    assert Device.objects.get(uid=gpu(0)["uuid"]).bookable


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_layout_changes_of_one_gpu_serialize_and_one_is_refused() -> None:
    node = NodeFactory(pool=PoolFactory(gpu_model="A100", sharing="mig"))
    node_report_apply(node=node, report=report(node.hostname, [gpu(0, mig=mig("7g.80gb"))]), actor="t")
    layouts = [mig("3g.40gb", "3g.40gb"), mig("1g.10gb", "1g.10gb", "1g.10gb")]
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def apply(layout: list[dict[str, Any]]) -> None:
        try:
            start.wait()
            node_report_apply(node=node, report=report(node.hostname, [gpu(0, mig=layout)]), actor="t")
            outcomes.append("applied")
        except Conflict:
            outcomes.append("refused")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=apply, args=(layout,)) for layout in layouts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The node lock makes the second wait; it then sees the first's change window booked.
    assert sorted(outcomes) == ["applied", "refused"]
    live = Device.objects.filter(node=node, device_class="gpu.mig", vanished_at__isnull=True)
    assert {d.attributes["migProfile"] for d in live} in ({"3g.40gb"}, {"1g.10gb"})
