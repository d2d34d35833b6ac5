"""Node reports into devices: atoms, MIG and slots, vanishing devices, bad reports, GPU models; registration.

(Layout changes and their bookings, guard 2: `tests/reservations/test_layouts.py`.)
"""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from core.errors import InvalidInput
from inventory.models import Device, NodeResource
from inventory.reports import gpu_model_from_product, report_parse
from inventory.services.registration import node_register
from reservations.models import DeviceBooking
from reservations.nodes.reports import node_report_apply
from tests.support.factories import NodeFactory, PoolFactory
from tests.support.records import book
from tests.support.reports import gpu, mig, report


@pytest.mark.django_db
def test_a_plain_eight_gpu_node_becomes_eight_gpu_atoms_and_the_rest() -> None:
    node = NodeFactory(connectivity="unknown")
    devices = node_report_apply(
        node=node, report=report(node.hostname, [gpu(i) for i in range(8)]), actor="t"
    )
    by_class: dict[str, list[Device]] = {}
    for d in devices:
        by_class.setdefault(d.device_class, []).append(d)
    assert len(by_class["gpu"]) == 8
    assert all(d.bookable and d.healthy for d in by_class["gpu"])
    first = Device.objects.get(uid=gpu(0)["uuid"])
    assert first.attributes == {
        "gpuProduct": "NVIDIA H100 80GB HBM3",
        "gpuModel": "H100",
        "vramGiB": 80,
        "numaNode": 0,
        "pciBusId": "00000000:18:00.0",
        "nvlinkDomain": "nvl-0",
    }
    assert Device.objects.get(uid=gpu(5)["uuid"]).attributes["numaNode"] == 1
    assert sorted(d.uid for d in by_class["nic.vf"]) == [
        f"{node.hostname}/0000:3b:00.2",
        f"{node.hostname}/0000:3b:00.3",
    ]
    assert [d.uid for d in by_class["disk"]] == [f"{node.hostname}/nvme0n1"]
    assert [d.uid for d in by_class["node"]] == [node.id]
    assert NodeResource.objects.get(node=node, resource="vcpu").allocatable == 224
    node.refresh_from_db()
    assert node.connectivity == "connected"
    assert node.last_heartbeat_at is not None


@pytest.mark.django_db
def test_applying_the_same_report_twice_changes_no_device() -> None:
    node = NodeFactory()
    body = report(node.hostname, [gpu(i) for i in range(2)])
    node_report_apply(node=node, report=body, actor="t")
    before = list(
        Device.objects.filter(node=node).order_by("uid").values("id", "uid", "updated_at", "attributes")
    )
    node_report_apply(node=node, report=body, actor="t")
    after = list(
        Device.objects.filter(node=node).order_by("uid").values("id", "uid", "updated_at", "attributes")
    )
    assert before == after


@pytest.mark.django_db
def test_a_mig_node_has_unbookable_parents_and_mig_atoms() -> None:
    node = NodeFactory(pool=PoolFactory(gpu_model="A100", sharing="mig"))
    body = report(node.hostname, [gpu(0, mig=mig("3g.40gb", "3g.40gb")), gpu(1, mig=mig("7g.80gb"))])
    node_report_apply(node=node, report=body, actor="t")
    parent = Device.objects.get(uid=gpu(0)["uuid"])
    assert parent.device_class == "gpu" and not parent.bookable
    children = list(parent.children.order_by("uid"))
    assert [c.uid for c in children] == [f"{parent.uid}/gi1/ci0", f"{parent.uid}/gi2/ci0"]
    assert all(c.device_class == "gpu.mig" and c.bookable for c in children)
    assert children[0].attributes["migProfile"] == "3g.40gb"
    assert children[0].attributes["memoryGiB"] == 39
    assert Device.objects.filter(node=node, device_class="gpu.mig").count() == 3
    # A first report is not a layout change: nothing is booked.
    assert not DeviceBooking.objects.exists()


@pytest.mark.django_db
def test_a_timeslice_pool_node_has_slot_atoms_per_gpu() -> None:
    node = NodeFactory(pool=PoolFactory(gpu_model="L40S", sharing="timeslice", slots_per_gpu=4))
    node_report_apply(node=node, report=report(node.hostname, [gpu(0), gpu(1)]), actor="t")
    parent = Device.objects.get(uid=gpu(0)["uuid"])
    assert not parent.bookable
    slots = list(parent.children.order_by("uid"))
    assert [s.uid for s in slots] == [f"{parent.uid}/s{k}" for k in range(4)]
    assert [s.attributes["slotIndex"] for s in slots] == [0, 1, 2, 3]
    assert all(s.device_class == "gpu.slot" and s.bookable for s in slots)
    assert Device.objects.filter(node=node, device_class="gpu.slot").count() == 8


