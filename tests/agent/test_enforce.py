"""The node's cgroups over a stand-in cgroup v2 root: what each reservation gets, and its end enforced.

The agent runs in-process on a shipped snapshot (the two-socket H100 host), with
its store and a temporary directory laid out like a cgroup v2 root; the changes
are applied as the service delivers them. The real kernel's cgroups are
`test_cgroups_kernel.py`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from better_compute_agent import cli
from better_compute_agent.config import AgentSettings
from better_compute_agent.cpuplan import cpulist_parse, topology_from
from better_compute_agent.daemon import Agent, now_ms
from better_compute_agent.discovery.snapshot import SnapshotSource
from tests.support.agents import H100, cgroup_stand_in

GIB = 1 << 30
HOUR_MS = 3600 * 1000
GPUS = [gpu["uuid"] for gpu in json.loads(H100.read_text())["gpus"]]


def deaf_to_sigterm() -> subprocess.Popen[bytes]:
    """A process that ignores SIGTERM, returned once it does: a signal sent before its shell had
    set the trap would end it, and a loaded machine can be that slow to start a shell."""
    process = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"], stdout=subprocess.PIPE
    )
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    return process


def settings(tmp_path: Path, **overrides: Any) -> AgentSettings:
    values: dict[str, Any] = {
        "url": "http://127.0.0.1:9",
        "token": None,
        "pool": None,
        "state_dir": tmp_path / "state",
        "cdi_dir": tmp_path / "cdi",
        "snapshot": H100,
        "heartbeat_seconds": 30.0,
        "labels": {},
        "cgroup_root": tmp_path / "cgroup",
        "kill_grace": 30.0,
    }
    return AgentSettings(**(values | overrides))


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    cgroup_stand_in(tmp_path / "cgroup")
    made = Agent(settings(tmp_path), SnapshotSource(H100))
    made.read_host()
    made.enforcement()
    try:
        yield made
    finally:
        made.close()


_delivery = iter(range(1, 10_000))


def assign(agent: Agent, rid: str, atoms: list[str], *, start: int, end: int, **extra: Any) -> dict[str, Any]:
    change = {
        "deliveryId": next(_delivery) + agent.store.last_delivery_id(),
        "kind": "assign",
        "reservationId": rid,
        "start": start,
        "end": end,
        "atoms": atoms,
        "resources": extra.pop("resources", {}),
        "profile": None,
        "ratios": extra.pop("ratios", {}),
        **extra,
    }
    answer = agent.store.apply(change, capacity=agent.capacity(change), place=agent.place)
    assert answer.accepted, answer.reason
    agent.enforce()
    return answer.placement or {}


def shorten(agent: Agent, rid: str, end: int) -> None:
    change = {
        "deliveryId": agent.store.last_delivery_id() + 1,
        "kind": "shorten",
        "reservationId": rid,
        "end": end,
    }
    assert agent.store.apply(change, capacity={}).accepted
    agent.enforce()


def files(directory: Path) -> dict[str, str]:
    return {
        p.name: p.read_text().strip() for p in directory.iterdir() if p.is_file() and p.name != "cgroup.procs"
    }


def test_two_reservations_get_disjoint_cpus_near_their_gpus_and_their_booked_limits(agent: Agent) -> None:
    now = now_ms()
    booked = {"vcpu": 32, "memoryGiB": 256, "hugepages1Gi": 16}
    first = assign(agent, "rsv_a", GPUS[0:2], start=now, end=now + HOUR_MS, resources=booked)
    second = assign(agent, "rsv_b", GPUS[2:4], start=now, end=now + HOUR_MS, resources=booked)
    root = agent.settings.cgroup_root
    assert root is not None
    node0 = set(topology_from(json.loads(H100.read_text())).nodes[0])
    sets = []
    for rid, placement in (("rsv_a", first), ("rsv_b", second)):
        written = files(root / rid)
        cpus = set(cpulist_parse(written["cpuset.cpus"]))
        assert len(cpus) == 32 and cpus <= node0 and sorted(cpus) == placement["cpus"]
        assert written["cpuset.mems"] == "0" and placement["gpuLocal"] is True
        assert written["memory.max"] == str(256 * GIB)
        assert written["hugetlb.1GB.max"] == str(16 * GIB)
        assert "cpu.max" not in written  # ratio 1: the set is the limit
        sets.append(cpus)
    assert not sets[0] & sets[1]
    # The controllers were enabled for the reservations below the root.
    assert set((root / "cgroup.subtree_control").read_text().split()) == {
        "cpuset",
        "cpu",
        "memory",
        "hugetlb",
    }
    shorten(agent, "rsv_a", now_ms())
    assert not (root / "rsv_a").exists() and (root / "rsv_b").exists()
    shorten(agent, "rsv_b", now_ms())
    assert not (root / "rsv_b").exists() and agent.store.endings() == {}


def test_under_overcommit_the_cgroup_shares_time_by_weight_and_the_fair_share(agent: Agent) -> None:
    now = now_ms()
    assign(
        agent, "rsv_o", GPUS[4:5], start=now, end=now + HOUR_MS, resources={"vcpu": 24}, ratios={"vcpu": 2.0}
    )
    root = agent.settings.cgroup_root
    assert root is not None
    written = files(root / "rsv_o")
    assert written["cpu.weight"] == "24" and written["cpu.max"] == "1200000 100000"
    assert written["cpuset.mems"] == "1"


def test_a_future_booking_gets_its_cgroup_at_its_start_and_one_without_scalars_gets_one_too(
    agent: Agent,
) -> None:
    root = agent.settings.cgroup_root
    assert root is not None
    start = now_ms() + 400
    placement = assign(agent, "rsv_later", GPUS[6:7], start=start, end=start + HOUR_MS)
    assert placement["cpus"] == [] and not (root / "rsv_later").exists()
    time.sleep(max(0, start - now_ms()) / 1000 + 0.05)
    agent.enforce()
    assert (root / "rsv_later").is_dir()
    assert files(root / "rsv_later") == {}  # nothing booked to limit, but its end can be enforced


def test_the_end_sends_sigterm_then_sigkill_after_the_grace(tmp_path: Path) -> None:
    cgroup_stand_in(tmp_path / "cgroup")
    agent = Agent(settings(tmp_path, kill_grace=0.5), SnapshotSource(H100))
    agent.read_host()
    agent.enforcement()
    now = now_ms()
    assign(agent, "rsv_t", GPUS[0:1], start=now, end=now + HOUR_MS)
    polite = subprocess.Popen(["sleep", "600"])
    stubborn = deaf_to_sigterm()
    try:
        for pid in (polite.pid, stubborn.pid):
            agent.enforcer.cgroups.add("rsv_t", pid)  # type: ignore[union-attr]
        shorten(agent, "rsv_t", now_ms())
        assert polite.wait(timeout=5) == -signal.SIGTERM
        assert stubborn.poll() is None  # it ignores SIGTERM: the grace runs
        ending = agent.store.endings()["rsv_t"]
        assert ending.kill_ms - ending.term_ms <= 500
        time.sleep(0.6)
        agent.enforce()
        assert stubborn.wait(timeout=5) == -signal.SIGKILL
        assert not (tmp_path / "cgroup" / "rsv_t").exists()
    finally:
        for process in (polite, stubborn):
            process.kill()
            process.wait()
        agent.close()


def test_a_restarted_agent_takes_the_cgroups_back_and_kills_on_the_same_deadline(tmp_path: Path) -> None:
    cgroup_stand_in(tmp_path / "cgroup")
    first = Agent(settings(tmp_path, kill_grace=1.0), SnapshotSource(H100))
    first.read_host()
    first.enforcement()
    now = now_ms()
    assign(first, "rsv_r", GPUS[0:1], start=now, end=now + HOUR_MS)
    stubborn = deaf_to_sigterm()
    try:
        first.enforcer.cgroups.add("rsv_r", stubborn.pid)  # type: ignore[union-attr]
        shorten(first, "rsv_r", now_ms())
        deadline = first.store.endings()["rsv_r"].kill_ms
        first.close()  # the agent stops mid-grace; its workload runs on
        assert stubborn.poll() is None
        second = Agent(settings(tmp_path, kill_grace=30.0), SnapshotSource(H100))
        second.read_host()
        second.enforcement()
        second.enforce()
        assert second.store.endings()["rsv_r"].kill_ms == deadline  # not a new 30 s grace
        time.sleep(max(0, deadline - now_ms()) / 1000 + 0.05)
        second.enforce()
        assert stubborn.wait(timeout=5) == -signal.SIGKILL
        assert not (tmp_path / "cgroup" / "rsv_r").exists()
        second.close()
    finally:
        stubborn.kill()
        stubborn.wait()


def test_a_spot_reservations_notice_is_written_to_its_notice_file(agent: Agent) -> None:
    now = now_ms()
    notice = {"givenAt": now, "endsAt": now + 120_000}
    assign(agent, "rsv_spot", GPUS[7:8], start=now, end=now + HOUR_MS, spot=True)
    path = agent.settings.state_dir / "notices" / "rsv_spot.json"
    assert not path.exists()
    change = {
        "deliveryId": agent.store.last_delivery_id() + 1,
        "kind": "shorten",
        "reservationId": "rsv_spot",
        "end": now + 120_000,
        "notice": notice,
    }
    assert agent.store.apply(change, capacity={}).accepted
    agent.enforce()
    written = json.loads(path.read_text())
    assert written["reservationId"] == "rsv_spot" and written["endsAt"].endswith("Z")
    shorten(agent, "rsv_spot", now_ms())
    assert not path.exists()


def test_a_missing_controller_is_named_and_the_rest_is_enforced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cgroup_stand_in(tmp_path / "cgroup", controllers="cpuset cpu pids")
    agent = Agent(settings(tmp_path), SnapshotSource(H100))
    agent.read_host()
    warnings = agent.enforcement().cgroups.prepare()
    root = tmp_path / "cgroup"
    assert warnings == [
        f"cannot enforce memory.max (the booked memory): the memory controller is not available in {root}",
        "cannot enforce hugetlb.1GB.max (the booked 1 GiB huge pages):"
        f" the hugetlb controller is not available in {root}",
    ]
    now = now_ms()
    assign(agent, "rsv_m", GPUS[0:1], start=now, end=now + HOUR_MS, resources={"vcpu": 4, "memoryGiB": 8})
    written = files(tmp_path / "cgroup" / "rsv_m")
    assert "cpuset.cpus" in written and "memory.max" not in written
    agent.close()


def run_cli(*args: str) -> tuple[int, str]:
    result = subprocess.run(
        [cli.sys.executable, "-m", "better_compute_agent", *args], capture_output=True, text=True, timeout=60
    )
    return result.returncode, result.stdout + result.stderr


def test_a_directory_without_cgroup_controllers_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    code, out = run_cli(
        "--snapshot",
        str(H100),
        "--state-dir",
        str(tmp_path),
        "--token",
        "t",
        "--pool",
        "p",
        "--cgroup-root",
        str(tmp_path / "v1"),
        "once",
    )
    assert code == 4 and out.count("\n") == 1 and "cgroup v1 hosts are not supported" in out


def test_exec_refuses_what_it_must_with_its_own_exit_status(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = now_ms()
    assign(agent, "rsv_soon", GPUS[0:1], start=now + HOUR_MS, end=now + 2 * HOUR_MS)
    assign(agent, "rsv_over", GPUS[1:2], start=now, end=now + HOUR_MS)
    shorten(agent, "rsv_over", now_ms())
    flags = [
        "--snapshot",
        str(H100),
        "--state-dir",
        str(agent.settings.state_dir),
        "--cgroup-root",
        str(agent.settings.cgroup_root),
    ]
    for rid, status, says in (
        ("rsv_nope", 5, "not held on this node"),
        ("rsv_soon", 6, "starts at"),
        ("rsv_over", 6, "ended at"),
    ):
        code, out = run_cli(*flags, "exec", rid, "--", "true")
        assert (code, out.count("\n")) == (status, 1) and says in out, out
    # Not root: the check is the process's effective uid, stood in for here (the tests run as root).
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    assert cli.main([*flags, "exec", "rsv_soon", "--", "true"]) == 7


def test_exec_runs_the_command_in_the_cgroup_with_its_gpus(agent: Agent) -> None:
    now = now_ms()
    assign(agent, "rsv_run", GPUS[2:4], start=now, end=now + HOUR_MS, resources={"vcpu": 4})
    root = agent.settings.cgroup_root
    assert root is not None
    code, out = run_cli(
        "--snapshot",
        str(H100),
        "--state-dir",
        str(agent.settings.state_dir),
        "--cgroup-root",
        str(root),
        "exec",
        "rsv_run",
        "--",
        "sh",
        "-c",
        'echo "$$ $CUDA_VISIBLE_DEVICES $BETTER_COMPUTE_RESERVATION_ID"',
    )
    assert code == 0, out
    pid, visible, rid = out.split()
    assert visible == ",".join(GPUS[2:4]) and rid == "rsv_run"
    assert pid in (root / "rsv_run" / "cgroup.procs").read_text().split()


def test_processes_that_survive_the_kill_hold_their_gpu_back_until_they_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cgroup_stand_in(tmp_path / "cgroup")
    agent = Agent(settings(tmp_path, kill_grace=0), SnapshotSource(H100))
    agent.read_host()
    enforcer = agent.enforcement()
    # A process stuck in the kernel takes no signal: stood in for by a kill that reaches nothing.
    monkeypatch.setattr(enforcer.cgroups, "kill", lambda rid: None)
    monkeypatch.setattr("better_compute_agent.enforce.KILL_WAIT_SECONDS", 0.1)
    now = now_ms()
    assign(agent, "rsv_stuck", GPUS[3:4], start=now, end=now + HOUR_MS)
    stuck = deaf_to_sigterm()
    try:
        enforcer.cgroups.add("rsv_stuck", stuck.pid)
        shorten(agent, "rsv_stuck", now_ms())
        time.sleep(0.7)  # the pass waits up to half a second for the cgroup to empty
        agent.enforce()
        reason = f"processes of ended reservation rsv_stuck survive the kill (pid {stuck.pid}, sh)"
        gpu = next(g for g in agent.report["gpus"] if g["uuid"] == GPUS[3])
        assert gpu["health"] == {"healthy": False, "reason": reason, "clears": True}
        assert (tmp_path / "cgroup" / "rsv_stuck").exists()
        stuck.kill()
        stuck.wait()
        agent.enforce()  # the cgroup empties and goes, and with it the hold
        assert not (tmp_path / "cgroup" / "rsv_stuck").exists()
        assert "health" not in next(g for g in agent.report["gpus"] if g["uuid"] == GPUS[3])
    finally:
        stuck.kill()
        stuck.wait()
        agent.close()
