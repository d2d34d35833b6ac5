"""The cluster's PostgreSQL members under Patroni, and the one etcd that holds its leader lock.

Patroni decides everything about who leads: it bootstraps the first member,
clones the second, keeps the leader key in etcd, promotes the synchronous
standby when the leader's key expires, and rewinds a former leader that comes
back. This module only starts and stops the programs, asks Patroni's REST API
who leads, and injects the faults the cluster tests use (a member SIGKILLed,
one stopped and started, a `patronictl switchover`). Nothing here chooses a
leader.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from config.cluster_conf import member_dir, patroni_conf_path, write_patroni_conf
from config.cluster_programs import kill_group, program, spawn, stop_pid, wait_http
from config.cluster_state import MEMBERS, SCOPE, STATE_DIR, Ports, State


def start_etcd(state: State) -> None:
    """One etcd member (three would be a deployment's; this machine runs all of them on one host)."""
    ports = state.ports
    client, peer = f"http://127.0.0.1:{ports.etcd}", f"http://127.0.0.1:{ports.etcd_peer}"
    args = [
        program("etcd"),
        *("--name", "etcd1", "--data-dir", str(STATE_DIR / "etcd")),
        *("--listen-client-urls", client, "--advertise-client-urls", client),
        *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
        *("--initial-cluster", f"etcd1={peer}", "--initial-cluster-state", "new"),
        *("--logger", "zap", "--log-level", "warn"),
    ]
    state.pids["etcd"] = spawn("etcd", args, env=dict(os.environ))
    state.save()
    wait_http(f"{client}/health", what="etcd")


def start_member(state: State, index: int) -> None:
    """Start member `index`'s Patroni, which starts (or bootstraps, or clones, or rewinds) its PostgreSQL."""
    name = MEMBERS[index]
    conf = write_patroni_conf(state.ports, index)
    env = dict(os.environ) | {"PATRONI_LOG_LEVEL": "INFO"}
    state.pids[f"patroni-{name}"] = spawn(
        f"patroni-{name}", [program("patroni"), str(conf)], env=env, as_server=True
    )
    state.save()


def rest(ports: Ports, index: int, path: str, *, timeout: float = 2.0) -> tuple[int, Any]:
    """Patroni's REST API of member `index`: (status, JSON body); (0, None) when it does not answer."""
    url = f"http://127.0.0.1:{ports.rest(index)}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        with contextlib.suppress(ValueError):
            return error.code, json.loads(error.read() or b"null")
        return error.code, None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        # HTTPException: an answer that is no HTTP (a half-started server) is no answer either.
        return 0, None


def leader(ports: Ports) -> int | None:
    """The member whose Patroni answers `/primary` with 200 (what HAProxy asks), or None."""
    for index in range(len(MEMBERS)):
        if rest(ports, index, "/primary")[0] == 200:
            return index
    return None


def members(ports: Ports) -> list[dict[str, Any]]:
    """Patroni's view of the cluster (`/cluster` of any member that answers): name, role, state, lag."""
    for index in range(len(MEMBERS)):
        status, body = rest(ports, index, "/cluster")
        if status == 200 and body:
            return list(body.get("members", []))
    return []


def wait_until(predicate: Any, *, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(
                f"the cluster: still not {what} after {timeout:.0f}s (logs in {STATE_DIR}/logs/)"
            )
        time.sleep(0.3)


def streaming(ports: Ports, *, synchronous: bool) -> bool:
    """Every member runs, one leads, and the others stream from it (the synchronous standby, when asked)."""
    found = members(ports)
    if len(found) != len(MEMBERS):
        return False
    roles = sorted(member.get("role", "") for member in found)
    if roles.count("leader") != 1:
        return False
    standbys = [member for member in found if member.get("role") != "leader"]
    wanted = "sync_standby" if synchronous else ("replica", "sync_standby")
    return all(
        member.get("state") in ("running", "streaming") and member.get("role") in wanted
        for member in standbys
    )


def patronictl(*args: str) -> str:
    """`patronictl` with member 1's configuration (any member's reaches the same etcd)."""
    result = subprocess.run(  # noqa: S603
        [program("patronictl"), "-c", str(patroni_conf_path(0)), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"patronictl {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def kill_member(state: State, index: int) -> None:
    """The machine dies: SIGKILL to member `index`'s Patroni and to its PostgreSQL (its own session)."""
    name = MEMBERS[index]
    postmaster = _postmaster_pid(index)
    pid = state.pids.pop(f"patroni-{name}", None)
    if pid is not None:
        kill_group(pid, signal.SIGKILL)
    if postmaster is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(postmaster)
            if group != os.getpgrp():
                os.killpg(group, signal.SIGKILL)
            os.kill(postmaster, signal.SIGKILL)
    state.save()


def stop_member(state: State, index: int) -> None:
    """A clean stop: Patroni stops its PostgreSQL (fast) and leaves the cluster."""
    pid = state.pids.pop(f"patroni-{MEMBERS[index]}", None)
    if pid is not None:
        stop_pid(pid, timeout=60)
    state.save()


def _postmaster_pid(index: int) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((member_dir(index) / "postmaster.pid").read_text().split()[0])
    return None


def running(state: State, index: int) -> bool:
    pid = state.pids.get(f"patroni-{MEMBERS[index]}")
    if pid is None:
        return False
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def switchover(state: State) -> str:
    """`patronictl switchover` from the leader to the other member; returns the new leader's name."""
    current = leader(state.ports)
    if current is None:
        raise SystemExit("no member leads: nothing to switch over from")
    candidate = MEMBERS[1 - current]
    patronictl("switchover", SCOPE, "--leader", MEMBERS[current], "--candidate", candidate, "--force")
    return candidate


def describe(ports: Ports) -> str:
    """The members as `make cluster` prints them: name, port, role, state, lag, timeline."""
    lines = []
    for member in members(ports):
        lag = member.get("lag", 0)
        lines.append(
            f"  {member.get('name', '?'):<6} {member.get('host', '')}:{member.get('port', '')}"
            f"  {member.get('role', '?'):<12} {member.get('state', '?'):<9}"
            f" timeline {member.get('timeline', '-')}  lag {lag if lag != '' else 0}"
        )
    return "\n".join(lines) or "  (no member answers)"
