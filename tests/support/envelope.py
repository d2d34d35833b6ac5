"""The error envelope's details as a test compares them: what the refusal says, the request id apart.

Every error answered to a request ends with `{"field": "requestId", "message": ID}`
(`core.api.envelope.error_body`); a test of what was refused reads the details
before it, and a test of the request id reads that one.
"""

from __future__ import annotations

import json
from typing import Any

REQUEST_ID_FIELD = "requestId"


def request_id_detail(details: list[dict[str, Any]]) -> str | None:
    """The request id the last detail carries, or None (a body made outside a request)."""
    if details and details[-1].get("field") == REQUEST_ID_FIELD:
        return str(details[-1]["message"])
    return None


def without_request_id(details: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The details without the request id's (the last one, when there is one)."""
    return details[:-1] if request_id_detail(details) is not None else list(details)


def error_details(body: dict[str, Any]) -> list[dict[str, Any]]:
    """An error answer's details, what the refusal says: without the request id."""
    return without_request_id(body["error"]["details"])


def error_without_request_id(body: dict[str, Any]) -> dict[str, Any]:
    """The whole envelope, its details without the request id: for comparing a body as a whole."""
    return {"error": {**body["error"], "details": error_details(body)}}


# The contract's error codes and the HTTP status each answers with, as the README states them
# (stated here, not read from the code). INVALID_INPUT is the one that also answers with the
# status HTTP has for a refusal of its own kind: 405 for a method other than POST.
CONTRACT_STATUS = {
    "INVALID_INPUT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "CONFLICT": 409,
    "NO_CAPACITY": 409,
    "QUOTA_EXCEEDED": 409,
    "INTERNAL": 500,
}
MARKUP = "<script>alert(1)</script>"


def assert_contract_answer(status: int, content_type: str, raw: bytes) -> Any:
    """No 5xx; JSON; an error is exactly the envelope; no markup a browser could run."""
    assert status < 500, raw[:500]
    assert content_type.split(";")[0].strip() == "application/json", content_type
    body = json.loads(raw)
    if status >= 400:
        assert set(body) == {"error"}, body
        error = body["error"]
        assert set(error) == {"code", "message", "details"}, body
        assert error["code"] in CONTRACT_STATUS and isinstance(error["message"], str), body
        assert status == CONTRACT_STATUS[error["code"]] or error["code"] == "INVALID_INPUT", (status, body)
        assert all(isinstance(d, dict) and "field" in d and "message" in d for d in error["details"]), body
    # Whatever the client sent is never echoed as live markup, even under a wrong content type.
    assert b"<script" not in raw.lower() and b"</script" not in raw.lower(), raw[:500]
    return body


def content_type_of(response: Any) -> str:
    """A schemathesis call's Content-Type (its headers may be a mapping of lists)."""
    value = next((v for k, v in response.headers.items() if k.lower() == "content-type"), "")
    return ",".join(value) if isinstance(value, list) else str(value)
