"""The torture run through the cluster, with its faults (tests/cluster/torture.py says what it checks).

It runs as its own process against the cluster's primary, as the API
replicas and the worker do, so that nothing of the test database is involved.
"""

from __future__ import annotations

import json

import pytest

from tests.cluster.client import Cluster
from tests.support.commands import run_python

pytestmark = pytest.mark.cluster


def test_the_torture_run_through_the_balancer_with_a_replica_killed_and_the_replica_stopped(
    cluster: Cluster,
) -> None:
    env = cluster.env | {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{cluster.primary_port}/postgres",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    result = run_python("-m", "tests.cluster.torture", "--base-url", cluster.base_url, env=env, timeout=1500)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    report = json.loads(lines[-1])
    print(f"\ncluster torture: {json.dumps(report)}")
    assert result.returncode == 0 and not report["problems"], "\n".join(report["problems"])
    # The faults were felt: requests were sent again, and the fill booked every GPU once.
    assert report["fill"]["allocatable"] == report["fill"]["reservations"] == report["fill"]["bookings"] > 0
    assert report["slowestRequestSeconds"] < 30
