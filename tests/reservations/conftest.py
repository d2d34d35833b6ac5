"""Fixtures of the reservations' tests: this connection's clock, and a node booked now and later (the node
events' starting point)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from core.clock import set_clock_offset
from inventory.models import Node, Pool
from reservations.rollups.recount import rollup_rebuild
from tests.support.api import post, reservation_body
from tests.support.clock import HOUR_MS, now_ms
from tests.support.placement import make_node


@pytest.fixture
def clock() -> Iterator[Callable[[timedelta], None]]:
    """Moves this connection's clock; put back when the test ends (the connection outlives it)."""
    yield lambda offset: set_clock_offset(offset)
    set_clock_offset(timedelta(0))


@pytest.fixture
def booked(owner_client: APIClient, owned_pool: Pool) -> Node:
    """A node with 4 GPUs and 64 vCPUs: 2 GPUs and 8 vCPUs run now, 1 GPU is booked from an hour on."""
    node = make_node(owned_pool, gpus=4, resources={"vcpu": 64})
    rollup_rebuild(pool_id=owned_pool.id)
    now = reservation_body(owned_pool, "acme", "now", gpus=2, resources={"vcpu": 8})
    later = reservation_body(owned_pool, "acme", "later", gpus=1, start=now_ms() + HOUR_MS)
    for body in (now, later):
        created = post(owner_client, "reservations/create", body)
        assert created.status_code == 201, created.json()
    return node
