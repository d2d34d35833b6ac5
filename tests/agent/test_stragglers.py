"""No stragglers between tenants: a process on a GPU from outside every reservation holds that GPU back.

The agent runs in-process over the stand-in `pynvml` (its real NVML code
path), with a stand-in cgroup root, against a live server: what the operator
and a tenant see is the pool's `unhealthy` count in `capacity/byPool` and the
node's audit events.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from better_compute_agent.client import AgentClient
from better_compute_agent.daemon import Agent
from better_compute_agent.discovery.nvml import NvmlSource
from core.models import AuditEvent, Tenant
from core.services import token_issue
from tests.agent.fake_pynvml import FakeNvml, h100
from tests.agent.test_agent_end_to_end import rows
from tests.agent.test_discovery import host  # noqa: F401 - the host's /proc and /sys, a fixture
from tests.agent.test_enforce import settings
from tests.support.agents import cgroup_stand_in
from tests.support.factories import PoolFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([h100(0), h100(1)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_a_process_outside_every_reservation_marks_its_gpu_unhealthy_until_it_is_gone(
    live_server: Any,
    tmp_path: Path,
    host: dict[str, Path],  # noqa: F811 - the fixture imported above
    fake_nvml: FakeNvml,
    owner_tenant: Tenant,
    owner_client: APIClient,
) -> None:
    pool = PoolFactory(owner=owner_tenant, sharing="exclusive", gpu_model="H100")
    _, token = token_issue(tenant_id=None, role="node-agent", scope_pool_id=pool.pk)
    cgroup_stand_in(tmp_path / "cgroup")
    agent = Agent(
        settings(tmp_path, url=live_server.url, token=token, pool=pool.pk, snapshot=None),
        NvmlSource(proc=host["proc"], sys=host["sys"], dev=Path("/dev")),
        AgentClient(live_server.url, token),
    )
    intruder = subprocess.Popen(["sleep", "600"])
    count_unhealthy: Callable[[], int] = lambda: rows(owner_client, pool)["gpu"]["unhealthy"]  # noqa: E731
    try:
        agent.enforcement()
        agent.once()
        assert count_unhealthy() == 0
        fake_nvml.gpus[1].processes.append(intruder.pid)
        agent.read_host()
        agent.send_report()
        reason = f"in use outside any reservation (pid {intruder.pid}, sleep)"
        assert agent.report["gpus"][1]["health"] == {"healthy": False, "reason": reason, "clears": True}
        assert count_unhealthy() == 1
        event = AuditEvent.objects.filter(action="device.reported-unhealthy").latest("id")
        assert event.reason == reason and event.data["device"] == h100(1).uuid
        # The process goes: the next report no longer holds the GPU back, and it is healthy again.
        intruder.kill()
        intruder.wait()
        fake_nvml.gpus[1].processes.clear()
        assert agent.read_host()
        agent.send_report()
        assert count_unhealthy() == 0
    finally:
        intruder.kill()
        intruder.wait()
        agent.close()
