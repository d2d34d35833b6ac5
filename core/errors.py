"""Typed domain errors; `core.api.exception_handler` renders each in the contract's envelope."""

from __future__ import annotations

from typing import Any


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
