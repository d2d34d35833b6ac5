"""The HTTP API through DRF's test client: bearer clients, one way to call a method, the error envelope.

And `served`: one call through the WSGI application itself, as a server makes it.

Methods are named as the contract names them (`capacity/summary`,
`reservations/create`); `api_url` puts them under `/api/compute/`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any
from wsgiref.util import setup_testing_defaults

from django.core.wsgi import get_wsgi_application
from rest_framework.test import APIClient

from inventory.models import Pool
from tests.support.envelope import error_details

ClientFor = Callable[[str | None, str], APIClient]

API_PREFIX = "/api/compute/"


def bearer_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def api_url(method: str) -> str:
    return f"{API_PREFIX}{method}"


def post(client: APIClient, method: str, data: Any) -> Any:
    """POST `data` as JSON to `method`; the response."""
    return client.post(api_url(method), data, format="json")


def post_raw(
    client: APIClient, method: str, data: bytes | str, content_type: str = "application/json"
) -> Any:
    """POST a body exactly as given, under `content_type`; the response."""
    return client.generic("POST", api_url(method), data, content_type=content_type)


def status_and_body(response: Any) -> tuple[int, Any]:
    """The status and the parsed JSON answer (every answer of the API is JSON)."""
    assert response["Content-Type"].startswith("application/json")
    return response.status_code, response.json()


def post_json(client: APIClient, method: str, data: Any) -> tuple[int, Any]:
    """POST `data` as JSON to `method`; the status and the parsed answer."""
    return status_and_body(post(client, method, data))


def assert_error(status: int, body: dict[str, Any], code: str, http: int) -> None:
    """The answer is exactly the error envelope, with this code and HTTP status, and no traceback."""
    assert status == http, body
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert "Traceback" not in json.dumps(body)


def invalid_fields(status: int, body: dict[str, Any]) -> set[str]:
    """The fields an INVALID_INPUT answer names (its message names one of them first)."""
    assert_error(status, body, "INVALID_INPUT", 400)
    fields = {detail["field"] for detail in error_details(body)}
    assert body["error"]["message"].split(":")[0] in fields
    return fields


def reservation_body(
    pool: Pool, tenant_id: str, key: str = "key-1", *, gpus: int = 2, **extra: Any
) -> dict[str, Any]:
    """A `reservations/create` (or `capacity/preview`) body: `gpus` whole GPUs for an hour."""
    return {
        "tenantId": tenant_id,
        "poolId": pool.id,
        "devices": [{"class": "gpu", "count": gpus}],
        "duration": "1h",
        "idempotencyKey": key,
        **extra,
    }


def served(path: str, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One call as a WSGI server serves it: the request's signals, and the response closed once read.

    Django's test client leaves the request signals' connection handling out
    (no health check runs), and schemathesis never closes a response (the
    delivery held for after it never runs): neither counts what a server sends.
    """
    payload = json.dumps(body).encode()
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": api_url(path),
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(payload)),
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "wsgi.input": io.BytesIO(payload),
    }
    setup_testing_defaults(environ)
    status: list[str] = []
    response = get_wsgi_application()(environ, lambda line, headers, exc_info=None: status.append(line))
    try:
        content = b"".join(response)
    finally:
        response.close()  # what sends `request_finished`, and with it the delivery
    return int(status[0].split()[0]), json.loads(content)
