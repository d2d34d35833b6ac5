"""`better-compute-agent`: the node agent's commands.

* `run`: the daemon (`better_compute_agent.daemon`), until SIGTERM or Ctrl-C;
* `once`: register, report, take the waiting assignment changes, write the CDI spec, exit;
* `show`: the report it would send, as JSON;
* `snapshot FILE`: what the host has, for tests and bug reports (`--snapshot FILE` reads one back);
* `assignments`: what the node holds now, from its store;
* `env RESERVATION_ID`: `CUDA_VISIBLE_DEVICES=…` and `NVIDIA_VISIBLE_DEVICES=…` for a batch prolog.

Exit status: 0 done, 1 the service refused or could not be reached, 2 a usage
or configuration error, 3 the host cannot be read (no NVML: use `--snapshot`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from better_compute_agent.cdi import visible_devices_env
from better_compute_agent.client import AgentClient, ApiError, Unreachable
from better_compute_agent.config import AgentSettings, ConfigError, settings_from
from better_compute_agent.daemon import Agent, now_ms, state_store
from better_compute_agent.discovery.nvml import NvmlSource
from better_compute_agent.discovery.report import gpu_devices, report_from_snapshot
from better_compute_agent.discovery.snapshot import SnapshotSource, snapshot_write
from better_compute_agent.discovery.source import DiscoveryError, HostSource


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="better-compute-agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="the service (BETTER_COMPUTE_URL)")
    parser.add_argument("--token", help="a node-agent token (BETTER_COMPUTE_TOKEN)")
    parser.add_argument("--pool", help="the pool this host joins (BETTER_COMPUTE_POOL)")
    parser.add_argument("--state-dir", help="the agent's store (BETTER_COMPUTE_AGENT_STATE)")
    parser.add_argument("--cdi-dir", help="where the CDI spec is written (BETTER_COMPUTE_AGENT_CDI_DIR)")
    parser.add_argument("--snapshot", help="read the host from this file instead of NVML, /proc and /sys")
    parser.add_argument("--heartbeat-seconds", help="between heartbeats (BETTER_COMPUTE_AGENT_HEARTBEAT)")
    parser.add_argument("--label", action="append", help="a node label, key=value (repeatable)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each call")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="the daemon")
    commands.add_parser("once", help="report and sync once, then exit")
    commands.add_parser("show", help="print the report it would send")
    snapshot = commands.add_parser("snapshot", help="write what the host has to FILE")
    snapshot.add_argument("file")
    commands.add_parser("assignments", help="what the node holds now")
    env = commands.add_parser("env", help="the visible-devices variables of a reservation held here")
    env.add_argument("reservation_id")
    return parser


def _source(settings: AgentSettings) -> HostSource:
    return SnapshotSource(settings.snapshot) if settings.snapshot else NvmlSource()


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _assignments(settings: AgentSettings) -> int:
    store = state_store(settings.state_dir)
    try:
        now = now_ms()
        _print(
            [
                {
                    "reservationId": h.reservation_id,
                    "atoms": list(h.atoms),
                    "start": h.start_ms,
                    "end": h.end_ms,
                    "live": h.start_ms <= now < h.end_ms,
                    "resources": h.resources,
                }
                for h in store.holdings()
            ]
        )
    finally:
        store.close()
    return 0


def _env(settings: AgentSettings, reservation_id: str) -> int:
    store = state_store(settings.state_dir)
    try:
        holding = store.holding(reservation_id)
    finally:
        store.close()
    if holding is None:
        print(f"better-compute-agent: {reservation_id} is not held on this node", file=sys.stderr)
        return 1
    devices = gpu_devices(_source(settings).read())
    for name, value in sorted(visible_devices_env(holding, devices).items()):
        print(f"{name}={value}")
    return 0


def _daemon(settings: AgentSettings, command: str) -> int:
    client = AgentClient(settings.url, settings.require("token"))
    agent = Agent(settings, _source(settings), client)
    try:
        if command == "once":
            taken = agent.once()
            print(f"node {agent.node_id}: reported, {taken} assignment changes applied")
            return 0
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        agent.run(stop)
        return 0
    finally:
        agent.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "run" else logging.WARNING,
        format="%(asctime)s better-compute-agent %(levelname)s %(message)s",
    )
    try:
        settings = settings_from(args, os.environ)
        if args.command == "show":
            _print(report_from_snapshot(_source(settings).read()))
            return 0
        if args.command == "snapshot":
            snapshot_write(_source(settings).read(), Path(args.file))
            return 0
        if args.command == "assignments":
            return _assignments(settings)
        if args.command == "env":
            return _env(settings, args.reservation_id)
        return _daemon(settings, args.command)
    except ConfigError as exc:
        print(f"better-compute-agent: {exc}", file=sys.stderr)
        return 2
    except DiscoveryError as exc:
        print(f"better-compute-agent: {exc}", file=sys.stderr)
        return 3
    except (ApiError, Unreachable) as exc:
        print(f"better-compute-agent: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `show | head`: the reader left. Python's advice: point stdout at /dev/null so the
        # interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