@pytest.mark.django_db
def test_a_dropped_gpu_with_a_future_booking_stays_unbookable_and_unhealthy_with_its_booking() -> None:
    node = NodeFactory()
    node_report_apply(node=node, report=report(node.hostname, [gpu(0), gpu(1)]), actor="t")
    dropped = Device.objects.get(uid=gpu(1)["uuid"])
    booking = book(dropped, timedelta(hours=1), timedelta(hours=2))
    node_report_apply(node=node, report=report(node.hostname, [gpu(0)]), actor="t")
    dropped.refresh_from_db()
    assert not dropped.bookable and not dropped.healthy and dropped.vanished_at is not None
    booking.refresh_from_db()
    assert booking.during.upper - booking.during.lower == timedelta(hours=1)
    # It comes back: restored.
    node_report_apply(node=node, report=report(node.hostname, [gpu(0), gpu(1)]), actor="t")
    dropped.refresh_from_db()
    assert dropped.bookable and dropped.healthy and dropped.vanished_at is None


@pytest.mark.django_db
def test_a_malformed_report_is_refused_whole_and_names_every_bad_field() -> None:
    node = NodeFactory()
    node_report_apply(node=node, report=report(node.hostname, [gpu(0)]), actor="t")
    before = list(Device.objects.order_by("uid").values_list("uid", "bookable", "vanished_at"))
    bad = report(node.hostname, [gpu(0), gpu(1), gpu(2)])
    bad["gpus"][2]["memoryMiB"] = -5
    bad["gpus"][1]["color"] = "red"
    bad["gpus"].append(copy.deepcopy(bad["gpus"][0]))
    bad["nics"][0]["vfs"].append("0000:3b:00.2")
    del bad["disks"][0]["sizeGiB"]
    with pytest.raises(InvalidInput) as refused:
        node_report_apply(node=node, report=bad, actor="t")
    fields = {d["field"] for d in refused.value.details}
    assert {
        "gpus[2].memoryMiB",
        "gpus[1].color",
        "gpus[3].uuid",
        "nics[0].vfs[2]",
        "disks[0].sizeGiB",
    } <= fields
    assert list(Device.objects.order_by("uid").values_list("uid", "bookable", "vanished_at")) == before


@pytest.mark.django_db
def test_lowering_allocatable_below_claims_keeps_the_claims() -> None:
    node = NodeFactory()
    node_report_apply(node=node, report=report(node.hostname, []), actor="t")
    NodeResource.objects.filter(node=node, resource="vcpu").update(allocated=100)
    body = report(node.hostname, [])
    body["resources"]["vcpu"] = 64
    node_report_apply(node=node, report=body, actor="t")
    vcpu = NodeResource.objects.get(node=node, resource="vcpu")
    assert vcpu.allocated == 100 and vcpu.allocatable == 100


@pytest.mark.parametrize(
    ("product", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("Tesla T4", "T4"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000Ada"),
        ("NVIDIA RTX A6000", "A6000"),
    ],
)
def test_gpu_model_follows_the_documented_rule_on_real_product_names(product: str, model: str) -> None:
    assert gpu_model_from_product(product) == model


def test_an_explicit_model_wins_over_the_product_name() -> None:
    body = report("gpu-x", [gpu(0)])
    body["gpus"][0]["model"] = "H100-SXM"
    assert report_parse(data=body).gpus[0].model == "H100-SXM"


@pytest.mark.django_db
def test_node_register_creates_then_updates_one_node_by_hostname() -> None:
    pool, other = PoolFactory(), PoolFactory()
    created = node_register(hostname="gpu-r-001", pool=pool, labels={"fabric": "ib-1", "rack": "r01"})
    updated = node_register(hostname="gpu-r-001", pool=other, cordoned=True, cordon_reason="rma")
    assert updated.pk == created.pk
    assert updated.pool_id == other.pk and updated.cordoned and updated.cordoned_at is not None
    assert updated.labels == {"fabric": "ib-1", "rack": "r01"}
    with pytest.raises(InvalidInput):
        node_register(hostname="gpu-r-001", pool=pool, color="red")
