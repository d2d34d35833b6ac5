"""Fixtures of the cross-cutting guarantees: the torture fleet the concurrency and fault runs fight over,
the commit hooks and gates the guards' races are held with, and the world schemathesis calls into."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.signals import request_finished, request_started
from django.db import close_old_connections

from core.services import token_issue
from reservations.placer import option
from tests.support.factories import DeviceFactory, NodeFactory, OfferingFactory, PoolFactory, TenantFactory
from tests.support.races import Hooks, open_every_gate
from tests.support.torture.fleet import Fleet, fleet_logged


@pytest.fixture
def fleet(transactional_db: Any) -> Iterator[Fleet]:
    """The torture fleet, with the commit-order log installed for the length of the test."""
    with fleet_logged() as built:
        yield built


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    """The commit's hooks, empty before and after the test."""
    option.HOOKS.clear()
    yield option.HOOKS
    option.HOOKS.clear()


@pytest.fixture(autouse=True)
def open_every_gate_at_the_end() -> Iterator[None]:
    """A failing test (a guard removed) lets its held threads go at once instead of after JOIN_SECONDS."""
    yield
    open_every_gate()


@pytest.fixture
def in_process_requests() -> Iterator[None]:
    """Keep the test's connection (and transaction) across WSGI calls, as Django's test client does.

    Django closes database connections when a request finishes; schemathesis
    calls the WSGI application directly, so that would close the connection
    the test's transaction lives on.

    Schemathesis never closes the responses it reads, so `request_finished`
    never comes, and a create's deliveries, held until the response is written
    (`reservations.delivery.outbox`), would stay held on this thread for the
    tests that follow. At the end the signal is sent once, as a server closing
    those responses would.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_finished.send(sender=None)
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def personas(db: Any, in_process_requests: None) -> dict[str, str | None]:
    """Tokens for schemathesis's calls, and a world where generated ids sometimes hit something."""
    acme = TenantFactory(id="acme")
    pool = PoolFactory(owner=acme)
    OfferingFactory(pool=pool, tenant=TenantFactory(id="beta"))
    node = NodeFactory(pool=pool)
    for _ in range(2):
        DeviceFactory(node=node)
    return {
        "operator": token_issue(tenant_id=None, role="operator", name="fuzz operator")[1],
        "member": token_issue(tenant_id="acme", role="member", name="fuzz member")[1],
        "none": None,
    }
