"""The API's envelope around every method: bodies that are not JSON objects, content types, size limits,
wrong HTTP methods and URLs, an error outside a view; and the published schema and docs page."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from django.test import RequestFactory
from rest_framework.test import APIClient

from core.api.envelope import handler500
from tests.support.api import api_url, assert_error, invalid_fields, post_raw, status_and_body

# Every method answers in the same envelope; the summary is the one these bodies are sent to.
SUMMARY = "capacity/summary"


# --- The body itself ----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("data", ["{not json", "{'tenantId': 'acme'}", '{"tenantId": NaN}', "\xff"])
def test_a_body_that_is_not_json_is_invalid_input(owner_client: APIClient, data: str) -> None:
    assert invalid_fields(*status_and_body(post_raw(owner_client, SUMMARY, data))) == {"body"}


@pytest.mark.django_db
@pytest.mark.parametrize("data", ['["acme"]', '"acme"', "42", "null", "true"])
def test_a_json_body_that_is_not_an_object_is_invalid_input(owner_client: APIClient, data: str) -> None:
    assert invalid_fields(*status_and_body(post_raw(owner_client, SUMMARY, data))) == {"body"}


@pytest.mark.django_db
def test_an_empty_body_is_invalid_input(owner_client: APIClient) -> None:
    assert invalid_fields(*status_and_body(post_raw(owner_client, SUMMARY, ""))) == {"body"}


@pytest.mark.django_db
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_a_wrong_content_type_is_invalid_input(owner_client: APIClient, content_type: str) -> None:
    status, body = status_and_body(post_raw(owner_client, SUMMARY, '{"tenantId": "acme"}', content_type))
    assert invalid_fields(status, body) == {"body"}
    assert "Content-Type" in body["error"]["message"]


@pytest.mark.django_db
def test_json_with_a_charset_is_accepted(owner_client: APIClient, owner_tenant: Any) -> None:
    status, _ = status_and_body(
        post_raw(owner_client, SUMMARY, '{"tenantId": "acme"}', "application/json; charset=utf-8")
    )
    assert status == 200


@pytest.mark.django_db
def test_a_body_over_the_size_limit_is_invalid_input(owner_client: APIClient, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    padding = "x" * 2048
    status, body = status_and_body(
        post_raw(owner_client, SUMMARY, json.dumps({"tenantId": "acme", "pad": padding}))
    )
    assert invalid_fields(status, body) == {"body"}
    assert "too large" in body["error"]["message"]


@pytest.mark.django_db
def test_a_body_over_the_default_limit_is_invalid_input(owner_client: APIClient) -> None:
    huge = json.dumps({"tenantId": "acme", "pad": "x" * (1_100_000)})
    status, body = status_and_body(post_raw(owner_client, SUMMARY, huge))
    assert invalid_fields(status, body) == {"body"}


@pytest.mark.django_db
def test_a_get_is_method_not_allowed_in_the_envelope(owner_client: APIClient) -> None:
    response = owner_client.get(api_url(SUMMARY))
    assert_error(response.status_code, response.json(), "INVALID_INPUT", 405)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/api/compute/capacity/nope",
        "/api/compute/nope/summary",
        "/api/whatever",
        "/api/compute/capacity/summary/",
    ],
)
def test_an_unknown_api_url_is_not_found_in_the_envelope(owner_client: APIClient, path: str) -> None:
    response = owner_client.post(path, {"tenantId": "acme"}, format="json")
    assert response["Content-Type"].startswith("application/json")
    assert_error(response.status_code, response.json(), "NOT_FOUND", 404)


@pytest.mark.parametrize("host", ["", "evil.example", "bad host"])
def test_a_host_header_the_service_does_not_serve_is_refused_in_the_envelope(
    owner_client: APIClient, host: str
) -> None:
    # Django refuses the Host in its middleware, before any view; the admin keeps Django's page.
    response = owner_client.post(
        "/api/compute/capacity/summary", {"tenantId": "acme"}, format="json", HTTP_HOST=host
    )
    assert response["Content-Type"].startswith("application/json")
    assert_error(response.status_code, response.json(), "INVALID_INPUT", 400)
    assert response.json()["error"]["message"] == "the Host header names no host this service answers to"
    admin = owner_client.get("/admin/login/", HTTP_HOST=host)
    assert admin.status_code == 400 and admin["Content-Type"].startswith("text/html")


def test_an_error_outside_a_view_is_internal_in_the_envelope_without_a_traceback() -> None:
    response = handler500(RequestFactory().post("/api/compute/capacity/summary"))
    body = json.loads(response.content)
    assert_error(response.status_code, body, "INTERNAL", 500)


# --- The machine-readable schema ----------------------------------------------------------


@pytest.mark.django_db
def test_the_schema_lists_every_method_with_its_request_body() -> None:
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    methods = {
        "/api/compute/capacity/summary",
        "/api/compute/capacity/byPool",
        "/api/compute/pools/capacity",
        "/api/compute/nodes/get",
        "/api/compute/nodes/cordon",
        "/api/compute/nodes/uncordon",
        "/api/compute/nodes/taint",
        "/api/compute/nodes/untaint",
        "/api/compute/nodes/setMaintenance",
        "/api/compute/devices/setHealth",
        "/api/compute/inventory/report",
    }
    assert methods <= set(schema["paths"])
    for path in methods:
        operation = schema["paths"][path]["post"]
        assert "application/json" in operation["requestBody"]["content"], path
        assert "200" in operation["responses"], path
    assert schema["paths"]["/api/compute/capacity/byPool"]["post"]["operationId"] == "capacity.byPool"


@pytest.mark.django_db
def test_the_docs_page_renders_offline() -> None:
    response = APIClient().get("/api/docs/")
    assert response.status_code == 200
    page = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert any(asset.endswith("swagger-ui-bundle.js") for asset in assets)
    # Every asset is a local static file (the sidecar), none from a CDN.
    for asset in assets:
        assert asset.startswith(settings.STATIC_URL) or asset.startswith("/" + settings.STATIC_URL), asset
        assert finders.find(asset.split(settings.STATIC_URL, 1)[1]) is not None, asset
