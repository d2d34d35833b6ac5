"""The agents process's `nodes/assignments`: the same answers as the web's, waiting on a bell.

Its waits hold no database connection: fifty agents waiting at once leave the
server's connection count where it was.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.test import AsyncClient, override_settings
from rest_framework.test import APIClient

from core.models import Tenant
from core.services import token_issue
from inventory.models import Pool
from tests.operations.test_api_agents import agent_for, create, registered, reported
from tests.support.factories import PoolFactory

pytestmark = pytest.mark.django_db(transaction=True)

AGENTS_URLS = override_settings(
    ROOT_URLCONF="config.agents_urls", MIDDLEWARE=["django.middleware.security.SecurityMiddleware"]
)


async def poll(client: AsyncClient, token: str, body: Any) -> tuple[int, Any]:
    response = await client.post(
        "/api/compute/nodes/assignments",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    return response.status_code, json.loads(response.content)


def backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def world(owner_tenant: Tenant) -> tuple[Pool, str, str, APIClient]:
    pool = PoolFactory(owner=owner_tenant)
    token = token_issue(tenant_id=None, role="node-agent", scope_pool_id=pool.pk)[1]
    agent = agent_for(pool)
    node_id = registered(agent, pool)
    reported(agent, node_id)
    from tests.support.api import bearer_client

    owner = bearer_client(token_issue(tenant_id=owner_tenant.pk, role="member")[1])
    return pool, token, node_id, owner


def release(tenant_id: str, reservation_id: str) -> None:
    """Released by the service (not over HTTP: the agents process's URLconf serves the poll only)."""
    from reservations.models import Reservation
    from reservations.services import reservation_release

    reservation_release(reservation=Reservation(pk=reservation_id), actor="test", tenant_id=tenant_id)


def test_a_waiting_poll_answers_when_the_change_commits(world: tuple[Pool, str, str, APIClient]) -> None:
    pool, token, node_id, owner = world
    made = create(owner, pool, "poll-1")
    (assign,) = changes_now(owner, token, node_id)

    async def scenario() -> tuple[float, list[dict[str, Any]]]:
        client = AsyncClient()
        started = time.monotonic()
        body = {"nodeId": node_id, "after": assign["deliveryId"], "waitMs": 10_000}
        waiting = asyncio.ensure_future(poll(client, token, body))
        await asyncio.sleep(0.5)
        await sync_to_async(release, thread_sensitive=False)(pool.owner_id, made["id"])
        status, answer = await waiting
        assert status == 200, answer
        return time.monotonic() - started, answer["changes"]

    with AGENTS_URLS:
        waited, changes = async_to_sync(scenario)()
    assert [(c["kind"], c["reservationId"]) for c in changes] == [("shorten", made["id"])]
    assert 0.4 < waited < 3


def changes_now(_owner: APIClient, token: str, node_id: str) -> list[dict[str, Any]]:
    from tests.support.api import bearer_client, post_json

    status, body = post_json(bearer_client(token), "nodes/assignments", {"nodeId": node_id})
    assert status == 200, body
    found: list[dict[str, Any]] = body["changes"]
    return found


def test_errors_come_in_the_envelope(world: tuple[Pool, str, str, APIClient]) -> None:
    _pool, token, node_id, _owner = world

    async def scenario() -> list[tuple[int, Any]]:
        client = AsyncClient()
        answers = [
            await poll(client, "bc_not_a_token", {"nodeId": node_id}),
            await poll(client, token, {"nodeId": node_id, "waitMs": 99_999}),
            await poll(client, token, {"nodeId": "node_01k0000000000000000000000a"}),
        ]
        response = await client.get("/api/compute/nodes/assignments")
        return [*answers, (response.status_code, json.loads(response.content))]

    with AGENTS_URLS:
        answers = async_to_sync(scenario)()
    codes = [(status, body["error"]["code"]) for status, body in answers]
    assert codes == [
        (401, "UNAUTHENTICATED"),
        (400, "INVALID_INPUT"),
        (403, "PERMISSION_DENIED"),
        (405, "INVALID_INPUT"),
    ]
    assert answers[1][1]["error"]["details"][0]["field"] == "waitMs"


def test_fifty_waiting_polls_hold_no_database_connection(world: tuple[Pool, str, str, APIClient]) -> None:
    _pool, token, node_id, _owner = world
    before = backends()

    async def scenario() -> tuple[int, list[int]]:
        client = AsyncClient()
        polls = [
            asyncio.ensure_future(poll(client, token, {"nodeId": node_id, "waitMs": 2_000}))
            for _ in range(50)
        ]
        await asyncio.sleep(1.0)
        during = await sync_to_async(backends, thread_sensitive=False)()
        answers = await asyncio.gather(*polls)
        return during, [status for status, _ in answers]

    with AGENTS_URLS:
        during, statuses = async_to_sync(scenario)()
    assert statuses == [200] * 50
    # The bell's one LISTEN connection and the thread pool's few, not one per waiting poll.
    assert during - before < 15, (before, during)
