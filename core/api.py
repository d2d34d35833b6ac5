"""The API's shared pieces: the error envelope, strict input serializers, the RPC viewset base."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.errors import DomainError

logger = logging.getLogger(__name__)


def error_response(code: str, message: str, status: int, details: list[dict[str, Any]] | None = None) -> Response:
    return Response({"error": {"code": code, "message": message, "details": details or []}}, status=status)


def _flatten(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    """DRF's nested error dicts as contract details: `devices[0].count`."""
    out: list[dict[str, str]] = []
    if isinstance(detail, dict):
        for key, value in detail.items():
            if key in ("non_field_errors", "__all__"):
                name = prefix
            elif prefix:
                name = f"{prefix}.{key}"
            else:
                name = str(key)
            out.extend(_flatten(value, name))
    elif isinstance(detail, list):
        if detail and all(isinstance(item, (dict, list)) or item is None or item == {} for item in detail):
            for index, item in enumerate(detail):
                if item:
                    out.extend(_flatten(item, f"{prefix}[{index}]"))
        else:
            for item in detail:
                out.extend(_flatten(item, prefix))
    else:
        out.append({"field": prefix or "body", "message": str(detail)})
    return out


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """Render every error, from every method, in the contract's envelope."""
    if isinstance(exc, DomainError):
        return error_response(exc.code, exc.message, exc.status, exc.details)
    if isinstance(exc, drf_exceptions.ValidationError):
        details = _flatten(exc.detail)
        first = details[0] if details else {"field": "body", "message": "invalid"}
        return error_response("INVALID_INPUT", f"{first['field']}: {first['message']}", 400, details)
    if isinstance(exc, drf_exceptions.ParseError):
        return error_response("INVALID_INPUT", f"body: {exc.detail}", 400, [{"field": "body", "message": str(exc.detail)}])
    if isinstance(exc, drf_exceptions.UnsupportedMediaType):
        message = "Content-Type must be application/json"
        return error_response("INVALID_INPUT", f"body: {message}", 400, [{"field": "body", "message": message}])
    if isinstance(exc, RequestDataTooBig):
        message = "request body is too large"
        return error_response("INVALID_INPUT", f"body: {message}", 400, [{"field": "body", "message": message}])
    if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
        return error_response("UNAUTHENTICATED", "a valid bearer token is required", 401)
    if isinstance(exc, drf_exceptions.PermissionDenied):
        return error_response("PERMISSION_DENIED", "the credential does not grant this method", 403)
    if isinstance(exc, (Http404, drf_exceptions.NotFound)):
        return error_response("NOT_FOUND", "not found", 404)
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        return error_response("INVALID_INPUT", "method: use POST", 405, [{"field": "method", "message": "use POST"}])
    if isinstance(exc, drf_exceptions.APIException):
        response = drf_exception_handler(exc, context)
        status = response.status_code if response is not None else 500
        return error_response("INVALID_INPUT" if status < 500 else "INTERNAL", str(exc.detail), status)
    logger.exception("unhandled error in %s", context.get("view"))
    return error_response("INTERNAL", "internal error", 500)


class StrictSerializer(serializers.Serializer):
    """An input serializer that refuses unknown fields, at every depth."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"body": ["must be a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        return super().to_internal_value(data)
