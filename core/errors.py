"""Typed domain errors; `core.api.exception_handler` renders each in the contract's envelope."""

from __future__ import annotations

from typing import Any, Self


class DomainError(Exception):
    code = "INTERNAL"
    status = 500

    def __init__(self, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []


class InvalidInput(DomainError):
    code = "INVALID_INPUT"
    status = 400

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


class Unauthenticated(DomainError):
    code = "UNAUTHENTICATED"
    status = 401


class PermissionDenied(DomainError):
    code = "PERMISSION_DENIED"
    status = 403


class NotFound(DomainError):
    code = "NOT_FOUND"
    status = 404


class Conflict(DomainError):
    code = "CONFLICT"
    status = 409


class IdempotencyConflict(Conflict):
    pass


class NoCapacity(DomainError):
    code = "NO_CAPACITY"
    status = 409


class QuotaExceeded(DomainError):
    code = "QUOTA_EXCEEDED"
    status = 409
