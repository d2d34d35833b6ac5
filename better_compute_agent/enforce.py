"""The node holds each workload to its booking: a cgroup from its start, and nothing left after its end.

`Enforcer.step` is run by the agent's loop at every pass and at every start
and end of a holding (the loop wakes at those instants), and by `exec`:

* **Start.** A live holding without a cgroup gets one under the root, with
  the CPUs chosen at its assignment (`cpuplan`) and the limits of its booked
  scalars. A future booking's cgroup is made at its start, not before.
* **End.** A cgroup whose holding is no longer live (its end came, or a
  release, a shorten or a lease expiry cut it) is ended the way Slurm ends a
  job at its time limit: SIGTERM to every process, then, `kill_grace` seconds
  after the end, SIGKILL (`cgroup.kill`) to what is left; the emptied cgroup
  is removed. The deadline is kept in the store, so an agent restarted
  meanwhile kills on the same one. Processes still there `KILL_WAIT_SECONDS`
  after the kill (stuck in the kernel) hold their GPUs back.
* **Notice.** A spot reservation's preemption notice is written as JSON to its
  notice file (`BETTER_COMPUTE_NOTICE_FILE` of `exec`) when it is delivered.
* **Stragglers** (`scan`): NVML's processes on each GPU. One in the cgroup of
  an ended reservation is being ended as above; one in no reservation's cgroup
  holds its GPU back (`in use outside any reservation (pid N, COMMAND)`), and
  the GPU is reported unhealthy until the process is gone.

A held-back GPU goes to the service in the node report as
`health: {"healthy": false, "reason", "clears": true}`: unhealthy, with an
audit event, and healthy again at the first report that no longer holds it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from better_compute_agent.cgroups import Cgroups
from better_compute_agent.cpuplan import Placement, Topology, cpus_choose, limits_for
from better_compute_agent.store import Holding, Store

logger = logging.getLogger("better_compute_agent")

DEFAULT_KILL_GRACE_SECONDS = 30.0
# After SIGKILL, how long the kernel may take before what is left counts as stuck.
KILL_WAIT_SECONDS = 5.0
# How long one pass waits for a killed cgroup to empty before it looks again at the next pass.
REAP_WAIT_SECONDS = 0.5


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def command_of(pid: int, proc: Path = Path("/proc")) -> str:
    """The process's command name (`/proc/PID/comm`), or `?` once it is gone."""
    try:
        return (proc / str(pid) / "comm").read_text().strip() or "?"
    except OSError:
        return "?"


