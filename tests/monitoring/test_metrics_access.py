"""Who may scrape: a peer in METRICS_ALLOWED_NETS, or a `metrics` token from anywhere; nobody else."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from core.services import token_issue
from tests.monitoring.metrics import scrape
from tests.support.api import assert_error, post

pytestmark = pytest.mark.django_db

ELSEWHERE = {"REMOTE_ADDR": "203.0.113.7"}


def metrics_token() -> str:
    _, secret = token_issue(tenant_id=None, role="metrics", name="prometheus")
    return secret


def get(**extra: Any) -> Any:
    return Client().get("/metrics", **extra)


def test_loopback_scrapes_without_a_token() -> None:
    assert "better_compute_pool_capacity" in get().content.decode()
    assert get(REMOTE_ADDR="::1").status_code == 200


def test_another_address_needs_a_token_and_says_so_in_the_envelope() -> None:
    response = get(**ELSEWHERE)
    assert_error(response.status_code, response.json(), "UNAUTHENTICATED", 401)
    # Whoever sets X-Forwarded-For is not believed: the TCP peer decides.
    response = get(**ELSEWHERE, HTTP_X_FORWARDED_FOR="127.0.0.1")
    assert response.status_code == 401


def test_a_metrics_token_scrapes_from_anywhere() -> None:
    samples = scrape(**ELSEWHERE, HTTP_AUTHORIZATION=f"Bearer {metrics_token()}")
    assert "better_compute_worker_behind" in samples


def test_an_operator_token_is_not_a_metrics_token(api_client_for: Any) -> None:
    _, operator = token_issue(tenant_id=None, role="operator", name="ops")
    response = get(**ELSEWHERE, HTTP_AUTHORIZATION=f"Bearer {operator}")
    assert_error(response.status_code, response.json(), "PERMISSION_DENIED", 403)
    # Even from loopback a token is judged for what it is.
    response = get(HTTP_AUTHORIZATION=f"Bearer {operator}")
    assert response.status_code == 403


def test_a_metrics_token_grants_no_api_method(owned_pool: Any) -> None:
    from tests.support.api import bearer_client

    client = bearer_client(metrics_token())
    for method, body in (
        ("capacity/summary", {"tenantId": "acme"}),
        ("capacity/byPool", {"tenantId": "acme", "poolId": owned_pool.id}),
        ("nodes/list", {"poolId": owned_pool.id}),
    ):
        answer = post(client, method, body)
        assert answer.status_code in (403, 404), (method, answer.json())
        assert answer.json()["error"]["code"] in ("PERMISSION_DENIED", "NOT_FOUND")


def test_the_allowed_networks_are_a_setting(settings: Any) -> None:
    settings.METRICS_ALLOWED_NETS = ["203.0.113.0/24"]
    from operations.metrics.views import allowed_networks

    allowed_networks.cache_clear()
    assert get(**ELSEWHERE).status_code == 200
    assert get().status_code == 401


def test_issue_token_makes_a_metrics_token(capsys: Any) -> None:
    call_command("issue_token", "--role", "metrics", "--platform", "--name", "prometheus")
    secret = capsys.readouterr().out.strip()
    assert get(**ELSEWHERE, HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200
