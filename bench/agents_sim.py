"""The simulated node agents of `bench.agents`: N agents in one asyncio process, speaking the agent's API.

Each agent is the shipped H100 host snapshot made a host of its own (its
hostname and GPU uuids; the service names NIC VFs and disks after the
hostname), its report built by the agent's own `report_from_snapshot`. It
registers and reports (a bounded number at once), then, once told to, does
what `better_compute_agent.daemon` does between reports: a heartbeat every
30 s and a long poll always open on the URL `nodes/register` named, each
change answered at once. The agents start staggered over one heartbeat period.

`bench.agents` runs it as a child process (`Simulator`) and talks to it in JSON lines:

* stdout `{"event": "ready", ...}` when every agent registered and reported;
* stdin `go`: the loops start;
* stdout `{"event": "ack", "reservationId", "at"}` for every answered `assign`
  (`at` is `time.monotonic()`, the same clock in every process of the machine);
* stdin `stop`: the loops end, and stdout `{"event": "done", ...}` carries every
  heartbeat as `[started_at, ms, status]`, the long polls' count and the errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from better_compute_agent.discovery.report import report_from_snapshot

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "better_compute_agent" / "snapshots" / "h100-8gpu-sriov.json"
HEARTBEAT_SECONDS = 30.0
POLL_WAIT_MS = 25_000
ONBOARD_CONCURRENCY = 32
RETRY_SECONDS = 1.0
# gunicorn closes a kept-alive connection after 2 s idle: the client drops its own first.
KEEPALIVE_EXPIRY_S = 1.5
# The node-agent token (scoped to the pool) comes in the environment, not on the command line.
TOKEN_ENV = "BENCH_AGENT_TOKEN"  # noqa: S105 (the name of a variable)
console = Console(stderr=True)


def host_report(template: dict[str, Any], index: int) -> dict[str, Any]:
    """The report of host `index`: the template's host with its own hostname and GPU uuids."""
    snapshot = json.loads(json.dumps(template))
    hostname = f"bench-agent-{index:05d}"
    snapshot["hostname"] = hostname
    for gpu in snapshot["gpus"]:
        prefix = gpu["uuid"].split("-", 1)[0]
        gpu["uuid"] = f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_DNS, hostname + '/' + gpu['uuid'])}"
    return report_from_snapshot(snapshot)  # type: ignore[arg-type]


def emit(event: str, **data: Any) -> None:
    """One line to the parent process."""
    sys.stdout.write(json.dumps({"event": event, **data}) + "\n")
    sys.stdout.flush()


class Clients:
    """Each agent's own two HTTP clients, as each real agent has its sessions.

    One client shared by a thousand agents would do the same requests, but
    httpx's connection pool looks at every one of its connections on every
    request: with a thousand open long polls, the simulator, not the service,
    would be what is measured.
    """

    def __init__(self, *, url: str, token: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}", "User-Agent": "better-compute-agent (bench)"}
        # Plain HTTP; one context for all instead of one CA bundle read per client.
        self.tls = ssl.create_default_context()

    def make(self, *, base_url: str, timeout: float) -> httpx.AsyncClient:
        limits = httpx.Limits(
            max_connections=2, max_keepalive_connections=2, keepalive_expiry=KEEPALIVE_EXPIRY_S
        )
        return httpx.AsyncClient(
            base_url=base_url,
            headers=self.headers,
            limits=limits,
            timeout=timeout,
            verify=self.tls,
            trust_env=False,
        )


