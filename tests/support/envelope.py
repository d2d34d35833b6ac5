"""The error envelope's details as a test compares them: what the refusal says, the request id apart.

Every error answered to a request ends with `{"field": "requestId", "message": ID}`
(`core.api.envelope.error_body`); a test of what was refused reads the details
before it, and a test of the request id reads that one.
"""

from __future__ import annotations

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