class Enforcer:
    """What the node does with its holdings' cgroups; `gpu_of` maps an atom uid to its GPU's UUID."""

    def __init__(
        self,
        store: Store,
        cgroups: Cgroups,
        *,
        kill_grace: float,
        notices: Path,
        gpu_of: Callable[[str], str | None],
        processes: Callable[[], Mapping[str, list[int]]],
    ) -> None:
        self.store, self.cgroups = store, cgroups
        self.kill_grace_ms = int(kill_grace * 1000)
        self.notices = notices
        self.gpu_of = gpu_of
        self.processes = processes
        # GPU UUID → why it is held back; what the next report says.
        self.holds: dict[str, str] = {}
        self._survivors: dict[str, str] = {}

    # --- the passes -------------------------------------------------------------------------

    def step(self, now_ms: int) -> None:
        """Start what is live and has no cgroup, end what has one and is not live, write notices."""
        live = {h.reservation_id: h for h in self.store.holdings(at_ms=now_ms)}
        known = {h.reservation_id: h for h in self.store.holdings()}
        endings = self.store.endings()
        for name in self.cgroups.names():
            if name not in live:
                self._end(name, known.get(name), now_ms)
        for name in endings:
            # Gone, or live again (a redelivered assign gave its time back): nothing more to end.
            if not self.cgroups.exists(name) or name in live:
                self.store.ending_done(name)
        starting = [h for rid, h in live.items() if not self.cgroups.exists(rid)]
        if starting:
            self.scan()
        for holding in starting:
            self.start(holding)
        for holding in live.values():
            if holding.spot and holding.notice:
                self._notice(holding)

    def start(self, holding: Holding) -> dict[str, str]:
        """The holding's cgroup, made (or kept) with its limits; the files written."""
        placement = Placement.from_stored(holding.placement) if holding.placement else None
        ratio = float((holding.placement or {}).get("vcpuRatio", 1.0))
        written = self.cgroups.create(
            holding.reservation_id, limits_for(placement, holding.resources, ratio=ratio)
        )
        logger.info(
            "%s: cgroup %s made (%s)",
            holding.reservation_id,
            self.cgroups.path(holding.reservation_id),
            ", ".join(f"{k}={v}" for k, v in sorted(written.items())) or "no limits",
        )
        return written

    def _end(self, reservation_id: str, holding: Holding | None, now_ms: int) -> None:
        ending = self.store.endings().get(reservation_id)
        if ending is None:
            end_ms = holding.end_ms if holding is not None else now_ms
            ending = self.store.ending_begin(
                reservation_id, term_ms=now_ms, kill_ms=min(end_ms, now_ms) + self.kill_grace_ms
            )
            sent = self.cgroups.signal(reservation_id, signal.SIGTERM)
            if sent:
                logger.info(
                    "%s: ended; SIGTERM to %d processes, SIGKILL at %s",
                    reservation_id,
                    sent,
                    _iso(ending.kill_ms),
                )
        if ending.killed_ms is None and (
            now_ms >= ending.kill_ms or not self.cgroups.members(reservation_id)
        ):
            if self.cgroups.members(reservation_id):
                self.cgroups.kill(reservation_id)
                logger.info("%s: grace over; killed what was left", reservation_id)
            self.store.ending_killed(reservation_id, at_ms=now_ms)
            ending = self.store.endings()[reservation_id]
        if ending.killed_ms is None:
            return
        self.cgroups.wait_empty(reservation_id, REAP_WAIT_SECONDS)
        if self.cgroups.remove(reservation_id):
            self.store.ending_done(reservation_id)
            (self.notices / f"{reservation_id}.json").unlink(missing_ok=True)
            survived = self._survivors.pop(reservation_id, None)
            if survived is not None:
                self.holds = {gpu: why for gpu, why in self.holds.items() if why != survived}
            logger.info("%s: cgroup removed", reservation_id)
        elif now_ms - ending.killed_ms >= KILL_WAIT_SECONDS * 1000:
            pids = self.cgroups.members(reservation_id)
            if pids and reservation_id not in self._survivors:
                reason = (
                    f"processes of ended reservation {reservation_id} survive the kill"
                    f" (pid {pids[0]}, {command_of(pids[0])})"
                )
                logger.error("%s", reason)
                self._survivors[reservation_id] = reason
                for atom in holding.atoms if holding is not None else ():
                    gpu = self.gpu_of(atom)
                    if gpu:
                        self.holds[gpu] = reason

    def next_deadline_ms(self) -> int | None:
        """The next kill due, or a second from now while a killed cgroup waits to be removed."""
        soon = _now_ms() + 1000
        due = [e.kill_ms if e.killed_ms is None else soon for e in self.store.endings().values()]
        return min(due, default=None)

    # --- stragglers -------------------------------------------------------------------------

    def scan(self) -> dict[str, str]:
        """Which GPUs are held back, from NVML's processes and the reservations' cgroups; kept in `holds`."""
        holder = {pid: name for name in self.cgroups.names() for pid in self.cgroups.members(name)}
        live = {h.reservation_id for h in self.store.holdings(at_ms=_now_ms())}
        holds: dict[str, str] = {}
        for gpu, pids in sorted(self.processes().items()):
            for pid in sorted(pids):
                name = holder.get(pid)
                if name in live:
                    continue
                if name is not None:
                    reason = self._survivors.get(name)
                    if reason:
                        holds.setdefault(gpu, reason)
                    continue  # an ended reservation's: its end (`step`) kills it
                holds.setdefault(gpu, f"in use outside any reservation (pid {pid}, {command_of(pid)})")
        for name, survived in self._survivors.items():
            holding = self.store.holding(name)
            for atom in holding.atoms if holding is not None else ():
                held = self.gpu_of(atom)
                if held:
                    holds.setdefault(held, survived)
        for gpu in sorted(set(holds) - set(self.holds)):
            logger.warning("GPU %s held back: %s", gpu, holds[gpu])
        for gpu in sorted(set(self.holds) - set(holds)):
            logger.info("GPU %s no longer held back", gpu)
        self.holds = holds
        return holds

    # --- notices ----------------------------------------------------------------------------

    def notice_path(self, reservation_id: str) -> Path:
        return self.notices / f"{reservation_id}.json"

    def _notice(self, holding: Holding) -> None:
        path = self.notice_path(holding.reservation_id)
        if path.exists() or not holding.notice:
            return
        notice = {
            "reservationId": holding.reservation_id,
            "noticeGivenAt": _iso(int(holding.notice.get("givenAt") or 0)),
            "endsAt": _iso(int(holding.notice.get("endsAt") or holding.end_ms)),
            "reason": "preempted: a regular reservation displaced this spot one",
            "killGraceSeconds": self.kill_grace_ms / 1000,
        }
        self.notices.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(notice, indent=2) + "\n")
        os.chmod(temporary, 0o644)
        temporary.replace(path)
        logger.info("%s: preemption notice written to %s", holding.reservation_id, path)


def placement_for(
    change: Mapping[str, Any],
    others: list[Holding],
    *,
    topology: Topology,
    numa_of: Callable[[str], int | None],
) -> dict[str, Any]:
    """The stored placement of an accepted assign: its CPUs near its GPUs (see `cpuplan`)."""
    resources = change.get("resources") or {}
    ratio = float((change.get("ratios") or {}).get("vcpu", 1.0))
    gpu_nodes = {node for atom in change.get("atoms") or () if (node := numa_of(atom)) is not None}
    placement = cpus_choose(
        topology,
        want=int(resources.get("vcpu", 0)),
        gpu_nodes=gpu_nodes,
        ratio=ratio,
        taken=[(h.placement or {}).get("cpus") or () for h in others],
    )
    return {**placement.stored(), "vcpuRatio": ratio}


def _now_ms() -> int:
    return int(time.time() * 1000)


def gpu_map(snapshot: Mapping[str, Any]) -> tuple[Callable[[str], str | None], Callable[[str], int | None]]:
    """Atom uid → its GPU's UUID (the part before the first `/`), and atom uid → that GPU's NUMA node."""
    numa = {
        str(gpu["uuid"]): (gpu.get("numaNode") if (gpu.get("numaNode") or 0) >= 0 else None)
        for gpu in snapshot.get("gpus") or ()
        if gpu.get("uuid")
    }

    def gpu_of(atom: str) -> str | None:
        uuid = atom.split("/", 1)[0]
        return uuid if uuid in numa else None

    def numa_of(atom: str) -> int | None:
        gpu = gpu_of(atom)
        return numa.get(gpu) if gpu else None

    return gpu_of, numa_of
