"""Hostile strings and bodies: every string is checked once, where JSON enters the API.

NUL characters and unpaired UTF-16 surrogates are refused wherever they sit in
a body (a value, a list item, a field name), duplicate keys are refused, a
pattern is matched whole (no trailing newline), a huge integer is refused
without naming Python's internals, an error reply stays small however many
fields are wrong, and every path under `/api/` answers the JSON envelope,
whatever the method and however the CSRF middleware would judge it.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.api.envelope import exception_handler
from core.api.parsing import EscapedJSONRenderer
from core.errors import MAX_ERROR_DETAILS, InvalidInput, more_detail
from core.services import token_issue
from inventory.models import Node, Pool
from tests.support.api import assert_error, invalid_fields, post_raw, reservation_body, status_and_body
from tests.support.envelope import error_details

pytestmark = pytest.mark.django_db

NUL = "\x00"
LONE = "\ud800"


def raw_json(data: Any) -> bytes:
    """`data` as JSON with `\\uXXXX` escapes, the way a hostile client writes NUL and lone surrogates."""
    return json.dumps(data, ensure_ascii=True).encode()


def send(client: APIClient, method: str, data: Any) -> tuple[int, Any]:
    body = data if isinstance(data, bytes) else raw_json(data)
    return status_and_body(post_raw(client, method, body))


def refused(client: APIClient, method: str, data: Any) -> tuple[set[str], dict[str, Any]]:
    """The answer is INVALID_INPUT; the fields it names, and the error."""
    status, body = send(client, method, data)
    return invalid_fields(status, body), body["error"]


def with_selector(pool: Pool, selector: dict[str, Any]) -> dict[str, Any]:
    body = reservation_body(pool, "acme")
    body["devices"][0]["selector"] = selector
    return body


# --- NUL and lone surrogates, wherever they sit ------------------------------------------------

HOSTILE_SELECTORS = [
    pytest.param({"gpuModel": f"H1{NUL}00"}, "devices[0].selector.gpuModel", id="nul-bare-value"),
    pytest.param({"gpuModel": {"eq": f"H1{NUL}00"}}, "devices[0].selector.gpuModel.eq", id="nul-eq"),
    pytest.param({"gpuModel": {"ne": f"H1{NUL}00"}}, "devices[0].selector.gpuModel.ne", id="nul-ne"),
    pytest.param({"gpuModel": {"in": ["H100", NUL]}}, "devices[0].selector.gpuModel.in[1]", id="nul-in"),
    pytest.param({"gpuModel": {"notIn": [NUL]}}, "devices[0].selector.gpuModel.notIn[0]", id="nul-notin"),
    pytest.param({"gpuModel": {"eq": LONE}}, "devices[0].selector.gpuModel.eq", id="surrogate-eq"),
    pytest.param({"gpuModel": {"in": [f"a{LONE}"]}}, "devices[0].selector.gpuModel.in[0]", id="surrogate-in"),
    pytest.param({f"node.rack{LONE}": "r1"}, "devices[0].selector", id="surrogate-attribute-name"),
    pytest.param({f"node.rack{NUL}": "r1"}, "devices[0].selector", id="nul-attribute-name"),
]


@pytest.mark.parametrize("method", ["capacity/preview", "reservations/create"])
@pytest.mark.parametrize(("selector", "field"), HOSTILE_SELECTORS)
def test_nul_and_lone_surrogates_in_a_selector_are_invalid_input(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node, method: str, selector: Any, field: str
) -> None:
    fields, error = refused(owner_client, method, with_selector(owned_pool, selector))
    assert any(name.startswith(field) for name in fields), fields
    assert "NUL" in error["message"] or "surrogate" in error["message"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"tenantId": "acme", LONE: 1}, id="surrogate-unknown-field"),
        pytest.param({"tenantId": "acme", f"x{NUL}y": 1}, id="nul-unknown-field"),
        pytest.param({"tenantId": f"acme{NUL}"}, id="nul-tenant"),
        pytest.param({"tenantId": f"acme{LONE}"}, id="surrogate-tenant"),
        pytest.param({"tenantId": "acme", "x": [[{"y": LONE}]]}, id="surrogate-deep-in-unknown-field"),
    ],
)
def test_nul_and_lone_surrogates_anywhere_in_a_body_are_invalid_input(
    owner_client: APIClient, owned_pool: Pool, body: dict[str, Any]
) -> None:
    _, error = refused(owner_client, "capacity/summary", body)
    # The answer is JSON a strict UTF-8 decoder reads, and names no raw NUL or surrogate.
    assert NUL not in json.dumps(error, ensure_ascii=False)
    json.dumps(error, ensure_ascii=False).encode("utf-8")


def test_a_reservations_list_cursor_that_decodes_to_a_nul_is_invalid_input(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    for text in (f"2026-01-01T00:00:00+00:00|rsv_{NUL}", "2026-01-01T00:00:00|rsv_x", "x|y"):
        cursor = base64.urlsafe_b64encode(text.encode()).decode()
        fields, _ = refused(owner_client, "reservations/list", {"tenantId": "acme", "cursor": cursor})
        assert fields == {"cursor"}


def test_a_nodes_list_cursor_that_decodes_to_a_nul_is_invalid_input(
    operator_client: APIClient, gpu_node: Node
) -> None:
    for text in (f"node:gpu{NUL}", "node:"):
        cursor = base64.urlsafe_b64encode(text.encode()).decode()
        fields, _ = refused(operator_client, "nodes/list", {"cursor": cursor})
        assert fields == {"cursor"}


def test_the_renderer_never_fails_on_a_lone_surrogate() -> None:
    """The last line of defence: whatever reaches the renderer is written as JSON, never a 500."""
    rendered = EscapedJSONRenderer().render({"error": {"message": f"bad {LONE} <x>"}})
    assert json.loads(rendered)["error"]["message"] == f"bad {LONE} <x>"
    rendered.decode("utf-8")


# --- Duplicate keys, huge integers, patterns matched whole -----------------------------------


def test_a_duplicate_key_is_refused_naming_it(owner_client: APIClient, owned_pool: Pool) -> None:
    fields, error = refused(owner_client, "capacity/summary", b'{"tenantId": "acme", "tenantId": "beta"}')
    assert "tenantId" in error["message"] and "duplicate" in error["message"]
    body = raw_json(with_selector(owned_pool, {"vramGiB": {"gte": 80}}))
    nested = body.replace(b'"gte": 80', b'"gte": 80, "gte": 1')
    fields, error = refused(owner_client, "capacity/preview", nested)
    assert "devices[0].selector.vramGiB.gte" in fields


@pytest.mark.parametrize("digits", [20, 4_301, 100_000])
def test_a_huge_integer_is_refused_without_python_internals(
    owner_client: APIClient, owned_pool: Pool, digits: int
) -> None:
    body = raw_json(reservation_body(owned_pool, "acme")).replace(b'"count": 2', b'"count": ' + b"9" * digits)
    fields, error = refused(owner_client, "capacity/preview", body)
    text = json.dumps(error)
    assert "sys." not in text and "4300" not in text and "int_max_str_digits" not in text
    assert "devices[0].count" in fields


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_numbers_are_refused(owner_client: APIClient, owned_pool: Pool, constant: bytes) -> None:
    body = raw_json(reservation_body(owned_pool, "acme")).replace(b'"count": 2', b'"count": ' + constant)
    refused(owner_client, "capacity/preview", body)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"idempotencyKey": "abc\n"}, "idempotencyKey"),
        ({"tenantId": "acme\n"}, "tenantId"),
        ({"poolId": "POOL\n"}, "poolId"),
        ({"projectId": "prj_" + "0" * 26 + "\n"}, "projectId"),
    ],
)
def test_a_trailing_newline_never_matches_a_pattern(
    owner_client: APIClient, owned_pool: Pool, change: dict[str, str], field: str
) -> None:
    body = reservation_body(owned_pool, "acme", **change)
    if field == "poolId":
        body["poolId"] = owned_pool.id + "\n"
    fields, _ = refused(owner_client, "reservations/create", body)
    assert field in fields


# --- Error output never amplifies input --------------------------------------------------------


def test_a_body_of_a_hundred_thousand_unknown_keys_answers_a_small_error(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    keys = {f"{i:05x}": 0 for i in range(96_330)}
    body = json.dumps({"tenantId": "acme", **keys}, separators=(",", ":")).encode()
    assert len(body) < 1_048_576
    response = post_raw(owner_client, "capacity/summary", body)
    status, answer = status_and_body(response)
    assert_error(status, answer, "INVALID_INPUT", 400)
    details = error_details(answer)
    assert len(details) == MAX_ERROR_DETAILS + 1
    # Then the request id, past the cap: the answer's header, never cut.
    assert answer["error"]["details"][-1] == {"field": "requestId", "message": response["X-Request-ID"]}
    assert details[:2] == [
        {"field": "00000", "message": "unknown field"},
        {"field": "00001", "message": "unknown field"},
    ]
    assert details[-1] == {
        "field": "body",
        "message": f"and {96_330 - MAX_ERROR_DETAILS} more unknown fields",
    }
    assert len(response.content) < 4_096


def test_an_error_answer_lists_twenty_details_and_counts_the_rest() -> None:
    """However a service piles up details, the envelope carries the first 20 and a count."""
    details = [{"field": f"gpus[{i}].uuid", "message": "required"} for i in range(10_000)]
    response = exception_handler(InvalidInput.from_details(details), {})
    assert response.data["error"]["details"] == [*details[:MAX_ERROR_DETAILS], more_detail(9_980)]
    assert response.data["error"]["message"] == "gpus[0].uuid: required"


# --- Every path under /api/ answers the envelope -------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/compute/capacity/summary/",
        "/api/compute/capacity/summry",
        "/api/compute/",
        "/api/",
        "/api/nope/",
        "/api/docs",
        "/api/schema",
    ],
)
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_any_method_to_an_unknown_api_path_answers_the_json_envelope(
    owner_tenant: Any, path: str, method: str
) -> None:
    # CSRF enforced, as every client meets it outside the test client; API auth is by bearer token.
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_issue(tenant_id='acme', role='member')[1]}")
    response = client.generic(method, path, b'{"tenantId": "acme"}', content_type="application/json")
    status, body = status_and_body(response)
    assert_error(status, body, "NOT_FOUND", 404)


@pytest.mark.parametrize("path", ["/api/compute/capacity/summary/", "/api/compute/capacity/summry"])
def test_an_unknown_api_path_answers_the_envelope_without_credentials_too(path: str) -> None:
    response = APIClient(enforce_csrf_checks=True).post(path, b"{}", content_type="application/json")
    status, body = status_and_body(response)
    assert_error(status, body, "NOT_FOUND", 404)


@pytest.mark.parametrize("path", ["/api/docs/", "/api/schema/"])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_the_documentation_pages_answer_other_methods_in_the_envelope(path: str, method: str) -> None:
    response = APIClient(enforce_csrf_checks=True).generic(
        method, path, b"{}", content_type="application/json"
    )
    status, body = status_and_body(response)
    assert_error(status, body, "INVALID_INPUT", 405)
    assert error_details(body) == [{"field": "method", "message": "use GET"}]


@pytest.mark.parametrize("path", ["/api/docs", "/api/schema"])
def test_the_documentation_pages_are_still_reached_without_their_slash(path: str) -> None:
    response = APIClient().get(path)
    assert response.status_code == 301 and response["Location"] == f"{path}/"
    assert APIClient().get(f"{path}/").status_code == 200
