"""The error envelope: every error, from every method and every `/api/` URL, as `{"error": {...}}`.

`exception_handler` is DRF's (settings' `REST_FRAMEWORK`); `handler400`,
`handler404` and `handler500` are Django's (`config.urls`), so a request that
never reaches a view is answered in the same envelope.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from django.core.exceptions import DisallowedHost, RequestDataTooBig, SuspiciousOperation
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponsePermanentRedirect, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf_exceptions
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.errors import ERROR_CODES, DomainError, cap_details
from core.request_id import current_request_id

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"
# The last detail of an error answered to a request names the request (`core.request_id`).
REQUEST_ID_FIELD = "requestId"


def error_body(code: str, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The envelope; at most `MAX_ERROR_DETAILS` details and an `and N more` (`core.errors.cap_details`).

    In a request, the last detail is `{"field": "requestId", "message": ID}`, the id
    answered in `X-Request-ID` (`core.request_id`), after the cap so it is never cut:
    a client quoting it finds the request's log lines.
    """
    listed = cap_details(details or [])
    request_id = current_request_id()
    if request_id is not None:
        listed = [*listed, {"field": REQUEST_ID_FIELD, "message": request_id}]
    return {"error": {"code": code, "message": message, "details": listed}}


def error_response(
    code: str, message: str, status: int, details: list[dict[str, Any]] | None = None
) -> Response:
    return Response(error_body(code, message, details), status=status)


