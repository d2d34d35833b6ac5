"""Write rate limits per token and per tenant: 429 with Retry-After, shared by servers, nothing changed."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from core.ids import POOL, PROJECT, new_id
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


def token_writes(tenant_id: str) -> int:
    """The writes counted this minute for the tenant (one token in these tests)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(sum(count), 0) FROM core_ratewindow WHERE key = %s", [f"tenant:{tenant_id}"]
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db
def test_every_release_is_counted_once_whatever_it_answered_and_one_past_the_limit_changes_nothing(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node, settings: Any
) -> None:
    """The release counts in its own last statement; a release that did not get there counts alone."""
    settings.API_WRITES_PER_MINUTE_PER_TOKEN = 4
    tenant = owned_pool.owner_id
    assert create(owner_client, owned_pool, "r1").status_code == 201
    first = Reservation.objects.get(idempotency_key="r1")

    def release(reservation_id: str) -> Any:
        body = {"tenantId": tenant, "reservationId": reservation_id}
        return post(owner_client, "reservations/release", body)

    assert token_writes(tenant) == 1
    unknown = first.pk[:-1] + ("1" if first.pk[-1] == "0" else "0")
    assert release(unknown).status_code == 404  # rolled back: counted alone
    assert token_writes(tenant) == 2
    assert release(first.pk).status_code == 200  # counted in the release's statement
    assert token_writes(tenant) == 3
    assert release(first.pk).status_code == 200  # already released: counted alone
    assert token_writes(tenant) == 4
    assert create(owner_client, owned_pool, "r2").status_code == 429
    assert token_writes(tenant) == 5
    second = Reservation.objects.filter(idempotency_key="r2")
    assert not second.exists()
    # Past the limit, a release of a live reservation is refused and leaves it live.
    settings.API_WRITES_PER_MINUTE_PER_TOKEN = 6
    assert create(owner_client, owned_pool, "r3").status_code == 201
    live = Reservation.objects.get(idempotency_key="r3")
    refused = release(live.pk)
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "RATE_LIMITED")
    assert 1 <= int(refused["Retry-After"]) <= 60
    live.refresh_from_db()
    assert live.state == "active" and live.released_at is None
    assert token_writes(tenant) == 7  # the refused release counted once, not twice


@pytest.mark.django_db
def test_a_create_is_counted_in_the_statement_that_reads_its_pool_and_refused_last(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node, settings: Any
) -> None:
    """One round trip for the pool and the count; past the limit, the create's own refusals come first."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.API_WRITES_PER_MINUTE_PER_TOKEN = 1
    tenant = owned_pool.owner_id
    with CaptureQueriesContext(connection) as capture:
        assert create(owner_client, owned_pool, "c1").status_code == 201
    (counted,) = [q["sql"] for q in capture.captured_queries if "core_ratewindow" in q["sql"]]
    assert "inventory_pool" in counted
    assert token_writes(tenant) == 1
    # Past the limit: a pool the tenant cannot see, or a project that is not its own, is
    # answered as such (and counted), never as RATE_LIMITED.
    unseen = reservation_body(owned_pool, tenant, key="c2") | {"poolId": new_id(POOL)}
    missing = post(owner_client, "reservations/create", unseen)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "NOT_FOUND")
    stranger = reservation_body(owned_pool, tenant, key="c3") | {"projectId": new_id(PROJECT)}
    missing = post(owner_client, "reservations/create", stranger)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "NOT_FOUND")
    assert token_writes(tenant) == 3
    refused = create(owner_client, owned_pool, "c4")
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "RATE_LIMITED")
    assert not Reservation.objects.filter(idempotency_key="c4").exists()
    assert token_writes(tenant) == 4


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


@pytest.mark.django_db(transaction=True)
def test_a_count_on_its_own_commits_without_waiting_for_the_disk_and_a_write_s_transaction_still_waits(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from core.ratelimit import writes_count

    def synchronous_commit() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            return str(cursor.fetchone()[0])

    with CaptureQueriesContext(connection) as capture:
        writes_count(token_id="tok_alone", tenant_id="acme")
        assert create(owner_client, owned_pool, "unsynced").status_code == 201
    counts = [q["sql"] for q in capture.captured_queries if "core_ratewindow" in q["sql"]]
    assert len(counts) == 2 and all("'synchronous_commit', 'off', true" in sql for sql in counts)
    assert synchronous_commit() == "on"  # for that statement's own transaction only
    with transaction.atomic(), CaptureQueriesContext(connection) as capture:
        writes_count(token_id="tok_inside", tenant_id="acme")
        assert synchronous_commit() == "on"
    (inside,) = [q["sql"] for q in capture.captured_queries if "core_ratewindow" in q["sql"]]
    assert "synchronous_commit" not in inside
    assert token_writes("acme") == 3
