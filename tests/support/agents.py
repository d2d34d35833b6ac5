"""Real node agents as child processes (`python -m better_compute_agent … run`) against a live server.

Each agent reads its host from a snapshot file (a shipped one, or a copy that
`host_snapshot` makes another host of the same kind), keeps its store and CDI
spec in its own directory, and talks to the server with a node-agent token
scoped to its pool. `Agents.close` kills whatever is still running, so a
failing test leaves no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from better_compute_agent.cdi import KIND
from better_compute_agent.store import Holding, Store
from core.services import token_issue
from inventory.models import Pool
from tests.support.paths import ROOT

SNAPSHOTS = ROOT / "better_compute_agent" / "snapshots"
H100 = SNAPSHOTS / "h100-8gpu-sriov.json"
A100_MIG = SNAPSHOTS / "a100-mig.json"
L40S = SNAPSHOTS / "l40s-4gpu.json"

# How often the waits below look again, and how long a process is given to stop.
POLL_SECONDS = 0.05
STOP_SECONDS = 10.0

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], *, seconds: float, what: str | Callable[[], str]) -> T:
    """The first truthy value `probe` returns within `seconds`; AssertionError naming `what` when none.

    `what` may be a function, so that what it says (an agent's log) is read when the wait failed.
    """
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {seconds} s: {what() if callable(what) else what}")
        time.sleep(POLL_SECONDS)


def _another(uid: str, hostname: str) -> str:
    """The same kind of id (`GPU-…`, `MIG-…`), unique to `hostname`: the service keys GPUs by uuid."""
    prefix = uid.split("-", 1)[0]
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{hostname}/{uid}')}"


def host_snapshot(source: Path, directory: Path, *, hostname: str | None = None) -> Path:
    """A copy of snapshot `source` in `directory`, to edit; with `hostname`, a second host of its kind.

    The second host has its own hostname and its own GPU and MIG uuids (NIC VFs
    and disks are named after the hostname by the service already).
    """
    data = json.loads(source.read_text())
    if hostname is not None:
        data["hostname"] = hostname
        for gpu in data["gpus"]:
            gpu["uuid"] = _another(gpu["uuid"], hostname)
            for instance in (gpu.get("mig") or {}).get("instances") or []:
                if instance.get("uuid"):
                    instance["uuid"] = _another(instance["uuid"], hostname)
    path = directory / f"{data['hostname']}.json"
    write_snapshot(path, data)
    return path


def write_snapshot(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def cgroup_stand_in(path: Path, controllers: str = "cpuset cpu io memory hugetlb pids") -> Path:
    """A directory laid out like a cgroup v2 root, which the agent accepts as `--cgroup-root`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text("")
    (path / "cgroup.procs").write_text("")
    return path


class AgentProcess:
    """One host's agent: its snapshot, its directory (store, CDI spec, log) and its daemon, when running."""

    def __init__(self, *, snapshot: Path, directory: Path, env: dict[str, str]) -> None:
        self.snapshot, self.directory, self.env = snapshot, directory, env
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        cgroup_stand_in(self.cgroup_root)

    @property
    def cgroup_root(self) -> Path:
        return self.directory / "cgroup"

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    @property
    def cdi_dir(self) -> Path:
        return self.directory / "cdi"

    @property
    def log_path(self) -> Path:
        return self.directory / "agent.log"

    def argv(self, command: str, *, snapshot: Path | None = None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "better_compute_agent",
            "--snapshot",
            str(snapshot or self.snapshot),
            "--state-dir",
            str(self.state_dir),
            "--cdi-dir",
            str(self.cdi_dir),
            "--cgroup-root",
            str(self.cgroup_root),
            "--heartbeat-seconds",
            "1",
            command,
        ]

    def start(self) -> AgentProcess:
        """Start the daemon (`run`); its output goes to the log."""
        assert self.process is None or self.process.poll() is not None, "already running"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv("run"), cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum` to the daemon and wait for it to exit; its exit status."""
        assert self.process is not None, "not started"
        if self.process.poll() is None:
            self.process.send_signal(signum)
        return self.process.wait(STOP_SECONDS)

    def close(self) -> None:
        """Kill the daemon if it still runs (teardown)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_SECONDS)

    def once(self, *, snapshot: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`… once`: register, report, sync, write the CDI spec and exit (its status is the caller's)."""
        return subprocess.run(
            self.argv("once", snapshot=snapshot),
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def node_id(self, *, seconds: float = 15.0) -> str:
        """The node id the agent registered as (its `node.json`), once it has."""

        def registered() -> str | None:
            try:
                return str(json.loads((self.state_dir / "node.json").read_text())["nodeId"])
            except (OSError, ValueError, KeyError):
                return None

        return wait_for(
            registered, seconds=seconds, what=lambda: f"{self.snapshot.name} registered\n{self.log()}"
        )

    def cdi_devices(self) -> dict[str, dict[str, Any]]:
        """The devices of the agent's reservation CDI spec, by name (none when there is no spec)."""
        devices: dict[str, dict[str, Any]] = {}
        for path in sorted(self.cdi_dir.glob("*.json")):
            try:
                spec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # replaced meanwhile: the next look reads the new file
            if spec.get("kind") == KIND:
                devices.update({device["name"]: device for device in spec.get("devices", [])})
        return devices

    def holdings(self) -> dict[str, Holding]:
        """What the agent's store holds, by reservation id (read beside the daemon, as `assignments` does)."""
        if not (self.state_dir / "store.json").exists():
            return {}
        with Store(self.state_dir / "store.json") as store:
            return {holding.reservation_id: holding for holding in store.holdings()}


def visible_devices(device: dict[str, Any]) -> list[str]:
    """A CDI device's `NVIDIA_VISIBLE_DEVICES`, as a list of uuids."""
    for entry in device["containerEdits"]["env"]:
        name, _, value = entry.partition("=")
        if name == "NVIDIA_VISIBLE_DEVICES":
            return value.split(",") if value else []
    raise AssertionError(f"no NVIDIA_VISIBLE_DEVICES in {device}")


class Agents:
    """The agents a test starts against `url`; `close` kills those still running."""

    def __init__(self, *, url: str, root: Path) -> None:
        self.url, self.root = url, root
        self.started: list[AgentProcess] = []

    def env(self, pool: Pool) -> dict[str, str]:
        """The child's environment: this one without any agent setting, plus the pool's node-agent token."""
        _, token = token_issue(tenant_id=None, role="node-agent", scope_pool_id=pool.pk)
        base = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE")}
        return base | {
            "BETTER_COMPUTE_URL": self.url,
            "BETTER_COMPUTE_TOKEN": token,
            "BETTER_COMPUTE_POOL": pool.pk,
        }

    def make(self, pool: Pool, snapshot: Path) -> AgentProcess:
        """An agent for the host of `snapshot` in `pool`, not started."""
        directory = self.root / f"agent-{len(self.started)}-{snapshot.stem}"
        agent = AgentProcess(snapshot=snapshot, directory=directory, env=self.env(pool))
        self.started.append(agent)
        return agent

    def start(self, pool: Pool, snapshot: Path) -> AgentProcess:
        return self.make(pool, snapshot).start()

    def close(self) -> None:
        """Kill the agents still running, then let the server finish the requests they left in flight.

        A long poll outlives its agent by up to a heartbeat; ended here, it does not
        touch the database after the test has given it back.
        """
        for agent in self.started:
            agent.close()
        wait_for(
            lambda: not any(t.name.endswith("(process_request_thread)") for t in threading.enumerate()),
            seconds=STOP_SECONDS,
            what="the live server finished the agents' requests",
        )
