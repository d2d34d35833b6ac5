"""The reservations' cgroups: one directory per live reservation under the agent's cgroup v2 root.

The root is the agent's own delegated subtree (the systemd unit has
`Delegate=yes`, as Slurm's `slurmd` has), or `--cgroup-root DIR`. cgroup v2
lets only leaves hold processes, so when the root is the agent's own cgroup
the agent first moves itself into `ROOT/agent`, then enables the controllers
it needs in `ROOT/cgroup.subtree_control` for the reservations below.

A directory that is not a cgroupfs but is laid out like a v2 root (a
`cgroup.controllers` file naming the controllers, and `cgroup.subtree_control`)
is accepted too: tests point the root at one, and the files then hold what the
kernel would have been told. Processes are members of a cgroup by its
`cgroup.procs`, which the kernel keeps on a real root and the agent writes on
such a directory.

Where a controller is missing (the hybrid layout's unified mount has none),
the agent says which limits it cannot enforce and keeps the rest: membership,
and so the end of the booking, is enforced with no controller at all.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from better_compute_agent.cpuplan import Limits

logger = logging.getLogger("better_compute_agent")

WANTED = ("cpuset", "cpu", "memory", "hugetlb")
# What each controller enforces, for the line that says what cannot be.
ENFORCES = {
    "cpuset": "cpuset.cpus and cpuset.mems (the CPUs and NUMA nodes)",
    "cpu": "cpu.weight and cpu.max (the CPU time under overcommit)",
    "memory": "memory.max (the booked memory)",
    "hugetlb": "hugetlb.1GB.max (the booked 1 GiB huge pages)",
}
AGENT_LEAF = "agent"
CGROUP2_MAGIC = "cgroup2"


class CgroupError(Exception):
    """The cgroups cannot be used at all; the message is one line for the operator."""


def _mounts(mountinfo: Path) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount, from /proc/self/mountinfo."""
    out: list[tuple[str, str]] = []
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) >= 5 and right:
            out.append((fields[4].replace("\\040", " "), right.split()[0]))
    return out


def cgroup2_mount(proc: Path = Path("/proc")) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `…/unified` on hybrid hosts)."""
    points = [Path(point) for point, kind in _mounts(proc / "self" / "mountinfo") if kind == CGROUP2_MAGIC]
    return min(points, key=lambda p: len(p.parts)) if points else None


def is_cgroupfs(path: Path, proc: Path = Path("/proc")) -> bool:
    """Whether `path` lies on a cgroup2 filesystem (the longest mount point above it is one)."""
    resolved = str(Path(path).resolve())
    best, kind_of_best = "", ""
    for point, kind in _mounts(proc / "self" / "mountinfo"):
        if (resolved == point or resolved.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, kind_of_best = point, kind
    return kind_of_best == CGROUP2_MAGIC


def default_root(proc: Path = Path("/proc")) -> Path:
    """The agent's own cgroup in the v2 hierarchy: its delegated subtree under systemd."""
    mount = cgroup2_mount(proc)
    if mount is None:
        raise CgroupError(
            "cgroup v2 is required: this host has no cgroup2 filesystem mounted (cgroup v1 only);"
            " boot with systemd.unified_cgroup_hierarchy=1, or pass --cgroup-root"
        )
    own = ""
    with contextlib.suppress(OSError):
        for line in (proc / "self" / "cgroup").read_text().splitlines():
            if line.startswith("0::"):
                own = line[3:].strip()
    path = mount / own.lstrip("/")
    # Started inside the agent's own leaf (a restart under the same unit): the root is its parent.
    if path.name == AGENT_LEAF:
        path = path.parent
    if path == mount:
        raise CgroupError(
            f"the agent runs in the top cgroup of {mount}, which is not delegated to it: run it under its"
            " systemd unit (Delegate=yes, deploy/better-compute-agent.service) or pass --cgroup-root"
        )
    return path


