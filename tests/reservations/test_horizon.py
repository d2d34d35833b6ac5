"""The booking horizon: a start at most `CAPACITY_MAX_START_AHEAD` after `compute_now()` (issue 11, item 3).

Preview and create share one validation path, so both refuse a start past the
horizon with `INVALID_INPUT` naming `start`; the end is then bounded by the
horizon plus the longest duration (366 days).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from core.clock import compute_now, to_millis
from core.constants import MAX_TIME_MS
from core.durations import MAX_SECONDS
from core.errors import InvalidInput
from inventory.models import Node, Pool
from reservations.placer.plan import placement_window
from reservations.request.parse import parse_reservation_request
from reservations.services import reservation_create
from tests.support.api import invalid_fields, post_json, reservation_body
from tests.support.factories import PoolFactory
from tests.support.placement import gpu_request, make_node

YEAR_SECONDS = 365 * 86400


def test_the_default_horizon_is_one_year() -> None:
    assert settings.CAPACITY_MAX_START_AHEAD == YEAR_SECONDS


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["capacity/preview", "reservations/create"])
def test_a_start_thousands_of_years_ahead_is_invalid_input_naming_start(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node, method: str
) -> None:
    status, body = post_json(owner_client, method, reservation_body(owned_pool, "acme", start=MAX_TIME_MS))
    assert invalid_fields(status, body) == {"start"}
    assert "ahead" in body["error"]["details"][0]["message"]


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["capacity/preview", "reservations/create"])
def test_a_start_just_past_the_horizon_is_refused_and_one_inside_it_is_not(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node, method: str
) -> None:
    now_ms = to_millis(compute_now())
    assert now_ms is not None
    past = now_ms + (YEAR_SECONDS + 3600) * 1000
    status, body = post_json(owner_client, method, reservation_body(owned_pool, "acme", "k1", start=past))
    assert invalid_fields(status, body) == {"start"}
    inside = now_ms + (YEAR_SECONDS - 3600) * 1000
    status, body = post_json(owner_client, method, reservation_body(owned_pool, "acme", "k2", start=inside))
    assert status in (200, 201), body


@pytest.mark.django_db
def test_the_horizon_comes_from_the_setting() -> None:
    now_ms = to_millis(compute_now())
    assert now_ms is not None
    body = {
        "tenantId": "acme",
        "poolId": "pool_01k0000000000000000000000a",
        "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h",
        "idempotencyKey": "k",
        "start": now_ms + 2 * 3600 * 1000,
    }
    assert parse_reservation_request(body, now_ms=now_ms).start_ms == body["start"]
    with override_settings(CAPACITY_MAX_START_AHEAD=3600), pytest.raises(InvalidInput) as caught:
        parse_reservation_request(body, now_ms=now_ms)
    assert [d["field"] for d in caught.value.details] == ["start"]
    assert caught.value.details[0]["message"] == "must not be more than 1 hour ahead"


@pytest.mark.django_db
def test_the_end_is_at_most_the_horizon_plus_the_longest_duration() -> None:
    pool = PoolFactory()
    now = compute_now()
    start = now + timedelta(seconds=YEAR_SECONDS)
    window = placement_window(
        request=gpu_request(pool, 1, start_ms=to_millis(start), duration_seconds=MAX_SECONDS), now=now
    )
    assert window.end - now <= timedelta(seconds=YEAR_SECONDS + MAX_SECONDS)


@pytest.mark.django_db
def test_a_service_caller_cannot_book_past_the_horizon_either() -> None:
    """The services (CLI, scripts) skip the body's parser: the window refuses the start too."""
    pool = PoolFactory()
    make_node(pool, gpus=1)
    far = compute_now() + timedelta(seconds=YEAR_SECONDS + 60)
    with pytest.raises(InvalidInput) as caught:
        reservation_create(request=gpu_request(pool, 1, start_ms=to_millis(far)), actor="t")
    assert [d["field"] for d in caught.value.details] == ["start"]
