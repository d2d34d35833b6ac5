"""The agent's loop: register once, report, stay alive, and hold the node's assignments.

* **Register** the host in its pool once (`nodes/register`); the node id is kept
  in the state directory (`node.json`), and asked again only when the host or
  the pool changes.
* **Report** at start, whenever what the host reads changes (a rescan every
  `RESCAN_SECONDS`), and when a heartbeat says the service saw the node
  disconnected.
* **Heartbeat** every `heartbeat_seconds` (30 by default, well inside the
  service's 120 s stale limit). Every answered long poll is one (the service
  stamps the node when it answers), so a polling agent sends no separate call.
* **Assignments**: a long poll (`nodes/assignments`) for the changes after the
  last one applied. Each is applied to the store (`better_compute_agent.store`),
  which refuses an overlap or an overcommit itself (guard 6, `guard`), and is
  answered (`nodes/ack`). Answers are kept until the service confirmed them, so
  one lost in a restart is sent again.
* **CDI**: after every change, and at every start or end of a holding, the
  spec (`cdi`) is written so that it names exactly the live reservations.
* **cgroups** (`enforce`): at the same instants, each live holding gets its
  cgroup, and each ended one's processes are ended (SIGTERM, then SIGKILL
  after the kill grace). The CPUs are chosen when the assign is accepted, and
  the answer tells the service (`placement`). GPUs in use from outside every
  reservation are held back in the report until the process is gone.

The loop never sleeps past the next of those instants, so a booking that starts
is in the CDI spec within the long poll's wake-up, not a period later.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from better_compute_agent.cdi import cdi_spec, cdi_write
from better_compute_agent.cgroups import Cgroups, default_root
from better_compute_agent.client import AgentClient, ApiError, Unreachable
from better_compute_agent.config import AgentSettings
from better_compute_agent.cpuplan import topology_from
from better_compute_agent.discovery.report import GpuDevice, gpu_devices, report_from_snapshot
from better_compute_agent.discovery.source import HostSource, Snapshot
from better_compute_agent.enforce import Enforcer, gpu_map, placement_for
from better_compute_agent.store import Answer, Holding, Store

logger = logging.getLogger("better_compute_agent")

RESCAN_SECONDS = 60.0
# A long poll asks the service to wait at most this long (the service's bound is 30 s).
LONGEST_POLL_SECONDS = 25.0
# After a failed call, wait this long, doubling, up to the cap.
RETRY_SECONDS, RETRY_CAP_SECONDS = 1.0, 30.0
# Holdings that ended this long ago are dropped from the store.
KEEP_ENDED_MS = 24 * 3600 * 1000
# What the service is told of a placement (the store keeps more: the ratio, whether it is exclusive).
PLACEMENT_KEYS = ("cpus", "numaNodes", "gpuLocal")


def now_ms() -> int:
    return int(time.time() * 1000)


class Agent:
    """One host's agent: its source of facts, its store, and (when it talks) its client."""

    def __init__(
        self, settings: AgentSettings, source: HostSource, client: AgentClient | None = None
    ) -> None:
        self.settings, self.source, self.client = settings, source, client
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(settings.state_dir / "store.json")
        self.snapshot: Snapshot = {}
        self.report: dict[str, Any] = {}
        self.devices: dict[str, GpuDevice] = {}
        self.node_id = ""
        # The cgroups of the holdings (`enforce`); None until `enforcement` takes the root.
        self.enforcer: Enforcer | None = None
        # The client of the long poll: the service's `agents` process when it names one.
        self.poller: AgentClient | None = client

    # --- the host ---------------------------------------------------------------------------

    def read_host(self) -> bool:
        """Read the host again (and which GPUs are held back); True when the report differs from the last."""
        self.snapshot = self.source.read()
        self.devices = gpu_devices(self.snapshot)
        if self.enforcer is not None:
            self.enforcer.gpu_of = gpu_map(self.snapshot)[0]
            self.enforcer.scan()
        return self.refresh_report()

    def refresh_report(self) -> bool:
        """The report of the last read with the GPUs held back now; True when it changed."""
        report = report_from_snapshot(self.snapshot)
        holds = self.enforcer.holds if self.enforcer is not None else {}
        for gpu in report["gpus"]:
            if gpu["uuid"] in holds and "health" not in gpu:
                gpu["health"] = {"healthy": False, "reason": holds[gpu["uuid"]], "clears": True}
        changed = report != self.report
        self.report = report
        return changed

    def enforcement(self) -> Enforcer:
        """Take the cgroup root for the holdings; raises `CgroupError` where cgroup v2 cannot be used."""
        if self.enforcer is None:
            cgroups = Cgroups(self.settings.cgroup_root or default_root())
            cgroups.prepare()
            self.enforcer = Enforcer(
                self.store,
                cgroups,
                kill_grace=self.settings.kill_grace,
                notices=self.settings.state_dir / "notices",
                gpu_of=gpu_map(self.snapshot)[0],
                processes=self.source.gpu_processes,
            )
        return self.enforcer

    def enforce(self) -> None:
        """Cgroups for what is live, an end for what is over; a report when a GPU's hold changed."""
        if self.enforcer is None:
            return
        self.enforcer.step(now_ms())
        if self.refresh_report() and self.node_id:
            self.send_report()

    def place(self, change: Mapping[str, Any], others: list[Holding]) -> dict[str, Any] | None:
        """Where an accepted assign's cgroup goes (`enforce.placement_for`), on this host's topology."""
        return placement_for(
            change, others, topology=topology_from(self.snapshot), numa_of=gpu_map(self.snapshot)[1]
        )

    def capacity(self, change: dict[str, Any]) -> dict[str, int]:
        """What the node has of each scalar, as it reported it, times the service's overcommit ratio."""
        ratios = change.get("ratios") or {}
        reported = self.report.get("resources", {})
        return {
            name: math.floor(int(amount) * float(ratios.get(name, 1.0))) for name, amount in reported.items()
        }

    # --- the service ------------------------------------------------------------------------

    def _client(self) -> AgentClient:
        if self.client is None:
            raise RuntimeError("this command does not talk to the service")
        return self.client

    def register(self) -> str:
        """The node id, from the state directory or from `nodes/register`."""
        pool = self.settings.require("pool")
        hostname = str(self.report["hostname"])
        path = self.settings.state_dir / "node.json"
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            kept = {}
        if (
            kept.get("hostname") == hostname
            and kept.get("poolId") == pool
            and kept.get("url") == self.settings.url
        ):
            self.node_id = str(kept["nodeId"])
            self._poll_at(str(kept.get("assignmentsUrl") or ""))
            return self.node_id
        self.node_id, poll_url = self._client().register(
            pool_id=pool, hostname=hostname, labels=self.settings.labels
        )
        self._poll_at(poll_url)
        record = {
            "nodeId": self.node_id,
            "hostname": hostname,
            "poolId": pool,
            "url": self.settings.url,
            "assignmentsUrl": poll_url,
        }
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record))
        temporary.replace(path)
        logger.info("registered %s in %s as %s", hostname, pool, self.node_id)
        return self.node_id

    def _poll_at(self, url: str) -> None:
        client = self._client()
        self.poller = AgentClient(url, client.token) if url and url != client.url else client

    def send_report(self) -> None:
        self._client().report(node_id=self.node_id, report=self.report)
        logger.info("reported %d GPUs", len(self.report.get("gpus", [])))

    def send_answers(self) -> None:
        """Answers the service has not confirmed yet (a restart lost them), oldest first."""
        for answer in self.store.unacked():
            self._answer(answer)

    def _answer(self, answer: Answer) -> None:
        """Tell the service, then mark it told: an answer lost between the two is sent again."""
        placement = answer.placement
        self._client().ack(
            node_id=self.node_id,
            delivery_id=answer.delivery_id,
            accepted=answer.accepted,
            reason=answer.reason,
            placement={key: placement[key] for key in PLACEMENT_KEYS} if placement else None,
        )
        self.store.mark_acked(answer.delivery_id)

    def sync(self, *, wait_ms: int) -> int:
        """Pull, apply and answer the node's changes (waiting up to `wait_ms` for one); how many."""
        self.send_answers()
        changes, connected = (self.poller or self._client()).assignments(
            node_id=self.node_id, after=self.store.last_delivery_id(), wait_ms=wait_ms
        )
        if not connected:
            # The service saw the node disconnected: a full report reconnects it, then poll on.
            self.send_report()
            return 0
        for change in changes:
            answer = self.store.apply(change, capacity=self.capacity(change), place=self.place)
            if not answer.accepted:
                logger.warning("refused %s: %s", change.get("reservationId"), answer.reason)
            self._answer(answer)
        if changes:
            self.enforce()
            self.write_cdi()
        return len(changes)

    # --- the workloads ----------------------------------------------------------------------

    def write_cdi(self) -> bool:
        """The CDI spec of the holdings live now; True when the file changed."""
        spec = cdi_spec(self.store.holdings(at_ms=now_ms()), self.devices)
        return cdi_write(spec, self.settings.cdi_dir)

    def next_boundary_ms(self) -> int | None:
        """The next instant a holding starts or ends (the CDI spec changes then)."""
        now = now_ms()
        instants = [t for h in self.store.holdings() for t in (h.start_ms, h.end_ms) if t > now]
        if self.enforcer is not None:
            due = self.enforcer.next_deadline_ms()
            if due is not None:
                instants.append(max(due, now))
        return min(instants, default=None)

    # --- the commands -----------------------------------------------------------------------

    def once(self) -> int:
        """Register, report, take the waiting changes, write the CDI spec; how many changes."""
        self.read_host()
        self.register()
        self.send_report()
        taken = self.sync(wait_ms=0)
        self.enforce()
        self.write_cdi()
        return taken

    def run(self, stop: threading.Event, *, sleep: Callable[[float], bool] | None = None) -> None:
        """Until `stop` is set (SIGTERM, Ctrl-C): the loop of the module docstring."""
        wait = sleep or stop.wait
        retry = RETRY_SECONDS
        started = False
        next_heartbeat = next_rescan = 0.0
        while not stop.is_set():
            try:
                if not started:
                    self.read_host()
                    self.register()
                    self.send_report()
                    self.write_cdi()
                    started = True
                    next_heartbeat = time.monotonic() + self.settings.heartbeat_seconds
                    next_rescan = time.monotonic() + RESCAN_SECONDS
                self.sync(wait_ms=self._poll_ms(next_heartbeat, next_rescan))
                # An answered poll is a heartbeat (the service stamps it): the next one is a period away.
                next_heartbeat = time.monotonic() + self.settings.heartbeat_seconds
                self.enforce()
                self.write_cdi()
                if time.monotonic() >= next_heartbeat:
                    if not self._client().heartbeat(node_id=self.node_id):
                        self.send_report()
                    next_heartbeat = time.monotonic() + self.settings.heartbeat_seconds
                if time.monotonic() >= next_rescan:
                    if self.read_host():
                        self.send_report()
                    self.store.prune(before_ms=now_ms() - KEEP_ENDED_MS)
                    next_rescan = time.monotonic() + RESCAN_SECONDS
                retry = RETRY_SECONDS
            except (Unreachable, ApiError) as exc:
                logger.warning("%s; retrying in %.0f s", exc, retry)
                wait(retry)
                retry = min(retry * 2, RETRY_CAP_SECONDS)

    def _poll_ms(self, next_heartbeat: float, next_rescan: float) -> int:
        """How long the long poll may wait: until the next heartbeat, rescan or holding boundary."""
        until = min(next_heartbeat, next_rescan) - time.monotonic()
        boundary = self.next_boundary_ms()
        if boundary is not None:
            until = min(until, (boundary - now_ms()) / 1000)
        return max(0, int(min(until, LONGEST_POLL_SECONDS) * 1000))

    def close(self) -> None:
        self.store.close()


def state_store(state_dir: Path) -> Store:
    """The store alone, for the commands that only read it (`assignments`, `env`)."""
    return Store(state_dir / "store.json")
