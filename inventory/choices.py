"""The inventory's vocabulary: choices of its fields and the resource names built from them.

Defined once here and imported everywhere else (models, the request, the
rollups, fleet files, the admin).
"""

from __future__ import annotations

from django.db import models


class Sharing(models.TextChoices):
    EXCLUSIVE = "exclusive"
    MIG = "mig"
    TIMESLICE = "timeslice"
    MPS = "mps"


class Role(models.TextChoices):
    HOST = "host"
    CONTROLLER = "controller"
    STORAGE = "storage"
    GATEWAY = "gateway"


class Trust(models.TextChoices):
    PLATFORM = "platform"
    TENANT_OWNED = "tenant-owned"
    TENANT_CONTROLLED = "tenant-controlled"


class ProvisionState(models.TextChoices):
    DISCOVERED = "discovered"
    ADOPTING = "adopting"
    ADOPTED = "adopted"
    DEPLOYING = "deploying"
    DEPLOYED = "deployed"
    DEPROVISIONING = "deprovisioning"
    FAILED = "failed"


class Connectivity(models.TextChoices):
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    UNKNOWN = "unknown"


class TaintEffect(models.TextChoices):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"


class ScalarResource(models.TextChoices):
    VCPU = "vcpu"
    MEMORY_GIB = "memoryGiB"
    DISK_GIB = "diskGiB"
    HUGEPAGES_1GI = "hugepages1Gi"


class DeviceClass(models.TextChoices):
    GPU = "gpu"
    GPU_MIG = "gpu.mig"
    GPU_SLOT = "gpu.slot"
    NIC_VF = "nic.vf"
    DISK = "disk"
    NODE = "node"


# Every atom class, in the order the contract lists them; the GPU ones book a GPU or part of one.
ATOM_CLASSES: tuple[str, ...] = tuple(DeviceClass.values)
GPU_ATOM_CLASSES: tuple[str, ...] = (
    DeviceClass.GPU.value,
    DeviceClass.GPU_MIG.value,
    DeviceClass.GPU_SLOT.value,
)
SCALAR_RESOURCES: tuple[str, ...] = tuple(ScalarResource.values)
# What a rollup row or a quota can count: atoms by class and scalars by name.
ALL_RESOURCES: tuple[str, ...] = tuple(sorted(ATOM_CLASSES + SCALAR_RESOURCES))

# The pool sharing modes that cut a GPU into slots (`gpu.slot` atoms).
SLOT_SHARING: tuple[str, ...] = (Sharing.TIMESLICE.value, Sharing.MPS.value)

# The sharing modes an atom of each class can be booked under (model.md, "Placement"):
# one rule for the request's validation, the placer's filters and the CLI.
CLASS_SHARING: dict[str, tuple[str, ...]] = {
    DeviceClass.GPU.value: (Sharing.EXCLUSIVE.value,),
    DeviceClass.GPU_MIG.value: (Sharing.MIG.value,),
    DeviceClass.GPU_SLOT.value: SLOT_SHARING,
    DeviceClass.NIC_VF.value: (Sharing.EXCLUSIVE.value,),
    DeviceClass.DISK.value: (Sharing.EXCLUSIVE.value,),
    DeviceClass.NODE.value: (Sharing.EXCLUSIVE.value,),
}
