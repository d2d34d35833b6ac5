"""Shared personas: a tenant that owns a pool, one it is offered to, an outsider, an operator, a node agent;
the admin's superuser; and a browser.

Tokens are issued through `core.services.token_issue`, so every API test goes
through the real bearer authentication and the real decisions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient
from selenium.webdriver.remote.webdriver import WebDriver

from core.models import Tenant
from core.services import token_issue
from inventory.models import Node, Pool
from tests.support.api import ClientFor, bearer_client
from tests.support.browser import headless_chromium
from tests.support.factories import DeviceFactory, NodeFactory, OfferingFactory, PoolFactory, TenantFactory


@pytest.fixture
def owner_tenant(db: Any) -> Tenant:
    """Owns `owned_pool` and `archived_pool`."""
    return TenantFactory.create(id="acme", name="Acme Corp")


@pytest.fixture
def offered_tenant(db: Any) -> Tenant:
    """Is offered `owned_pool` (and `archived_pool`, which it must not see)."""
    return TenantFactory.create(id="beta", name="Beta Labs")


@pytest.fixture
def outsider_tenant(db: Any) -> Tenant:
    """Neither owns nor is offered anything."""
    return TenantFactory.create(id="gamma", name="Gamma Inc")


@pytest.fixture
def owned_pool(owner_tenant: Tenant, offered_tenant: Tenant) -> Pool:
    pool = PoolFactory.create(owner=owner_tenant, name="h100-east", gpu_model="H100")
    OfferingFactory.create(pool=pool, tenant=offered_tenant)
    return pool


@pytest.fixture
def archived_pool(owner_tenant: Tenant, offered_tenant: Tenant) -> Pool:
    pool = PoolFactory.create(
        owner=owner_tenant, name="h100-old", gpu_model="H100", archived_at=timezone.now()
    )
    OfferingFactory.create(pool=pool, tenant=offered_tenant)
    return pool


@pytest.fixture
def gpu_node(owned_pool: Pool) -> Node:
    """A schedulable host in `owned_pool` with eight whole H100s."""
    node = NodeFactory.create(pool=owned_pool, hostname="gpu-a-001")
    for index in range(8):
        DeviceFactory.create(
            node=node, attributes={"gpuModel": "H100", "vramGiB": 80, "numaNode": index // 4}
        )
    return node


@pytest.fixture
def api_client_for(db: Any) -> ClientFor:
    """`api_client_for("acme", "viewer")`, or `api_client_for(None, "operator")` for the platform."""

    def make(tenant_id: str | None, role: str) -> APIClient:
        _, secret = token_issue(tenant_id=tenant_id, role=role, name=f"test {role}@{tenant_id or 'platform'}")
        return bearer_client(secret)

    return make


@pytest.fixture
def anonymous_client() -> APIClient:
    return APIClient()


@pytest.fixture
def owner_client(api_client_for: ClientFor, owner_tenant: Tenant) -> APIClient:
    """A member of the owning tenant."""
    return api_client_for(owner_tenant.id, "member")


@pytest.fixture
def offered_client(api_client_for: ClientFor, offered_tenant: Tenant) -> APIClient:
    """A member of the tenant the pool is offered to."""
    return api_client_for(offered_tenant.id, "member")


@pytest.fixture
def outsider_client(api_client_for: ClientFor, outsider_tenant: Tenant) -> APIClient:
    """A member of a tenant that sees no pool."""
    return api_client_for(outsider_tenant.id, "member")


@pytest.fixture
def operator_client(api_client_for: ClientFor) -> APIClient:
    """A platform operator: every tenant, and the node operations."""
    return api_client_for(None, "operator")


@pytest.fixture
def node_agent_client(api_client_for: ClientFor) -> APIClient:
    """A platform node agent: may report inventory, nothing else."""
    return api_client_for(None, "node-agent")


@pytest.fixture
def operator(admin_client: Client) -> Client:
    """The admin as a superuser: holds `inventory.operate_nodes` like every permission."""
    return admin_client


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Headless Chromium (`tests.support.browser`); skipped without it, failed under REQUIRE_BROWSER=1."""
    yield from headless_chromium()


@pytest.fixture(autouse=True)
def _forget_remembered_tokens() -> Iterator[None]:
    """Each test starts as a fresh process would: no token remembered (`core.auth_cache`).

    A test's tokens are rolled back with its transaction, which sends no NOTIFY.
    """
    from core.auth_cache import auth_cache_forget

    auth_cache_forget()
    yield
    auth_cache_forget()


@pytest.fixture(autouse=True)
def _fleet_just_scanned() -> Iterator[None]:
    """BookingRepair runs as in a worker that scanned the whole fleet a moment ago.

    So a test's `bookings_repair()` finds new problems only where a change
    named them (`RepairRequest`), as every run between the periodic scans
    does; a test of the scan passes `fleet=True`.
    """
    from reservations.lifecycle import repair_sweep

    repair_sweep._FLEET_SCAN.at = time.monotonic()
    yield
