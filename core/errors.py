"""Typed domain errors; `core.api.envelope.exception_handler` renders each in the contract's envelope."""

from __future__ import annotations

import re
from typing import Any, Self

# An error answer lists at most this many details, then one `{"field": "body", "message": "and N more"}`,
# so an answer is never much larger than a normal one, however many fields a body gets wrong.
MAX_ERROR_DETAILS = 20


def more_detail(count: int, what: str = "") -> dict[str, str]:
    """The last detail of a capped list: how many more were left out (`and 96310 more`)."""
    return {"field": "body", "message": f"and {count} more{f' {what}' if what else ''}"}


_MORE = re.compile(r"and ([0-9]+) more\b")


def _weight(detail: dict[str, Any]) -> int:
    """How many details `detail` stands for: N for an `and N more`, else 1."""
    message = detail.get("message")
    found = _MORE.match(message) if isinstance(message, str) else None
    return int(found.group(1)) if found else 1


def cap_details(details: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first `MAX_ERROR_DETAILS` details, then `more_detail` counting the rest.

    A list already capped keeps its `and N more`; one dropped from the middle
    of a list is counted as the N it stands for.
    """
    if len(details) <= MAX_ERROR_DETAILS or (
        len(details) == MAX_ERROR_DETAILS + 1 and _weight(details[-1]) > 1
    ):
        return details
    return [*details[:MAX_ERROR_DETAILS], more_detail(sum(_weight(d) for d in details[MAX_ERROR_DETAILS:]))]


class DomainError(Exception):
    """An error the API answers in its envelope: `code` and HTTP `status` are the class's.

    A subclass names its own as class keywords, `class NotFound(DomainError,
    code="NOT_FOUND", status=404)`; one without them answers as its base does.
    """

    code, status = "INTERNAL", 500

    def __init_subclass__(cls, *, code: str | None = None, status: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None and status is not None:
            cls.code, cls.status = code, status

    def __init__(self, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []


class InvalidInput(DomainError, code="INVALID_INPUT", status=400):
    """A bad request: `details` names each bad field."""

    @classmethod
    def field(cls, field: str, message: str) -> InvalidInput:
        return cls(f"{field}: {message}", [{"field": field, "message": message}])

    @classmethod
    def from_details(cls, details: list[dict[str, Any]], *, more: bool = False, **kwargs: Any) -> Self:
        """The error for every bad field in `details`, its message the first one's `field: message`.

        As the contract's example: `devices[0].count: must be between 1 and 64`.
        `more` appends ` (and N more)` when there are several; `kwargs` go to
        the constructor of a subclass that takes more (`SelectorSyntaxError`).
        """
        first = details[0] if details else {"field": "body", "message": "invalid"}
        message = f"{first['field']}: {first['message']}" if first.get("field") else str(first["message"])
        if more and len(details) > 1:
            message += f" (and {len(details) - 1} more)"
        return cls(message, details, **kwargs)


class Unauthenticated(DomainError, code="UNAUTHENTICATED", status=401):
    """No valid bearer token: none, or one unknown, expired or revoked."""


class PermissionDenied(DomainError, code="PERMISSION_DENIED", status=403):
    """The credential does not grant this method (on this tenant, or on this node)."""


class NotFound(DomainError, code="NOT_FOUND", status=404):
    """No such object, or one the caller may not see: the answer never says which."""


class Conflict(DomainError, code="CONFLICT", status=409):
    """The request contradicts what is stored now."""


class IdempotencyConflict(Conflict):
    """An `idempotencyKey` used again with a different request."""


class NoCapacity(DomainError, code="NO_CAPACITY", status=409):
    """What the request asks for does not fit in what it may book."""


class QuotaExceeded(DomainError, code="QUOTA_EXCEEDED", status=409):
    """The request would take the tenant past a quota."""


class TooManyRequests(DomainError, code="RATE_LIMITED", status=429):
    """Beyond a rate limit or the waiting bound: try again after `retry_after` seconds (`Retry-After`)."""

    def __init__(
        self, message: str, details: list[dict[str, Any]] | None = None, *, retry_after: int
    ) -> None:
        super().__init__(message, details)
        self.retry_after = retry_after


# Every code an error answers with, in the contract's order, the catch-all last:
# the enum of the error envelope in the OpenAPI document (`core.api.envelope.ErrorSerializer`).
_ERRORS = (
    InvalidInput,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    Conflict,
    NoCapacity,
    QuotaExceeded,
    TooManyRequests,
)
ERROR_CODES: tuple[str, ...] = (*(error.code for error in _ERRORS), DomainError.code)
