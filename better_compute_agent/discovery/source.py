"""Where a host's facts come from: the `HostSource` interface and the snapshot it returns.

A snapshot is a plain JSON-able dict, the same whether it was read live (NVML, /proc,
/sys) or from a file, so a host without NVML can be described by hand and every later
step (the node report, the device map) is tested without hardware. Its keys:

* `snapshotVersion`: 1.
* `hostname`: the host's name as the kernel has it.
* `driverVersion`: the NVIDIA driver's version, or null.
* `description` (optional): free text saying what host a hand-written snapshot describes.
* `host`: `vcpu` (logical CPUs), `memoryGiB` (MemTotal, rounded down), `hugepages1Gi`
  (1 GiB hugepages reserved).
* `gpus`: one object per GPU, in NVML index order:
  * `index` (NVML index), `uuid` (`GPU-…`, null when even that could not be read),
    `name` (the product, as `nvidia-smi` prints it), `memoryMiB` (total framebuffer as
    NVML reports it), `pciBusId` (`00000000:1B:00.0`), `minor` (N of `/dev/nvidiaN`),
    `numaNode` (null when the platform has none), `nvlinkDomain` (null without NVLink);
    any of these is null when it could not be read;
  * `mig`: `enabled` and `instances`, each `gi`, `ci`, `profile` (`1g.10gb`), `memoryMiB`,
    `uuid` (`MIG-…`), `giCapDevice` and `ciCapDevice` (the `/dev/nvidia-caps/nvidia-capN`
    devices a container needs to use the instance; null when unknown);
  * `health`: `retiredPagesPending`, `rowRemapFailure` (booleans), `xidEvents` (critical
    XID numbers seen), `queryErrors` (one line per NVML query that failed).
* `nics`: SR-IOV capable network interfaces: `pf` (interface name), `pciAddress`,
  `linkGbps` (null when the link is down), `numaNode`, `vfs` (the VFs' PCI addresses).
* `disks`: whole block devices: `id` (kernel name), `sizeGiB` (rounded down), `media`
  (`nvme`, `ssd` or `hdd`).
* `numa` (optional): the NUMA nodes, each `node` (its id), `cpus` (its CPUs in the
  kernel's cpulist form, `0-27,56-83`) and `distances` (sysfs `distance`: to each node
  in this list's order; 10 is local). Without it the host is one node holding every CPU.
* `gpus[].processes` (optional, hand-written snapshots only): the pids a test bed says
  use the GPU; a live read asks NVML instead (`gpu_processes`).

Readers ignore keys they do not know, so a later version may add facts.
"""

from __future__ import annotations

from typing import Any, Protocol

SNAPSHOT_VERSION = 1

Snapshot = dict[str, Any]


class DiscoveryError(Exception):
    """The host's facts cannot be read; the message is one line meant for the operator."""


class HostSource(Protocol):
    """Anything that can say what a host has, right now."""

    def read(self) -> Snapshot:
        """The host's snapshot; raises `DiscoveryError` when nothing can be read at all."""
        ...

    def gpu_processes(self) -> dict[str, list[int]]:
        """GPU UUID → the pids using it now (empty where that cannot be read)."""
        ...
