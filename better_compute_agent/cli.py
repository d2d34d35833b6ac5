"""`better-compute-agent`: the node agent's commands.

* `run`: the daemon (`better_compute_agent.daemon`), until SIGTERM or Ctrl-C;
* `once`: register, report, take the waiting assignment changes, write the CDI spec, exit;
* `show`: the report it would send, as JSON;
* `snapshot FILE`: what the host has, for tests and bug reports (`--snapshot FILE` reads one back);
* `assignments`: what the node holds now, from its store;
* `env RESERVATION_ID`: `CUDA_VISIBLE_DEVICES=…` and `NVIDIA_VISIBLE_DEVICES=…` for a batch prolog;
* `exec RESERVATION_ID -- CMD [ARG…]`: run CMD inside the reservation's cgroup, with its GPUs.

Exit status: 0 done, 1 the service refused or could not be reached, 2 a usage
or configuration error, 3 the host cannot be read (no NVML: use `--snapshot`),
4 the host has no usable cgroup v2 (`--cgroup-root`), and for `exec`: 5 the
reservation is not held on this node, 6 it is not live (before its start or
after its end), 7 the caller is not root, 127 CMD was not found.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from better_compute_agent.cdi import visible_devices_env
from better_compute_agent.cgroups import CgroupError, Cgroups, default_root
from better_compute_agent.client import AgentClient, ApiError, Unreachable
from better_compute_agent.config import AgentSettings, ConfigError, settings_from
from better_compute_agent.daemon import Agent, now_ms, state_store
from better_compute_agent.discovery.nvml import NvmlSource
from better_compute_agent.discovery.report import gpu_devices, report_from_snapshot
from better_compute_agent.discovery.snapshot import SnapshotSource, snapshot_write
from better_compute_agent.discovery.source import DiscoveryError, HostSource
from better_compute_agent.enforce import Enforcer, gpu_map

EXIT_NO_CGROUPS, EXIT_NOT_HELD, EXIT_NOT_LIVE, EXIT_NOT_ROOT, EXIT_NO_COMMAND = 4, 5, 6, 7, 127


def _options(parser: argparse.ArgumentParser, *, default: Any) -> None:
    """The options every command takes, before the command or after it."""
    parser.add_argument("--url", default=default, help="the service (BETTER_COMPUTE_URL)")
    parser.add_argument("--token", default=default, help="a node-agent token (BETTER_COMPUTE_TOKEN)")
    parser.add_argument("--pool", default=default, help="the pool this host joins (BETTER_COMPUTE_POOL)")
    parser.add_argument("--state-dir", default=default, help="the agent's store (BETTER_COMPUTE_AGENT_STATE)")
    parser.add_argument(
        "--cdi-dir", default=default, help="where the CDI spec is written (BETTER_COMPUTE_AGENT_CDI_DIR)"
    )
    parser.add_argument(
        "--cgroup-root",
        default=default,
        help="the cgroup v2 directory the reservations' cgroups go under"
        " (BETTER_COMPUTE_AGENT_CGROUP_ROOT; default: the agent's own, delegated by its unit)",
    )
    parser.add_argument(
        "--kill-grace",
        default=default,
        help="seconds from SIGTERM to SIGKILL at a booking's end (BETTER_COMPUTE_AGENT_KILL_GRACE, 30)",
    )
    parser.add_argument(
        "--snapshot", default=default, help="read the host from this file instead of NVML, /proc and /sys"
    )
    parser.add_argument(
        "--heartbeat-seconds", default=default, help="between heartbeats (BETTER_COMPUTE_AGENT_HEARTBEAT)"
    )
    parser.add_argument(
        "--label", action="append", default=default, help="a node label, key=value (repeatable)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help="log each call")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="better-compute-agent", description=__doc__.split("\n\n")[0])
    _options(parser, default=None)
    common = argparse.ArgumentParser(add_help=False)
    _options(common, default=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="the daemon", parents=[common])
    commands.add_parser("once", help="report and sync once, then exit", parents=[common])
    commands.add_parser("show", help="print the report it would send", parents=[common])
    snapshot = commands.add_parser("snapshot", help="write what the host has to FILE", parents=[common])
    snapshot.add_argument("file")
    commands.add_parser("assignments", help="what the node holds now", parents=[common])
    env = commands.add_parser(
        "env", help="the visible-devices variables of a reservation held here", parents=[common]
    )
    env.add_argument("reservation_id")
    run_in = commands.add_parser(
        "exec", help="run a command inside a reservation's cgroup, with its GPUs", parents=[common]
    )
    run_in.add_argument("reservation_id")
    run_in.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARG ...]")
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


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _exec(settings: AgentSettings, reservation_id: str, argv: list[str]) -> int:
    """Refuse with one line, or become CMD inside the reservation's cgroup (this returns only on refusal)."""
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(
            "better-compute-agent: exec needs a command: exec RESERVATION_ID -- CMD [ARG ...]",
            file=sys.stderr,
        )
        return 2
    if os.geteuid() != 0:
        print(
            "better-compute-agent: exec must run as root: it moves itself into the reservation's cgroup",
            file=sys.stderr,
        )
        return EXIT_NOT_ROOT
    store = state_store(settings.state_dir)
    try:
        holding = store.holding(reservation_id)
        now = now_ms()
        if holding is None:
            print(f"better-compute-agent: {reservation_id} is not held on this node", file=sys.stderr)
            return EXIT_NOT_HELD
        if now < holding.start_ms:
            print(
                f"better-compute-agent: {reservation_id} starts at {_iso(holding.start_ms)};"
                " nothing runs in it before",
                file=sys.stderr,
            )
            return EXIT_NOT_LIVE
        if now >= holding.end_ms:
            print(f"better-compute-agent: {reservation_id} ended at {_iso(holding.end_ms)}", file=sys.stderr)
            return EXIT_NOT_LIVE
        snapshot = _source(settings).read()
        cgroups = Cgroups(settings.cgroup_root or default_root())
        enforcer = Enforcer(
            store,
            cgroups,
            kill_grace=settings.kill_grace,
            notices=settings.state_dir / "notices",
            gpu_of=gpu_map(snapshot)[0],
            processes=dict,
        )
        if not cgroups.exists(reservation_id):
            enforcer.start(holding)  # the daemon makes it at the start; this is the moment it starts
        cgroups.add(reservation_id, os.getpid())
        env = dict(os.environ)
        env.update(visible_devices_env(holding, gpu_devices(snapshot)))
        env["BETTER_COMPUTE_RESERVATION_ID"] = reservation_id
        if holding.spot:
            env["BETTER_COMPUTE_NOTICE_FILE"] = str(enforcer.notice_path(reservation_id))
    finally:
        store.close()
    sys.stdout.flush()
    try:
        os.execvpe(argv[0], argv, env)  # noqa: S606 - exec is the point: CMD becomes this process
    except OSError as exc:
        print(f"better-compute-agent: {argv[0]}: {exc.strerror}", file=sys.stderr)
        return EXIT_NO_COMMAND


def _daemon(settings: AgentSettings, command: str) -> int:
    client = AgentClient(settings.url, settings.require("token"))
    agent = Agent(settings, _source(settings), client)
    try:
        agent.enforcement()
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
        if args.command == "exec":
            return _exec(settings, args.reservation_id, list(args.argv))
        return _daemon(settings, args.command)
    except ConfigError as exc:
        print(f"better-compute-agent: {exc}", file=sys.stderr)
        return 2
    except DiscoveryError as exc:
        print(f"better-compute-agent: {exc}", file=sys.stderr)
        return 3
    except CgroupError as exc:
        print(f"better-compute-agent: {exc}", file=sys.stderr)
        return EXIT_NO_CGROUPS
    except (ApiError, Unreachable) as exc:
        print(f"better-compute-agent: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `show | head`: the reader left. Python's advice: point stdout at /dev/null so the
        # interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