class Cgroups:
    """The reservations' cgroups under one v2 root."""

    def __init__(self, root: Path, *, proc: Path = Path("/proc")) -> None:
        self.root = Path(root)
        self.proc = proc
        controllers_file = self.root / "cgroup.controllers"
        if not controllers_file.is_file():
            raise CgroupError(
                f"{self.root} is not a cgroup v2 directory (it has no cgroup.controllers):"
                " cgroup v1 hosts are not supported; pass --cgroup-root with a cgroup v2 directory"
            )
        self.real = is_cgroupfs(self.root, proc)
        offered = set(controllers_file.read_text().split())
        self.available = {name for name in WANTED if name in offered}
        self.warnings: list[str] = []

    # --- the root ---------------------------------------------------------------------------

    def prepare(self) -> list[str]:
        """Take the root for the reservations; the lines saying what cannot be enforced here."""
        if self.real and os.getpid() in self._pids(self.root, below=False):
            leaf = self.root / AGENT_LEAF
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
        enabled = set((self.root / "cgroup.subtree_control").read_text().split())
        for name in sorted(self.available - enabled):
            try:
                with open(self.root / "cgroup.subtree_control", "a" if not self.real else "w") as handle:
                    handle.write(f"+{name}\n" if self.real else f"{name}\n")
            except OSError as exc:
                logger.warning("cannot enable the %s controller in %s: %s", name, self.root, exc)
                self.available.discard(name)
        self.warnings = [
            f"cannot enforce {ENFORCES[name]}: the {name} controller is not available in {self.root}"
            for name in WANTED
            if name not in self.available
        ]
        for line in self.warnings:
            logger.warning("%s", line)
        return self.warnings

    # --- one reservation's cgroup -----------------------------------------------------------

    def path(self, reservation_id: str) -> Path:
        return self.root / reservation_id

    def names(self) -> list[str]:
        """The reservation cgroups present under the root (left by this agent or by one before it)."""
        try:
            entries = sorted(self.root.iterdir())
        except OSError:
            return []
        return [entry.name for entry in entries if entry.is_dir() and entry.name.startswith("rsv_")]

    def exists(self, reservation_id: str) -> bool:
        return self.path(reservation_id).is_dir()

    def create(self, reservation_id: str, limits: Limits) -> dict[str, str]:
        """Make the cgroup (or keep it) and write the limits its controllers allow; what was written."""
        path = self.path(reservation_id)
        path.mkdir(exist_ok=True)
        if not self.real:
            (path / "cgroup.procs").touch()
        written = {}
        for name, value in limits.values.items():
            if name.split(".", 1)[0] not in self.available:
                continue
            try:
                (path / name).write_text(value)
            except OSError as exc:
                logger.warning("%s: cannot write %s=%s: %s", reservation_id, name, value, exc)
                continue
            written[name] = value
        return written

    def add(self, reservation_id: str, pid: int) -> None:
        """Put `pid` in the reservation's cgroup (its children follow it)."""
        procs = self.path(reservation_id) / "cgroup.procs"
        if self.real:
            procs.write_text(str(pid))
        else:
            with open(procs, "a") as handle:
                handle.write(f"{pid}\n")

    def members(self, reservation_id: str) -> list[int]:
        """The processes in the reservation's cgroup now."""
        return self._pids(self.path(reservation_id))

    def _pids(self, directory: Path, *, below: bool = True) -> list[int]:
        """The processes of the cgroup and (a container runtime's `--cgroup-parent`) its children."""
        texts = []
        for current, children, _ in os.walk(directory) if below else [(str(directory), [], [])]:
            with contextlib.suppress(OSError):
                texts.append(Path(current, "cgroup.procs").read_text())
            if not self.real:
                children.clear()
        pids = dict.fromkeys(int(word) for text in texts for word in text.split() if word.isdigit())
        # A directory that only looks like a cgroup forgets nothing, and an exited process (a
        # zombie) takes no signal: keep the processes still running.
        return [pid for pid in pids if (self.proc / str(pid)).exists() and not _zombie(pid)]

    def signal(self, reservation_id: str, signum: int) -> int:
        """Send `signum` to every process of the cgroup; how many were sent it."""
        sent = 0
        for pid in self.members(reservation_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
                sent += 1
        return sent

    def kill(self, reservation_id: str) -> None:
        """SIGKILL everything in the cgroup: `cgroup.kill` where the kernel has it, else one by one."""
        kill_file = self.path(reservation_id) / "cgroup.kill"
        if self.real and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
                return
        self.signal(reservation_id, signal.SIGKILL)

    def remove(self, reservation_id: str) -> bool:
        """Remove the emptied cgroup; False while processes are still in it."""
        path = self.path(reservation_id)
        if not path.exists():
            return True
        if self.members(reservation_id):
            return False
        try:
            # Children first (a container runtime's), then the reservation's own directory.
            for current, _, files in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
                if not self.real:
                    for name in files:
                        Path(current, name).unlink()
                Path(current).rmdir()
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            raise
        return True

    def wait_empty(self, reservation_id: str, seconds: float) -> bool:
        """Wait up to `seconds` for the cgroup to empty (the kernel reaps after a kill); whether it did."""
        deadline = time.monotonic() + seconds
        while self.members(reservation_id):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def holder(self, pid: int) -> str | None:
        """The reservation whose cgroup `pid` is in, or None."""
        for name in self.names():
            if pid in self.members(name):
                return name
        return None


def _zombie(pid: int) -> bool:
    """A zombie has exited: only its parent's wait is left, and no signal reaches it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def pids_alive(pids: Iterable[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
