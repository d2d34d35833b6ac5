"""Every answer says its request id in `X-Request-ID`, and every error answer in its last detail.

The client's own id is kept when it is a bounded run of safe characters; any
other is replaced by a new `req_…`, so a header, a log line and a JSON body
never repeat what a client could smuggle into them.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client, override_settings
from rest_framework.test import APIClient

from core.api.envelope import error_body
from core.errors import MAX_ERROR_DETAILS
from tests.support.api import assert_error, post, post_raw, status_and_body
from tests.support.commands import run_python
from tests.support.envelope import error_details, request_id_detail

MADE = re.compile(r"^req_[0-9a-hjkmnp-tv-z]{26}$")
SUMMARY = "capacity/summary"


def answered_id(response: Any) -> str:
    value = response["X-Request-ID"]
    assert isinstance(value, str) and value
    return value


@pytest.mark.django_db
@pytest.mark.parametrize("sent", ["a", "trace-0123456789abcdef", "2f1c.9:AB_cd-x", "x" * 128])
def test_a_safe_client_id_is_answered_as_sent(owner_client: APIClient, sent: str) -> None:
    response = owner_client.post(
        "/api/compute/capacity/summary", {"tenantId": "acme"}, format="json", HTTP_X_REQUEST_ID=sent
    )
    assert response.status_code == 200
    assert answered_id(response) == sent


@pytest.mark.django_db
@pytest.mark.parametrize(
    "sent",
    [
        "x" * 129,  # too long
        "abc\ndef",  # a newline: a forged log line or header
        "two words",
        "",
        "tab\there",
        'quote"d',
        "<script>",
        "é",
        "a/b",
    ],
)
def test_a_hostile_client_id_is_replaced_by_a_new_one(owner_client: APIClient, sent: str) -> None:
    response = owner_client.post(
        "/api/compute/capacity/summary", {"tenantId": "acme"}, format="json", HTTP_X_REQUEST_ID=sent
    )
    assert response.status_code == 200
    assert MADE.match(answered_id(response)), answered_id(response)


@pytest.mark.django_db
def test_without_a_client_id_each_request_gets_its_own(owner_client: APIClient) -> None:
    ids = {answered_id(post(owner_client, SUMMARY, {"tenantId": "acme"})) for _ in range(3)}
    assert len(ids) == 3 and all(MADE.match(value) for value in ids)


@pytest.mark.django_db
def test_an_api_error_ends_its_details_with_the_request_id_of_its_header(owner_client: APIClient) -> None:
    response = post(owner_client, SUMMARY, {"tenantId": "acme", "color": "red"})
    status, body = status_and_body(response)
    assert_error(status, body, "INVALID_INPUT", 400)
    assert body["error"]["details"][-1] == {"field": "requestId", "message": answered_id(response)}
    assert error_details(body) == [{"field": "color", "message": "unknown field"}]


@pytest.mark.django_db
def test_the_clients_id_is_the_one_an_error_names(anonymous_client: APIClient) -> None:
    response = anonymous_client.post(
        "/api/compute/capacity/summary", {"tenantId": "acme"}, format="json", HTTP_X_REQUEST_ID="ticket-4711"
    )
    status, body = status_and_body(response)
    assert_error(status, body, "UNAUTHENTICATED", 401)
    assert response["X-Request-ID"] == "ticket-4711"
    assert body["error"]["details"] == [{"field": "requestId", "message": "ticket-4711"}]


@pytest.mark.django_db
def test_the_request_id_comes_after_the_cap_on_details_and_is_never_cut(owner_client: APIClient) -> None:
    body = json.dumps({"tenantId": "acme", **{f"k{i}": 0 for i in range(50)}})
    response = post_raw(owner_client, SUMMARY, body)
    status, answer = status_and_body(response)
    assert_error(status, answer, "INVALID_INPUT", 400)
    details = answer["error"]["details"]
    # The first MAX_ERROR_DETAILS, the count of the rest, then the request id.
    assert len(details) == MAX_ERROR_DETAILS + 2
    assert details[-2]["message"].startswith(f"and {50 - MAX_ERROR_DETAILS} more")
    assert request_id_detail(details) == answered_id(response)


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/compute/capacity/nope", "/api/nope"])
def test_an_unknown_api_url_answers_the_envelope_with_the_request_id(path: str) -> None:
    response = APIClient().post(path, b"{}", content_type="application/json", HTTP_X_REQUEST_ID="r-404")
    status, body = status_and_body(response)
    assert_error(status, body, "NOT_FOUND", 404)
    assert response["X-Request-ID"] == "r-404"
    assert body["error"]["details"] == [{"field": "requestId", "message": "r-404"}]


@pytest.mark.django_db
def test_a_page_outside_the_api_that_does_not_exist_has_the_header_too() -> None:
    response = Client().get("/no-such-page", HTTP_X_REQUEST_ID="page-1")
    assert response.status_code == 404
    assert response["X-Request-ID"] == "page-1"


@pytest.mark.django_db
def test_the_admin_login_page_and_the_health_check_have_the_header() -> None:
    client = Client()
    landing = client.get("/")
    assert landing.status_code == 200 and MADE.match(answered_id(landing))
    login = client.get("/admin/", follow=True)
    assert login.redirect_chain and login.redirect_chain[-1][0].startswith("/admin/login/")
    assert login.status_code == 200 and MADE.match(answered_id(login))
    health = client.get("/healthz", HTTP_X_REQUEST_ID="probe-7")
    assert health.status_code in (200, 503) and health["X-Request-ID"] == "probe-7"


def test_an_error_body_made_outside_a_request_has_no_request_id() -> None:
    """A command or the worker renders the envelope as before: there is no request to name."""
    assert error_body("INVALID_INPUT", "x: bad", [{"field": "x", "message": "bad"}]) == {
        "error": {"code": "INVALID_INPUT", "message": "x: bad", "details": [{"field": "x", "message": "bad"}]}
    }


def agents_middleware() -> list[str]:
    """The middleware of the agents process, as its settings make it (`AGENTS_PROCESS=1`)."""
    env = {
        **os.environ,
        "AGENTS_PROCESS": "1",
        "DATABASE_OFFLINE": "1",
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
    }
    script = (
        "import django, json; django.setup(); from django.conf import settings; "
        "print(json.dumps(settings.MIDDLEWARE))"
    )
    result = run_python("-c", script, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    middleware: list[str] = json.loads(result.stdout.splitlines()[-1])
    return middleware


@pytest.mark.django_db(transaction=True)
def test_the_agents_process_answers_the_request_id_through_its_async_chain() -> None:
    middleware = agents_middleware()
    assert "core.request_id.RequestIdMiddleware" in middleware

    async def scenario() -> tuple[Any, Any]:
        client = AsyncClient()
        refused = await client.post(
            "/api/compute/nodes/assignments",
            data=json.dumps({"nodeId": "node_x", "after": 0, "waitMs": 0}),
            content_type="application/json",
            headers={"X-Request-ID": "agent-poll-1"},
        )
        health = await client.get("/healthz")
        return refused, health

    with override_settings(ROOT_URLCONF="config.agents_urls", MIDDLEWARE=middleware):
        refused, health = async_to_sync(scenario)()
    assert refused.status_code == 401 and refused["X-Request-ID"] == "agent-poll-1"
    assert json.loads(refused.content)["error"]["details"][-1] == {
        "field": "requestId",
        "message": "agent-poll-1",
    }
    assert MADE.match(health["X-Request-ID"])
