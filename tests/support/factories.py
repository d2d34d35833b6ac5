"""factory-boy factories for the records; tests build personas from these."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import factory
from django.utils import timezone

from core.models import Tenant
from inventory.models import Device, Node, NodeResource, Pool, Project, Taint
from ledger.models import Offering, QuotaUsage
from reservations.models import Allocation, Reservation


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("id",)

    id = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda o: o.id.title())


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"project-{n}")


class PoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Pool

    owner = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"pool-{n}")
    gpu_model = "H100"
    sharing = "exclusive"


class TenantInPoolFactory(factory.django.DjangoModelFactory):
    """The base of what a tenant has in a pool: an offering, a quota, a reservation."""

    class Meta:
        abstract = True

    pool = factory.SubFactory(PoolFactory)
    tenant = factory.SubFactory(TenantFactory)


class OfferingFactory(TenantInPoolFactory):
    class Meta:
        model = Offering


class QuotaUsageFactory(TenantInPoolFactory):
    class Meta:
        model = QuotaUsage

    resource = "gpu"
    max = 16


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    hostname = factory.Sequence(lambda n: f"gpu-{n:04d}")
    pool = factory.SubFactory(PoolFactory)
    labels = factory.LazyFunction(lambda: {"fabric": "ib-1", "rack": "r01"})


class OnNodeFactory(factory.django.DjangoModelFactory):
    """The base of what a node has: its taints, its scalar resources, its devices, its allocations."""

    class Meta:
        abstract = True

    node = factory.SubFactory(NodeFactory)


class TaintFactory(OnNodeFactory):
    class Meta:
        model = Taint

    key = factory.Sequence(lambda n: f"key-{n}")
    effect = "PreferNoSchedule"


class NodeResourceFactory(OnNodeFactory):
    class Meta:
        model = NodeResource

    resource = "vcpu"
    allocatable = 64


class DeviceFactory(OnNodeFactory):
    class Meta:
        model = Device

    uid = factory.LazyFunction(lambda: f"GPU-{uuid.uuid4()}")
    device_class = "gpu"
    attributes = factory.LazyFunction(
        lambda: {"gpuProduct": "NVIDIA H100 80GB HBM3", "gpuModel": "H100", "vramGiB": 80, "numaNode": 0}
    )


class ReservationFactory(TenantInPoolFactory):
    class Meta:
        model = Reservation

    request = factory.LazyFunction(dict)
    request_digest = "0" * 64
    idempotency_key = factory.Sequence(lambda n: f"key-{n}")
    starts_at = factory.LazyFunction(timezone.now)
    ends_at = factory.LazyAttribute(lambda o: o.starts_at + timedelta(hours=1))
    state = "active"


class AllocationFactory(OnNodeFactory):
    class Meta:
        model = Allocation

    reservation = factory.SubFactory(ReservationFactory)


def gpus(node: Node, count: int, **fields: object) -> list[Device]:
    """`count` whole GPUs on `node`."""
    return [DeviceFactory.create(node=node, **fields) for _ in range(count)]


def partitioned_gpu(
    node: Node, uid: str, part_class: str, parts: dict[str, dict[str, Any]], **gpu_fields: Any
) -> tuple[Device, list[Device]]:
    """A GPU `uid` on `node` that is never bookable itself, and its bookable parts (MIG instances or
    time-slice slots) of `part_class`: one `uid/<suffix>` for each suffix in `parts`, with its attributes.
    """
    gpu = DeviceFactory.create(node=node, uid=uid, bookable=False, **gpu_fields)
    made = [
        DeviceFactory.create(
            node=node, uid=f"{uid}/{suffix}", device_class=part_class, parent=gpu, attributes=attributes
        )
        for suffix, attributes in parts.items()
    ]
    return gpu, made
