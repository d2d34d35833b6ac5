"""Write rate limits per token and per tenant: 429 with Retry-After, shared by servers, nothing changed."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from core.ratelimit import rate_windows_prune
from inventory.models import Node, Pool
from reservations.models import Reservation
from tests.support.api import post, reservation_body


def create(client: APIClient, pool: Pool, key: str) -> Any:
    return post(client, "reservations/create", reservation_body(pool, pool.owner_id, key=key))


@pytest.mark.django_db
def test_a_token_past_its_write_limit_gets_429_with_retry_after_and_nothing_is_booked(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node, settings: Any
) -> None:
    settings.API_WRITES_PER_MINUTE_PER_TOKEN = 2
    assert create(owner_client, owned_pool, "a").status_code == 201
    assert create(owner_client, owned_pool, "b").status_code == 201
    refused = create(owner_client, owned_pool, "c")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "RATE_LIMITED"
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert not Reservation.objects.filter(idempotency_key="c").exists()
    # A release is a write too.
    first = Reservation.objects.get(idempotency_key="a")
    released = post(
        owner_client, "reservations/release", {"tenantId": first.tenant_id, "reservationId": first.pk}
    )
    assert released.status_code == 429


@pytest.mark.django_db
def test_the_tenant_limit_counts_every_token_of_the_tenant(
    api_client_for: Any, owned_pool: Pool, gpu_node: Node, settings: Any
) -> None:
    settings.API_WRITES_PER_MINUTE_PER_TENANT = 2
    tenant = owned_pool.owner_id
    clients = [api_client_for(tenant, "member") for _ in range(3)]
    assert create(clients[0], owned_pool, "t1").status_code == 201
    assert create(clients[1], owned_pool, "t2").status_code == 201
    refused = create(clients[2], owned_pool, "t3")
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "RATE_LIMITED")


@pytest.mark.django_db
def test_reads_and_refused_callers_are_not_counted(
    owner_client: APIClient, outsider_client: APIClient, owned_pool: Pool, gpu_node: Node, settings: Any
) -> None:
    settings.API_WRITES_PER_MINUTE_PER_TOKEN = 1
    for _ in range(3):
        assert post(owner_client, "capacity/summary", {"tenantId": owned_pool.owner_id}).status_code == 200
    # Another tenant's token is refused by the decision before anything is counted.
    for key in ("x", "y"):
        assert create(outsider_client, owned_pool, key).status_code == 403
    assert create(owner_client, owned_pool, "only").status_code == 201


@pytest.mark.django_db
def test_old_windows_are_pruned(owner_client: APIClient, owned_pool: Pool, gpu_node: Node) -> None:
    from django.db import connection

    assert create(owner_client, owned_pool, "p").status_code == 201
    with connection.cursor() as cursor:
        cursor.execute("UPDATE core_ratewindow SET window_start = window_start - interval '2 hours'")
    assert rate_windows_prune() == 2
