"""The reservations' cgroups in the real kernel: membership and the kill, where root can make cgroups.

The machines here have the hybrid layout: root can make cgroups in the v2
hierarchy (systemd's `unified` mount), with no controllers enabled below it. So
membership and the kill are real, and the agent must say that it cannot pin
CPUs or memory. Skipped, with the reason, where no cgroup v2 directory can be
made.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from better_compute_agent.cgroups import Cgroups, cgroup2_mount
from better_compute_agent.daemon import Agent, now_ms
from better_compute_agent.discovery.snapshot import SnapshotSource
from tests.agent.test_enforce import GPUS, HOUR_MS, assign, settings, shorten
from tests.support.agents import H100
from tests.support.paths import ROOT


def _kernel_root() -> Path | str:
    """A fresh cgroup under the v2 mount, or why there cannot be one."""
    if os.geteuid() != 0:
        return "making cgroups needs root"
    mount = cgroup2_mount()
    if mount is None:
        return "no cgroup2 filesystem is mounted"
    root = mount / f"better-compute-test-{secrets.token_hex(4)}"
    try:
        root.mkdir()
    except OSError as exc:
        return f"cannot make a cgroup under {mount}: {exc.strerror}"
    return root


@pytest.fixture
def kernel_root() -> Iterator[Path]:
    root = _kernel_root()
    if isinstance(root, str):
        # CI (root, cgroup v2) sets REQUIRE_CGROUPS=1, so there these tests can never silently not
        # run; elsewhere (not root, cgroup v1, a container without a delegated hierarchy) they skip.
        message = f"needs a cgroup v2 hierarchy root can write: {root}"
        if os.environ.get("REQUIRE_CGROUPS") == "1":
            pytest.fail(f"REQUIRE_CGROUPS=1 but {message}")
        pytest.skip(message)
    try:
        yield root
    finally:
        for child in sorted(root.glob("*/"), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                (child / "cgroup.kill").write_text("1")
            for _ in range(100):
                with contextlib.suppress(OSError):
                    child.rmdir()
                    break
                time.sleep(0.01)
        root.rmdir()


def kernel_agent(tmp_path: Path, root: Path, *, grace: float) -> Agent:
    agent = Agent(settings(tmp_path, cgroup_root=root, kill_grace=grace), SnapshotSource(H100))
    agent.read_host()
    agent.enforcement()
    return agent


def exec_in(tmp_path: Path, root: Path, rid: str, *command: str) -> subprocess.Popen[bytes]:
    flags = ["--snapshot", str(H100), "--state-dir", str(tmp_path / "state"), "--cgroup-root", str(root)]
    return subprocess.Popen(
        [sys.executable, "-m", "better_compute_agent", *flags, "exec", rid, "--", *command], cwd=ROOT
    )


def in_cgroup(pid: int) -> str:
    return next(
        line[3:] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if line.startswith("0::")
    )


def wait_gone(process: subprocess.Popen[bytes], agent: Agent, seconds: float) -> float:
    """Run the agent's passes until the process exits; how long it took."""
    started = time.monotonic()
    while process.poll() is None:
        assert time.monotonic() - started < seconds, f"still running after {seconds} s"
        agent.enforce()
        time.sleep(0.05)
    return time.monotonic() - started


def test_the_agent_says_what_it_cannot_enforce_without_controllers(kernel_root: Path) -> None:
    cgroups = Cgroups(kernel_root)
    assert cgroups.real
    warnings = " ".join(cgroups.prepare())
    for controller in sorted({"cpuset", "memory"} - cgroups.available):
        assert f"the {controller} controller is not available in {kernel_root}" in warnings


def test_exec_runs_in_the_cgroup_and_a_release_ends_it_within_the_grace(
    tmp_path: Path, kernel_root: Path
) -> None:
    agent = kernel_agent(tmp_path, kernel_root, grace=1.0)
    now = now_ms()
    assign(agent, "rsv_k1", GPUS[0:1], start=now, end=now + HOUR_MS, resources={"vcpu": 2})
    process = exec_in(tmp_path, kernel_root, "rsv_k1", "sleep", "600")
    try:
        mount = cgroup2_mount()
        assert mount is not None
        expected = "/" + str((kernel_root / "rsv_k1").relative_to(mount))
        deadline = time.monotonic() + 10
        while in_cgroup(process.pid) != expected:  # the exec moves itself, then becomes sleep
            assert time.monotonic() < deadline, in_cgroup(process.pid)
            time.sleep(0.02)
        assert agent.enforcer is not None and process.pid in agent.enforcer.cgroups.members("rsv_k1")
        shorten(agent, "rsv_k1", now_ms())
        wait_gone(process, agent, seconds=1.0 + 2)
        wait_gone(process, agent, seconds=1)
        agent.enforce()
        assert not (kernel_root / "rsv_k1").exists()
    finally:
        process.kill()
        process.wait()
        agent.close()


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path, kernel_root: Path) -> None:
    agent = kernel_agent(tmp_path, kernel_root, grace=1.0)
    now = now_ms()
    assign(agent, "rsv_k2", GPUS[1:2], start=now, end=now + HOUR_MS)
    process = exec_in(
        tmp_path, kernel_root, "rsv_k2", "sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"
    )
    try:
        deadline = time.monotonic() + 10
        while agent.enforcer is not None and not agent.enforcer.cgroups.members("rsv_k2"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.2)  # past the exec: the shell has set its trap
        ended = time.monotonic()
        shorten(agent, "rsv_k2", now_ms())
        time.sleep(0.5)
        agent.enforce()
        assert process.poll() is None  # SIGTERM ignored, the grace not over
        wait_gone(process, agent, seconds=1.0 + 2)
        assert time.monotonic() - ended >= 1.0
        assert process.returncode == -9
        agent.enforce()
        assert not (kernel_root / "rsv_k2").exists()
    finally:
        process.kill()
        process.wait()
        agent.close()
