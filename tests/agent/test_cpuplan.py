"""The CPU choice over snapshot topologies: near the GPUs first, exclusive at ratio 1, shared above it."""

from __future__ import annotations

import json

from better_compute_agent.cpuplan import (
    cpulist_format,
    cpulist_parse,
    cpus_choose,
    limits_for,
    topology_from,
)
from tests.support.paths import ROOT

SNAPSHOTS = ROOT / "better_compute_agent" / "snapshots"
# A two-socket 8-GPU host: GPUs 0-3 on NUMA node 0, 4-7 on node 1, 224 CPUs.
H100 = json.loads((SNAPSHOTS / "h100-8gpu-sriov.json").read_text())
TOPOLOGY = topology_from(H100)
NODE0, NODE1 = set(TOPOLOGY.nodes[0]), set(TOPOLOGY.nodes[1])


def test_the_shipped_topology_is_two_nodes_with_the_gpus_split_between_them() -> None:
    assert [gpu["numaNode"] for gpu in H100["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(NODE0) == len(NODE1) == 112 and not NODE0 & NODE1


def test_cpulists_read_and_write_as_the_kernel_does() -> None:
    assert cpulist_parse("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert cpulist_format([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert cpulist_format([]) == ""


def test_the_cpus_come_from_the_gpus_numa_node() -> None:
    on_gpu5 = cpus_choose(TOPOLOGY, want=16, gpu_nodes=[1], ratio=1.0, taken=[])
    assert len(on_gpu5.cpus) == 16 and set(on_gpu5.cpus) <= NODE1
    assert on_gpu5.numa_nodes == (1,) and on_gpu5.gpu_local and on_gpu5.exclusive


def test_at_ratio_1_no_cpu_is_in_two_overlapping_sets() -> None:
    first = cpus_choose(TOPOLOGY, want=64, gpu_nodes=[0], ratio=1.0, taken=[])
    second = cpus_choose(TOPOLOGY, want=48, gpu_nodes=[0], ratio=1.0, taken=[first.cpus])
    assert not set(first.cpus) & set(second.cpus)
    assert set(first.cpus) | set(second.cpus) == NODE0  # both local: 64 + 48 = node 0's 112
    assert second.gpu_local


def test_when_the_local_node_is_full_the_nearest_other_gives_the_rest_and_says_so() -> None:
    full = cpus_choose(TOPOLOGY, want=112, gpu_nodes=[0], ratio=1.0, taken=[])
    spill = cpus_choose(TOPOLOGY, want=8, gpu_nodes=[0], ratio=1.0, taken=[full.cpus])
    assert set(spill.cpus) <= NODE1 and spill.numa_nodes == (1,)
    assert not spill.gpu_local and spill.exclusive


def test_a_reservation_larger_than_its_node_spans_two_and_is_not_local() -> None:
    wide = cpus_choose(TOPOLOGY, want=128, gpu_nodes=[1], ratio=1.0, taken=[])
    assert set(wide.cpus) >= NODE1 and wide.numa_nodes == (0, 1) and not wide.gpu_local


def test_with_overcommit_the_sets_share_cpus_evenly_and_stay_local() -> None:
    taken = [cpus_choose(TOPOLOGY, want=112, gpu_nodes=[0], ratio=2.0, taken=[])]
    shared = cpus_choose(TOPOLOGY, want=16, gpu_nodes=[0], ratio=2.0, taken=[c.cpus for c in taken])
    assert set(shared.cpus) <= NODE0 and shared.gpu_local and shared.exclusive
    assert set(shared.cpus) & set(taken[0].cpus)  # shared, as the ratio allows
    # A third set on those CPUs would pass the ratio's two per CPU: it goes to the other node.
    third = cpus_choose(TOPOLOGY, want=16, gpu_nodes=[0], ratio=2.0, taken=[taken[0].cpus, NODE0])
    assert set(third.cpus) <= NODE1 and not third.gpu_local


def test_without_gpus_the_set_is_packed_on_the_freest_node() -> None:
    busy = cpus_choose(TOPOLOGY, want=100, gpu_nodes=[0], ratio=1.0, taken=[])
    plain = cpus_choose(TOPOLOGY, want=20, gpu_nodes=[], ratio=1.0, taken=[busy.cpus])
    assert set(plain.cpus) <= NODE1 and plain.numa_nodes == (1,) and plain.gpu_local


def test_a_snapshot_without_numa_is_one_node_of_every_cpu() -> None:
    flat = topology_from({"host": {"vcpu": 8}})
    placement = cpus_choose(flat, want=4, gpu_nodes=[3], ratio=1.0, taken=[])
    assert placement.cpus == (0, 1, 2, 3) and placement.numa_nodes == (0,) and placement.gpu_local


def test_the_limits_are_the_booked_scalars_and_the_fair_share_under_overcommit() -> None:
    placement = cpus_choose(TOPOLOGY, want=16, gpu_nodes=[1], ratio=1.0, taken=[])
    exact = limits_for(placement, {"vcpu": 16, "memoryGiB": 64, "hugepages1Gi": 4}, ratio=1.0).values
    assert exact == {
        "cpuset.cpus": cpulist_format(placement.cpus),
        "cpuset.mems": "1",
        "memory.max": str(64 << 30),
        "hugetlb.1GB.max": str(4 << 30),
    }
    shared = limits_for(placement, {"vcpu": 16}, ratio=2.0).values
    assert shared["cpu.weight"] == "16" and shared["cpu.max"] == "800000 100000"  # 16 / 2 CPUs of time
    assert limits_for(None, {}, ratio=1.0).values == {}
