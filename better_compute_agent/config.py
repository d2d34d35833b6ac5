"""Where the agent's settings come from: flags, then the environment, then the defaults.

| flag | environment | default |
| --- | --- | --- |
| `--url` | `BETTER_COMPUTE_URL` | `http://127.0.0.1:8000` |
| `--token` | `BETTER_COMPUTE_TOKEN` | (required to talk to the service) |
| `--pool` | `BETTER_COMPUTE_POOL` | (required to register) |
| `--state-dir` | `BETTER_COMPUTE_AGENT_STATE` | `/var/lib/better-compute-agent` |
| `--cdi-dir` | `BETTER_COMPUTE_AGENT_CDI_DIR` | `/var/run/cdi` |
| `--snapshot` | `BETTER_COMPUTE_AGENT_SNAPSHOT` | (none: NVML, /proc and /sys) |
| `--heartbeat-seconds` | `BETTER_COMPUTE_AGENT_HEARTBEAT` | 30 |
| `--label k=v` (repeated) | `BETTER_COMPUTE_AGENT_LABELS` (`k=v,k=v`) | none |
| `--cgroup-root` | `BETTER_COMPUTE_AGENT_CGROUP_ROOT` | the agent's own (`Delegate=yes`) |
| `--kill-grace` | `BETTER_COMPUTE_AGENT_KILL_GRACE` | 30 (SIGTERM to SIGKILL, seconds) |

An empty variable counts as unset, as in the tenant CLI.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_STATE_DIR = Path("/var/lib/better-compute-agent")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
DEFAULT_HEARTBEAT_SECONDS = 30.0
DEFAULT_KILL_GRACE_SECONDS = 30.0


class ConfigError(Exception):
    """The settings cannot be used; the message says what to set."""


@dataclass(frozen=True)
class AgentSettings:
    url: str
    token: str | None
    pool: str | None
    state_dir: Path
    cdi_dir: Path
    snapshot: Path | None
    heartbeat_seconds: float
    labels: dict[str, str]
    cgroup_root: Path | None = None
    kill_grace: float = DEFAULT_KILL_GRACE_SECONDS

    def require(self, name: str) -> str:
        value = getattr(self, name)
        if not value:
            flag, env = {
                "token": ("--token", "BETTER_COMPUTE_TOKEN"),
                "pool": ("--pool", "BETTER_COMPUTE_POOL"),
            }[name]
            hint = " (an operator issues one: manage.py issue_token --platform --role node-agent --pool POOL)"
            raise ConfigError(f"no {name}: pass {flag} or set {env}" + (hint if name == "token" else ""))
        return str(value)


def _labels(pairs: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"a label is key=value, not {pair!r}")
        labels[key] = value
    return labels


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> AgentSettings:
    """Flags beat the environment, which beats the defaults."""

    def pick(flag: object, env: str) -> str | None:
        if flag not in (None, ""):
            return str(flag)
        return environ.get(env) or None

    heartbeat = pick(getattr(args, "heartbeat_seconds", None), "BETTER_COMPUTE_AGENT_HEARTBEAT")
    try:
        heartbeat_seconds = float(heartbeat) if heartbeat else DEFAULT_HEARTBEAT_SECONDS
    except ValueError:
        raise ConfigError(f"the heartbeat is seconds, not {heartbeat!r}") from None
    if heartbeat_seconds <= 0:
        raise ConfigError("the heartbeat must be more than 0 seconds")
    grace = pick(getattr(args, "kill_grace", None), "BETTER_COMPUTE_AGENT_KILL_GRACE")
    try:
        kill_grace = float(grace) if grace else DEFAULT_KILL_GRACE_SECONDS
    except ValueError:
        raise ConfigError(f"the kill grace is seconds, not {grace!r}") from None
    if not 0 <= kill_grace <= 3600:
        raise ConfigError("the kill grace must be between 0 and 3600 seconds")
    cgroup_root = pick(getattr(args, "cgroup_root", None), "BETTER_COMPUTE_AGENT_CGROUP_ROOT")
    label_pairs = list(getattr(args, "label", None) or [])
    env_labels = environ.get("BETTER_COMPUTE_AGENT_LABELS") or ""
    if not label_pairs and env_labels:
        label_pairs = [pair.strip() for pair in env_labels.split(",") if pair.strip()]
    snapshot = pick(getattr(args, "snapshot", None), "BETTER_COMPUTE_AGENT_SNAPSHOT")
    return AgentSettings(
        url=pick(getattr(args, "url", None), "BETTER_COMPUTE_URL") or DEFAULT_URL,
        token=pick(getattr(args, "token", None), "BETTER_COMPUTE_TOKEN"),
        pool=pick(getattr(args, "pool", None), "BETTER_COMPUTE_POOL"),
        state_dir=Path(
            pick(getattr(args, "state_dir", None), "BETTER_COMPUTE_AGENT_STATE") or DEFAULT_STATE_DIR
        ),
        cdi_dir=Path(pick(getattr(args, "cdi_dir", None), "BETTER_COMPUTE_AGENT_CDI_DIR") or DEFAULT_CDI_DIR),
        snapshot=Path(snapshot) if snapshot else None,
        heartbeat_seconds=heartbeat_seconds,
        labels=_labels(label_pairs),
        cgroup_root=Path(cgroup_root) if cgroup_root else None,
        kill_grace=kill_grace,
    )
