"""factory-boy factories for the records; tests build personas from these."""

from __future__ import annotations

import uuid
from datetime import timedelta

import factory
from django.utils import timezone

from core.models import Tenant
from inventory.models import Device, Node, NodeResource, Offering, Pool, Project, Taint
from ledger.models import QuotaUsage
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


class OfferingFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Offering

    pool = factory.SubFactory(PoolFactory)
    tenant = factory.SubFactory(TenantFactory)


class QuotaUsageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = QuotaUsage

    pool = factory.SubFactory(PoolFactory)
    tenant = factory.SubFactory(TenantFactory)
    resource = "gpu"
    max = 16


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    hostname = factory.Sequence(lambda n: f"gpu-{n:04d}")
    pool = factory.SubFactory(PoolFactory)
    labels = factory.LazyFunction(lambda: {"fabric": "ib-1", "rack": "r01"})


class TaintFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Taint

    node = factory.SubFactory(NodeFactory)
    key = factory.Sequence(lambda n: f"key-{n}")
    effect = "PreferNoSchedule"


class NodeResourceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = NodeResource

    node = factory.SubFactory(NodeFactory)
    resource = "vcpu"
    allocatable = 64


class DeviceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Device

    uid = factory.LazyFunction(lambda: f"GPU-{uuid.uuid4()}")
    node = factory.SubFactory(NodeFactory)
    device_class = "gpu"
    attributes = factory.LazyFunction(
        lambda: {"gpuProduct": "NVIDIA H100 80GB HBM3", "gpuModel": "H100", "vramGiB": 80, "numaNode": 0}
    )


class ReservationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Reservation

    tenant = factory.SubFactory(TenantFactory)
    pool = factory.SubFactory(PoolFactory)
    request = factory.LazyFunction(dict)
    request_digest = "0" * 64
    idempotency_key = factory.Sequence(lambda n: f"key-{n}")
    starts_at = factory.LazyFunction(timezone.now)
    ends_at = factory.LazyAttribute(lambda o: o.starts_at + timedelta(hours=1))
    state = "active"


class AllocationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Allocation

    reservation = factory.SubFactory(ReservationFactory)
    node = factory.SubFactory(NodeFactory)


def gpus(node: Node, count: int, **fields: object) -> list[Device]:
    """`count` whole GPUs on `node`."""
    return [DeviceFactory.create(node=node, **fields) for _ in range(count)]
