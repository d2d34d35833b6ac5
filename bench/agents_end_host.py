"""The node side of `bench.agents_end`: the cgroup root, the agent daemon and the workloads in it."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rich.console import Console

from bench.database import BASE_DIR
from better_compute_agent.cgroups import cgroup2_mount

SNAPSHOT = BASE_DIR / "better_compute_agent" / "snapshots" / "h100-8gpu-sriov.json"
# How long a workload may take to be in its cgroup before the run is called failed (not timed against).
STARTED_S = 10.0
LOOK_S = 0.002
T = TypeVar("T")
console = Console(stderr=True, width=None if sys.stderr.isatty() else 130)


class BenchError(Exception):
    """A step did not happen in time; the message says which, with the agent's last lines."""


@dataclass
class Root:
    """Where the reservations' cgroups go: a fresh kernel cgroup, or a stand-in directory."""

    path: Path
    real: bool
    why: str

    def remove(self) -> None:
        """Kill what is left in the reservations' cgroups and remove them, then the root itself."""
        if not self.path.exists():
            return
        if not self.real:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for child in sorted((p for p in self.path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _cgroup_empty(child)
            with contextlib.suppress(OSError):
                child.rmdir()
        _cgroup_empty(self.path)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _cgroup_empty(path: Path) -> None:
    """SIGKILL everything in a kernel cgroup and wait (briefly) for the kernel to reap it."""
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if not (path / "cgroup.procs").read_text().split():
                return
        except OSError:
            return
        time.sleep(0.01)


def _root_make(scratch: Path) -> Root:
    """A fresh cgroup under the bench's own in the v2 hierarchy when root may make one, else a stand-in."""
    mount = cgroup2_mount()
    if mount is None:
        why = "no cgroup2 filesystem is mounted"
    elif os.geteuid() != 0:
        why = "not root"
    else:
        own = ""
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                if line.startswith("0::"):
                    own = line[3:].strip()
        path = mount / own.lstrip("/") / f"bench-agents-end-{os.getpid()}"
        try:
            path.mkdir()
            return Root(path=path, real=True, why=f"the kernel's cgroup v2 ({mount})")
        except OSError as exc:
            why = f"cannot make a cgroup in {path.parent}: {exc.strerror}"
    path = scratch / "cgroup"
    path.mkdir()
    (path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (path / "cgroup.subtree_control").write_text("")
    (path / "cgroup.procs").write_text("")
    return Root(
        path=path, real=False, why=f"a stand-in directory ({why}): the kill is the agent's, one by one"
    )


# --- the agent ----------------------------------------------------------------------------------


class AgentDaemon:
    """One `better-compute-agent … run` for the bench's host, and the argv its `exec` takes."""

    def __init__(self, *, url: str, token: str, pool: str, directory: Path, cgroup_root: Path) -> None:
        self.directory, self.cgroup_root = directory, cgroup_root
        self.log_path = directory / "agent.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("BETTER_COMPUTE", "DATABASE_URL"))}
        self.env = base | {
            "BETTER_COMPUTE_URL": url,
            "BETTER_COMPUTE_TOKEN": token,
            "BETTER_COMPUTE_POOL": pool,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self, *command: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "better_compute_agent",
            "--snapshot",
            str(SNAPSHOT),
            "--state-dir",
            str(self.directory / "state"),
            "--cdi-dir",
            str(self.directory / "cdi"),
            "--cgroup-root",
            str(self.cgroup_root),
            "--kill-grace",
            "0",
            *command,
        ]

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                self.argv("run"), cwd=BASE_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no agent log)"

    def alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise BenchError(f"the agent exited\n{self.tail()}")


def _wait(probe: Callable[[], T], *, seconds: float, what: str, agent: AgentDaemon) -> T:
    """The first truthy value of `probe` within `seconds` (the agent still running), else BenchError."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        agent.alive()
        if time.monotonic() >= deadline:
            raise BenchError(f"not within {seconds:.0f} s: {what}\n{agent.tail()}")
        time.sleep(LOOK_S)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _members(path: Path) -> list[int]:
    try:
        return [int(word) for word in (path / "cgroup.procs").read_text().split() if word.isdigit()]
    except OSError:
        return []


# --- one booking --------------------------------------------------------------------------------


class Workload:
    """`sleep 600` inside the reservation's cgroup, and when it exited (its pidfd turned readable)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.exited: float | None = None
        self._fd = os.pidfd_open(process.pid)
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        select.select([self._fd], [], [])
        self.exited = time.monotonic()

    def wait(self, seconds: float) -> float | None:
        """When it exited, within `seconds`; then reaped, so no zombie is left."""
        self._watcher.join(seconds)
        if self.exited is not None:
            self.process.wait()
            os.close(self._fd)
        return self.exited

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _workload(*, agent: AgentDaemon, root: Root, reservation_id: str) -> Workload:
    """The workload started in the reservation's cgroup, once it is `sleep` and a member there."""
    cgroup = root.path / reservation_id
    if os.geteuid() == 0:
        argv = agent.argv("exec", reservation_id, "--", "sleep", "600")
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            argv, cwd=BASE_DIR, env=agent.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    else:
        # `exec` needs root; on a stand-in its whole work is the line it appends to cgroup.procs.
        process = subprocess.Popen(["sleep", "600"], stderr=subprocess.PIPE)  # noqa: S607
        with (cgroup / "cgroup.procs").open("a") as handle:
            handle.write(f"{process.pid}\n")
    workload = Workload(process)

    def started() -> bool:
        if process.poll() is not None:
            err = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise BenchError(f"exec {reservation_id} exited {process.returncode}: {err.strip()}")
        return _comm(process.pid) == "sleep" and process.pid in _members(cgroup)

    try:
        _wait(started, seconds=STARTED_S, what=f"sleep running in {cgroup}", agent=agent)
    except BaseException:
        workload.kill()
        raise
    return workload


def _kill_all(workloads: list[Workload]) -> None:
    for workload in workloads:
        workload.kill()
