"""The primary dies under load, and a switchover: Patroni moves the leader, nothing answered is lost.

Each runs `python -m tests.cluster.failover` (it says what it checks) against
the cluster's leader frontend, as the API replicas and the worker reach it,
and prints its report: how long writes were refused, and the answers clients
saw meanwhile.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster.client import Cluster
from tests.support.commands import run_python

pytestmark = pytest.mark.cluster


def _run(cluster: Cluster, fault: str) -> dict[str, Any]:
    env = cluster.env | {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{cluster.primary_port}/postgres",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    result = run_python(
        "-m", "tests.cluster.failover", "--base-url", cluster.base_url, "--fault", fault, env=env, timeout=600
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    report: dict[str, Any] = json.loads(lines[-1])
    print(f"\n{fault}: {json.dumps(report)}")
    assert result.returncode == 0 and not report["problems"], "\n".join(report["problems"])
    return report


def test_the_leader_killed_under_load_loses_nothing_answered_and_comes_back_as_a_standby(
    cluster: Cluster,
) -> None:
    report = _run(cluster, "kill-leader")
    # The fault was felt: writes were refused, retried, and answered again on the new leader.
    assert report["keysSentAgain"] > 0 and report["created"] > report["keysSentAgain"]
    assert report["writesTo"][0]["timeline"] < report["writesTo"][1]["timeline"]
    # The issue's bound with Patroni's default timings; the tests' tight ones stay well inside it.
    assert report["refusalWindowSeconds"] < 30
    members = cluster.members()
    assert sorted(member["role"] for member in members) == ["leader", "sync_standby"], members


def test_a_switchover_under_load_loses_nothing_and_refuses_writes_briefly(cluster: Cluster) -> None:
    report = _run(cluster, "switchover")
    assert report["writesTo"][0]["timeline"] < report["writesTo"][1]["timeline"]
    assert report["refusalWindowSeconds"] < 5