def _flatten(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    """DRF's nested error dicts as contract details: `devices[0].count`."""
    out: list[dict[str, str]] = []
    if isinstance(detail, dict):
        for key, value in detail.items():
            if key in ("non_field_errors", "__all__"):
                name = prefix
            elif isinstance(key, int):
                # DRF 3.18 reports a list's item errors as {index: detail}.
                name = f"{prefix}[{key}]"
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


def _body_error(message: str) -> Response:
    return error_response("INVALID_INPUT", f"body: {message}", 400, [{"field": "body", "message": message}])


# How long a client waits before sending a request again that met a database going away.
DATABASE_RETRY_AFTER_SECONDS = 1
# SQLSTATEs a server answers while it stops, starts or is no longer the primary: 25006
# read_only_sql_transaction (a demoted leader), 57P01 admin_shutdown, 57P02 crash_shutdown,
# 57P03 cannot_connect_now; and class 08, the connection exceptions.
_LOST_PRIMARY_STATES = frozenset({"25006", "57P01", "57P02", "57P03"})
# 40P01 deadlock_detected, 40001 serialization_failure: the transaction lost to another.
_LOST_RACE_STATES = frozenset({"40P01", "40001"})


def database_unavailable(exc: BaseException) -> bool:
    """The database connection died or its server stopped being the primary: a failover, not a bug.

    Django raises OperationalError or InterfaceError for a connection lost,
    refused or already closed; a statement sent to a leader Patroni is
    demoting fails with one of `_LOST_PRIMARY_STATES`.
    """
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    if not isinstance(exc, DatabaseError):
        return False
    state = getattr(exc.__cause__, "sqlstate", None) or ""
    return state in _LOST_PRIMARY_STATES or state.startswith("08")


def database_unavailable_response(exc: BaseException) -> Response:
    """503 with `Retry-After`: the request may have committed or not; its idempotencyKey makes a retry safe.

    Logged as one warning line, not a traceback: it is the expected answer
    while the database fails over, and says which error it was.
    """
    logger.warning("database unavailable, answered 503: %s: %s", type(exc).__name__, str(exc).strip()[:200])
    if getattr(exc.__cause__, "sqlstate", None) in _LOST_RACE_STATES:
        # Run again by the service (`core.retry`) and lost every time: nothing was written.
        cause = "the request met other writes on the same rows every time it ran and wrote nothing"
    else:
        cause = "the database is unavailable (failing over)"
    response = error_response(
        "INTERNAL",
        f"{cause}; send the request again after Retry-After seconds, a create with the same idempotencyKey",
        503,
    )
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
    return response


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """Render every error, from every method, in the contract's envelope."""
    if database_unavailable(exc):
        return database_unavailable_response(exc)
    if isinstance(exc, DomainError):
        response = error_response(exc.code, exc.message, exc.status, exc.details)
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            response["Retry-After"] = str(retry_after)
        return response
    if isinstance(exc, drf_exceptions.ValidationError):
        details = _flatten(exc.detail)
        first = details[0] if details else {"field": "body", "message": "invalid"}
        return error_response("INVALID_INPUT", f"{first['field']}: {first['message']}", 400, details)
    if isinstance(exc, drf_exceptions.ParseError):
        return _body_error(str(exc.detail))
    if isinstance(exc, drf_exceptions.UnsupportedMediaType):
        return _body_error("Content-Type must be application/json")
    if isinstance(exc, RequestDataTooBig):
        # Django raises this when the body exceeds DATA_UPLOAD_MAX_MEMORY_SIZE;
        # the contract wants INVALID_INPUT, not 413 or 500.
        return _body_error("the request body is too large")
    if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
        return error_response("UNAUTHENTICATED", "a valid bearer token is required", 401)
    if isinstance(exc, drf_exceptions.PermissionDenied):
        return error_response("PERMISSION_DENIED", "the credential does not grant this method", 403)
    if isinstance(exc, (Http404, drf_exceptions.NotFound)):
        return error_response("NOT_FOUND", "not found", 404)
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        return error_response(
            "INVALID_INPUT", "method: use POST", 405, [{"field": "method", "message": "use POST"}]
        )
    if isinstance(exc, drf_exceptions.APIException):
        drf_response = drf_exception_handler(exc, context)
        status = drf_response.status_code if drf_response is not None else 500
        return error_response("INVALID_INPUT" if status < 500 else "INTERNAL", str(exc.detail), status)
    logger.exception("unhandled error in %s", context.get("view"))
    return error_response("INTERNAL", "internal error", 500)


def _is_api_path(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


# The documentation pages, which `GET` (or `HEAD`) without their slash still reaches.
_DOCUMENTATION = ("/api/docs", "/api/schema")


@csrf_exempt
def api_not_found(
    request: HttpRequest, *args: Any, **kwargs: Any
) -> JsonResponse | HttpResponsePermanentRedirect:
    """Any unknown `/api/` URL, whatever the method: the envelope, not an HTML page.

    CSRF-exempt like every API view: the API authenticates by bearer token,
    never by cookie, and without the exemption the CSRF middleware would answer
    a `POST` here (a typo, a trailing slash) with its HTML "verification
    failed" page before this view ran.
    """
    if request.method in ("GET", "HEAD") and request.path in _DOCUMENTATION:
        return HttpResponsePermanentRedirect(f"{request.path}/")
    return JsonResponse(error_body("NOT_FOUND", "no such method"), status=404)


def api_read_only(view: Callable[..., Any]) -> Callable[..., Any]:
    """A documentation page under `/api/` (`api/docs/`, `api/schema/`): any method but a read is the envelope.

    Left alone, drf-spectacular's views answer a `POST` with their own page (HTML
    or YAML); every `/api/` path answers errors in JSON.
    """

    @csrf_exempt
    def read_only(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            body = error_body("INVALID_INPUT", "method: use GET", [{"field": "method", "message": "use GET"}])
            response = JsonResponse(body, status=405)
            response["Allow"] = "GET, HEAD, OPTIONS"
            return response
        return view(request, *args, **kwargs)

    return read_only


def handler404(request: HttpRequest, exception: Exception | None = None) -> Any:
    """JSON for `/api/` URLs, Django's page elsewhere (the admin)."""
    if _is_api_path(request):
        return api_not_found(request)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception or Http404())


def handler400(request: HttpRequest, exception: Exception | None = None) -> Any:
    """A request Django refused before any view (a Host it does not serve, ...): the envelope for `/api/`."""
    if _is_api_path(request):
        message = "the request was refused before reaching a method"
        if isinstance(exception, DisallowedHost):
            message = "the Host header names no host this service answers to"
        return JsonResponse(error_body("INVALID_INPUT", message), status=400)
    from django.views.defaults import bad_request

    return bad_request(request, exception or SuspiciousOperation())


def handler500(request: HttpRequest) -> Any:
    """An error outside a view (middleware, URL resolution): JSON for `/api/`, never a traceback.

    A database connection lost there (a failover) is the same 503 as in a view.
    """
    if _is_api_path(request):
        error = sys.exc_info()[1]
        if error is not None and database_unavailable(error):
            answer = database_unavailable_response(error)
            response = JsonResponse(answer.data, status=503)
            response["Retry-After"] = answer["Retry-After"]
            return response
        return JsonResponse(error_body("INTERNAL", "internal error"), status=500)
    from django.views.defaults import server_error

    return server_error(request)


class ErrorDetailSerializer(serializers.Serializer):
    """One bad field or one reason; some refusals say more, in the optional fields."""

    field = serializers.CharField()
    message = serializers.CharField()
    code = serializers.CharField(required=False, help_text="NO_CAPACITY: the placer's reason (`NO_FIT`, ...)")
    resource = serializers.CharField(
        required=False, help_text="QUOTA_EXCEEDED, and a quota's CONFLICT: the resource (`gpu`, `vcpu`, ...)"
    )
    used = serializers.IntegerField(required=False, help_text="what the tenant holds of `resource`")
    max = serializers.IntegerField(required=False, help_text="the quota's limit for `resource`")
    asked = serializers.IntegerField(required=False, help_text="QUOTA_EXCEEDED: what the request asked for")


class ErrorSerializer(serializers.Serializer):
    """`{"error": {"code", "message", "details": [{"field", "message"}]}}`."""

    class ErrorBodySerializer(serializers.Serializer):
        code = serializers.ChoiceField(choices=list(ERROR_CODES))
        message = serializers.CharField()
        details = ErrorDetailSerializer(many=True)

    error = ErrorBodySerializer()