@dataclass
class SimulatedAgents:
    """The agents' clients and node ids, and what their loops measured."""

    clients: Clients
    pool_id: str
    template: dict[str, Any]
    node_ids: list[str] = field(default_factory=list)
    web: list[httpx.AsyncClient] = field(default_factory=list)
    poll: list[httpx.AsyncClient] = field(default_factory=list)
    heartbeats: list[tuple[float, float, int]] = field(default_factory=list)
    polls: int = 0
    acks: int = 0
    reports_again: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    # When each agent's last long poll was answered: an answered poll is its heartbeat.
    answered: dict[int, float] = field(default_factory=dict)

    async def call(self, client: httpx.AsyncClient, method: str, body: dict[str, Any]) -> httpx.Response:
        return await client.post(f"/api/compute/{method}", json=body)

    async def close(self) -> None:
        await asyncio.gather(*(client.aclose() for client in (*self.web, *self.poll)), return_exceptions=True)

    async def onboard_one(self, index: int) -> tuple[str, str]:
        """Register host `index` and send its first report; its node id and its long poll's URL."""
        report = host_report(self.template, index)
        body = {"poolId": self.pool_id, "hostname": report["hostname"], "labels": {"bench": "agents"}}
        answer = await self.call(self.web[index], "nodes/register", body)
        answer.raise_for_status()
        node_id = str(answer.json()["nodeId"])
        reported = await self.call(self.web[index], "inventory/report", {"nodeId": node_id, "report": report})
        reported.raise_for_status()
        return node_id, str(answer.json().get("assignmentsUrl") or "")

    async def onboard(self, count: int) -> tuple[float, str]:
        """Every agent registered and reported, `ONBOARD_CONCURRENCY` at a time; seconds, poll URL."""
        gate = asyncio.Semaphore(ONBOARD_CONCURRENCY)
        self.node_ids = [""] * count
        self.web = [self.clients.make(base_url=self.clients.url, timeout=120.0) for _ in range(count)]
        urls: set[str] = set()
        started = time.monotonic()
        columns = (TextColumn("agents register + report"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("onboard", total=count)

            async def one(index: int) -> None:
                async with gate:
                    self.node_ids[index], url = await self.onboard_one(index)
                    urls.add(url)
                    progress.advance(task)

            await asyncio.gather(*(one(i) for i in range(count)))
        poll_url = ",".join(sorted(urls)) or self.clients.url
        self.poll = [
            self.clients.make(base_url=poll_url, timeout=POLL_WAIT_MS / 1000 + 30) for _ in range(count)
        ]
        return time.monotonic() - started, poll_url

    async def heartbeat_loop(self, index: int, first_at: float) -> None:
        """As the agent: a heartbeat only when no poll was answered for `HEARTBEAT_SECONDS` (an answered
        poll is one); a disconnected node reports again."""
        node_id = self.node_ids[index]
        due = first_at
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if time.monotonic() - self.answered.get(index, float("-inf")) < HEARTBEAT_SECONDS:
                due = self.answered[index] + HEARTBEAT_SECONDS
                continue
            started = time.monotonic()
            try:
                answer = await self.call(self.web[index], "nodes/heartbeat", {"nodeId": node_id})
                self.heartbeats.append((started, (time.monotonic() - started) * 1000, answer.status_code))
                if answer.status_code == 200 and not answer.json().get("connected", True):
                    self.reports_again += 1
                    body = {"nodeId": node_id, "report": host_report(self.template, index)}
                    await self.call(self.web[index], "inventory/report", body)
            except httpx.HTTPError as exc:
                self.errors[f"heartbeat {type(exc).__name__}"] += 1
            due += HEARTBEAT_SECONDS

    async def poll_loop(self, index: int, first_at: float) -> None:
        """The long poll, always open; each change answered (accepted) at once, then asked again."""
        node_id = self.node_ids[index]
        after = 0
        await asyncio.sleep(max(0.0, first_at - time.monotonic()))
        while True:
            try:
                body = {"nodeId": node_id, "after": after, "waitMs": POLL_WAIT_MS}
                answer = await self.call(self.poll[index], "nodes/assignments", body)
                self.polls += 1
                if answer.status_code == 200:
                    self.answered[index] = time.monotonic()
                if answer.status_code != 200:
                    self.errors[f"assignments {answer.status_code}"] += 1
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                for change in answer.json()["changes"]:
                    ack = {"nodeId": node_id, "deliveryId": change["deliveryId"], "accepted": True}
                    acked = await self.call(self.web[index], "nodes/ack", ack)
                    if acked.status_code != 200:
                        self.errors[f"ack {acked.status_code}"] += 1
                        continue
                    after = max(after, int(change["deliveryId"]))
                    self.acks += 1
                    if change["kind"] == "assign":
                        emit("ack", reservationId=change["reservationId"], at=time.monotonic())
            except httpx.HTTPError as exc:
                self.errors[f"assignments {type(exc).__name__}"] += 1
                await asyncio.sleep(RETRY_SECONDS)


class Simulator:
    """`python -m bench.agents_sim` as a child process, and what its JSON lines said."""

    def __init__(self, *, url: str, token: str, pool_id: str, agents: int) -> None:
        self.args = [sys.executable, "-m", "bench.agents_sim", "--url", url, "--pool", pool_id]
        self.args += ["--agents", str(agents)]
        self.env = {**os.environ, TOKEN_ENV: token}
        self.process: subprocess.Popen[str] | None = None
        self.events: dict[str, dict[str, Any]] = {}
        self.acks: dict[str, float] = {}
        self.changed = threading.Condition()

    def start(self) -> None:
        self.process = subprocess.Popen(  # noqa: S603
            self.args, cwd=ROOT, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self.changed:
                if message["event"] == "ack":
                    self.acks.setdefault(message["reservationId"], float(message["at"]))
                else:
                    self.events[message["event"]] = message
                self.changed.notify_all()
        with self.changed:
            self.events.setdefault("exited", {})
            self.changed.notify_all()

    def wait(self, event: str, timeout: float) -> dict[str, Any]:
        """The message of `event`, once the simulator sent it; RuntimeError when it exits first."""
        with self.changed:
            self.changed.wait_for(lambda: event in self.events or "exited" in self.events, timeout)
            if event not in self.events:
                raise RuntimeError(f"the simulated agents did not send {event!r}")
            return self.events[event]

    def wait_acks(self, ids: list[str], timeout: float) -> None:
        with self.changed:
            self.changed.wait_for(lambda: all(i in self.acks for i in ids), timeout)

    def send(self, line: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def _line() -> str:
    return (await asyncio.to_thread(sys.stdin.readline)).strip()


async def simulate(*, url: str, token: str, pool_id: str, agents: int, seed: int = 7) -> None:
    """Onboard `agents` agents, wait for `go`, run their loops until `stop`; the module's protocol."""
    sim = SimulatedAgents(
        clients=Clients(url=url, token=token), pool_id=pool_id, template=json.loads(SNAPSHOT.read_text())
    )
    try:
        seconds, poll_url = await sim.onboard(agents)
        emit("ready", agents=agents, seconds=round(seconds, 2), assignmentsUrl=poll_url)
        if await _line() != "go":
            return
        now = time.monotonic()
        offsets = random.Random(seed).sample(range(agents), agents)
        tasks = []
        for index in range(agents):
            first_at = now + HEARTBEAT_SECONDS * offsets[index] / agents
            tasks.append(asyncio.create_task(sim.heartbeat_loop(index, first_at)))
            tasks.append(asyncio.create_task(sim.poll_loop(index, first_at)))
        emit("started", at=now, staggerS=HEARTBEAT_SECONDS)
        while await _line() not in ("stop", ""):
            pass
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        emit(
            "done",
            heartbeats=[[round(a, 4), round(ms, 3), s] for a, ms, s in sim.heartbeats],
            polls=sim.polls,
            acks=sim.acks,
            reportsAgain=sim.reports_again,
            errors=dict(sim.errors),
        )
    finally:
        await sim.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agents_sim", description=__doc__)
    parser.add_argument("--url", required=True, help="the web process's base URL")
    parser.add_argument("--pool", required=True, help="the pool the agents register in")
    parser.add_argument("--agents", type=int, default=1000)
    args = parser.parse_args(argv)
    token = os.environ[TOKEN_ENV]
    asyncio.run(simulate(url=args.url, token=token, pool_id=args.pool, agents=args.agents))


if __name__ == "__main__":
    main()
