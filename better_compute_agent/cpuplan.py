"""Which host CPUs a reservation's cgroup gets: near its GPUs first, never another's at ratio 1.

Pure functions over the host's NUMA topology (the snapshot's `numa`, read from
sysfs) and the CPU sets already planned for the holdings that overlap the new
one. The choice is the kubelet's static CPU manager with the topology
manager's preference, done per reservation:

* **Order of NUMA nodes.** The nodes of the booked GPUs first, then the others
  by their distance to the nearest of those (sysfs `distance`), then by id. A
  reservation without GPUs starts at the node with the most free CPUs, so that
  it is packed onto as few nodes as possible.
* **Ratio 1 (no vCPU overcommit).** Only CPUs in no overlapping holding's set
  are taken, so no CPU is in the sets of two live reservations. The node's own
  guard (`guard`) has already checked that enough vCPUs are free at every
  instant of the window; when the overlapping plans fragment them so that no
  CPU is free over the whole window, the least shared CPUs are taken, and the
  placement says `exclusive: false`.
* **Overcommit (ratio r > 1).** A CPU may be in up to ⌊r⌋ sets; the least
  loaded CPUs in node order are taken, so the sharing is spread evenly. The
  cgroup then shares time fairly (`limits_for`): `cpu.weight` in proportion to
  the booked vCPUs, and `cpu.max` at the booked vCPUs divided by r, which is
  the share every booking is promised when all of them are busy at once.

`gpuLocal` is true when every chosen CPU is on a NUMA node of the booked GPUs
(or when those GPUs' nodes are unknown, as on a one-socket host).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
CPU_PERIOD_US = 100_000


def cpulist_parse(text: str) -> tuple[int, ...]:
    """`0-3,8,10-11` (the kernel's cpulist form) → (0, 1, 2, 3, 8, 10, 11)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return tuple(sorted(cpus))


def cpulist_format(cpus: Iterable[int]) -> str:
    """The inverse of `cpulist_parse`: the form `cpuset.cpus` and sysfs take."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


@dataclass(frozen=True)
class Topology:
    """NUMA node → its CPUs, and node → node → distance (10 is local, as sysfs has it)."""

    nodes: Mapping[int, tuple[int, ...]]
    distances: Mapping[int, Mapping[int, int]]

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(cpu for cpus in self.nodes.values() for cpu in cpus))

    def node_of(self, cpu: int) -> int:
        for node, cpus in self.nodes.items():
            if cpu in cpus:
                return node
        raise KeyError(cpu)

    def distance(self, a: int, b: int) -> int:
        return int(self.distances.get(a, {}).get(b, 10 if a == b else 20))


def topology_from(snapshot: Mapping[str, Any]) -> Topology:
    """The snapshot's `numa`; without one, a single node 0 with CPUs 0 … vcpu-1."""
    numa = snapshot.get("numa") or []
    if not numa:
        return Topology(nodes={0: tuple(range(int(snapshot["host"]["vcpu"])))}, distances={0: {0: 10}})
    order = [int(entry["node"]) for entry in numa]
    nodes = {int(entry["node"]): cpulist_parse(str(entry.get("cpus") or "")) for entry in numa}
    distances: dict[int, dict[int, int]] = {}
    for entry in numa:
        row = list(entry.get("distances") or [])
        distances[int(entry["node"])] = {other: int(row[i]) for i, other in enumerate(order) if i < len(row)}
    return Topology(nodes=nodes, distances=distances)


@dataclass(frozen=True)
class Placement:
    """What the node gave one reservation: its CPUs, their NUMA nodes, and whether they are near its GPUs."""

    cpus: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    gpu_local: bool
    exclusive: bool = True

    def as_json(self) -> dict[str, Any]:
        """The acknowledgement's `placement` (the service's contract)."""
        return {"cpus": list(self.cpus), "numaNodes": list(self.numa_nodes), "gpuLocal": self.gpu_local}

    def stored(self) -> dict[str, Any]:
        return {**self.as_json(), "exclusive": self.exclusive}

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> Placement:
        return cls(
            cpus=tuple(int(c) for c in data.get("cpus") or ()),
            numa_nodes=tuple(int(n) for n in data.get("numaNodes") or ()),
            gpu_local=bool(data.get("gpuLocal", True)),
            exclusive=bool(data.get("exclusive", True)),
        )


def _node_order(topology: Topology, gpu_nodes: set[int], free: Mapping[int, int]) -> list[int]:
    local = sorted(node for node in gpu_nodes if node in topology.nodes)
    if not local:
        return sorted(topology.nodes, key=lambda node: (-free.get(node, 0), node))
    others = sorted(
        (node for node in topology.nodes if node not in gpu_nodes),
        key=lambda node: (min(topology.distance(g, node) for g in local), node),
    )
    return local + others


def cpus_choose(
    topology: Topology,
    *,
    want: int,
    gpu_nodes: Iterable[int],
    ratio: float,
    taken: Sequence[Iterable[int]],
) -> Placement:
    """The CPUs for a reservation of `want` vCPUs whose GPUs sit on `gpu_nodes`; see the module docstring.

    `taken` is the CPU set of every holding whose window overlaps this one's.
    """
    all_cpus = topology.cpus
    want = max(0, min(want, len(all_cpus)))
    gpu_nodes = {int(node) for node in gpu_nodes}
    load: dict[int, int] = dict.fromkeys(all_cpus, 0)
    for cpus in taken:
        for cpu in cpus:
            if cpu in load:
                load[cpu] += 1
    share = max(1, math.floor(ratio)) if ratio > 1 else 1
    free = {node: sum(1 for cpu in cpus if load[cpu] < share) for node, cpus in topology.nodes.items()}
    rank = {node: i for i, node in enumerate(_node_order(topology, gpu_nodes, free))}
    node_of = {cpu: node for node, cpus in topology.nodes.items() for cpu in cpus}
    # Within room (a CPU below its share), nodes in order and the least loaded first; past room, the
    # least loaded anywhere, still nearest first.
    ordered = sorted(all_cpus, key=lambda cpu: (load[cpu] >= share, rank[node_of[cpu]], load[cpu], cpu))
    chosen = tuple(sorted(ordered[:want]))
    nodes = tuple(sorted({node_of[cpu] for cpu in chosen}))
    known_gpu_nodes = gpu_nodes & set(topology.nodes)
    return Placement(
        cpus=chosen,
        numa_nodes=nodes,
        gpu_local=not known_gpu_nodes or set(nodes) <= known_gpu_nodes,
        exclusive=all(load[cpu] < share for cpu in chosen),
    )


@dataclass(frozen=True)
class Limits:
    """The cgroup v2 files of one reservation, as `file → value` (only those it books)."""

    values: Mapping[str, str]

    def controllers(self) -> set[str]:
        return {name.split(".", 1)[0] for name in self.values}


def limits_for(placement: Placement | None, resources: Mapping[str, int], *, ratio: float) -> Limits:
    """cpuset, cpu, memory and hugetlb values for a holding's booked scalars and its placement."""
    values: dict[str, str] = {}
    if placement is not None and placement.cpus:
        values["cpuset.cpus"] = cpulist_format(placement.cpus)
        values["cpuset.mems"] = cpulist_format(placement.numa_nodes)
        vcpu = int(resources.get("vcpu", len(placement.cpus)))
        if ratio > 1:
            values["cpu.weight"] = str(max(1, min(10_000, vcpu)))
            quota = max(1000, int(vcpu / ratio * CPU_PERIOD_US))
            values["cpu.max"] = f"{quota} {CPU_PERIOD_US}"
    memory = int(resources.get("memoryGiB", 0))
    if memory > 0:
        values["memory.max"] = str(memory * GIB)
    hugepages = int(resources.get("hugepages1Gi", 0))
    if hugepages > 0:
        values["hugetlb.1GB.max"] = str(hugepages * GIB)
    return Limits(values=values)
