"""The API's shared pieces: the error envelope, strict input fields and serializers, the RPC viewset base.

Every method is `POST /api/compute/<group>/<method>` with a JSON object body.
A view reads as: validate (`rpc_input`) → decide (`core.decisions`) → call one
service or selector → serialize (`rpc_output`); `rpc_tenant_input` and
`rpc_platform_input` are the first two steps for the usual decisions.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig, SuspiciousOperation
from django.core.validators import RegexValidator
from django.http import Http404, HttpRequest, HttpResponsePermanentRedirect, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import exceptions as drf_exceptions
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from core.authentication import BearerTokenAuthentication, PrincipalRequired, principal_of
from core.constants import MAX_TIME_MS, NODE_ID_REGEX, POOL_ID_REGEX, TENANT_ID_REGEX
from core.decisions import WRITE_PERMISSIONS, decide_platform, decide_tenant
from core.errors import ERROR_CODES, MAX_ERROR_DETAILS, DomainError, InvalidInput, cap_details, more_detail
from core.json_input import json_loads_strict
from core.ratelimit import writes_count
from core.replica import replica_aware

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"
JSON_MEDIA_TYPE = "application/json"


# --- The error envelope -------------------------------------------------------


def error_body(code: str, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The envelope; at most `MAX_ERROR_DETAILS` details and an `and N more` (`core.errors.cap_details`)."""
    return {"error": {"code": code, "message": message, "details": cap_details(details or [])}}


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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """Render every error, from every method, in the contract's envelope."""
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
    """An error outside a view (middleware, URL resolution): JSON for `/api/`, never a traceback."""
    if _is_api_path(request):
        return JsonResponse(error_body("INTERNAL", "internal error"), status=500)
    from django.views.defaults import server_error

    return server_error(request)


class ErrorDetailSerializer(serializers.Serializer):
    field = serializers.CharField()
    message = serializers.CharField()


class ErrorSerializer(serializers.Serializer):
    """`{"error": {"code", "message", "details": [{"field", "message"}]}}`."""

    class ErrorBodySerializer(serializers.Serializer):
        code = serializers.ChoiceField(choices=list(ERROR_CODES))
        message = serializers.CharField()
        details = ErrorDetailSerializer(many=True)

    error = ErrorBodySerializer()


# --- Strict input ---------------------------------------------------------------


class StrictSerializer(serializers.Serializer):
    """An input serializer that refuses unknown fields, at every depth (nest StrictSerializers)."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            if self.parent is None:
                raise serializers.ValidationError({"body": ["must be a JSON object"]})
            raise serializers.ValidationError(["must be a JSON object"])
        # Unknown fields and bad known fields are reported together: `details`
        # names every bad field, so a client fixes its request in one go. Only
        # the first unknown ones (in name order) are named, and the rest counted:
        # a body of 100,000 unknown keys gets an answer the size of any other.
        unknown = set(data) - set(self.fields)
        errors: dict[str, Any] = {
            name: ["unknown field"] for name in heapq.nsmallest(MAX_ERROR_DETAILS, unknown)
        }
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if not isinstance(exc.detail, dict):
                raise
            errors.update(exc.detail)
        if len(unknown) > MAX_ERROR_DETAILS:
            more = more_detail(len(unknown) - MAX_ERROR_DETAILS, "unknown fields")["message"]
            errors.setdefault(api_settings.NON_FIELD_ERRORS_KEY, []).append(more)
        if errors:
            raise serializers.ValidationError(errors)
        return value


class StrictIntegerField(serializers.IntegerField):
    """An integer that must be a JSON number without a fraction: `"5"`, `5.5` and `true` are refused."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        if isinstance(data, float) and not data.is_integer():
            self.fail("invalid")
        value: int = super().to_internal_value(data)
        return value


class StrictBooleanField(serializers.BooleanField):
    """A JSON `true` or `false` only; `"yes"` or `1` would hide a client's bug."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    """A JSON string only (DRF would turn `5` into `"5"`); whitespace kept as sent."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        value: str = super().to_internal_value(data)
        return value


class WholeRegexValidator(RegexValidator):
    """A `RegexValidator` that matches the whole value (`fullmatch`).

    The patterns keep the contract's `^…$` spelling, which is what they mean in
    the OpenAPI document (ECMA-262, where `$` is the end of the text). In
    Python `$` also matches before a final newline, so `re.search` would take
    `"abc\n"` for `^[a-z]+$`; `fullmatch` does not.
    """

    def __call__(self, value: Any) -> None:
        pattern = cast(re.Pattern[str], self.regex)  # compiled by RegexValidator.__init__
        if not isinstance(value, str) or pattern.fullmatch(value) is None:
            raise serializers.ValidationError(self.message, code=self.code)


class StrictRegexField(StrictCharField):
    """A JSON string matching a pattern whole, with the pattern in the error message."""

    def __init__(self, regex: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators.append(WholeRegexValidator(regex, message=f"must match {regex}"))


def tenant_id_field(**kwargs: Any) -> StrictRegexField:
    kwargs.setdefault("source", "tenant_id")
    return StrictRegexField(TENANT_ID_REGEX, max_length=128, **kwargs)


def pool_id_field(**kwargs: Any) -> StrictRegexField:
    kwargs.setdefault("source", "pool_id")
    return StrictRegexField(POOL_ID_REGEX, max_length=57, **kwargs)


def node_id_field(**kwargs: Any) -> StrictRegexField:
    kwargs.setdefault("source", "node_id")
    return StrictRegexField(NODE_ID_REGEX, max_length=57, **kwargs)


def time_ms_field(**kwargs: Any) -> StrictIntegerField:
    return StrictIntegerField(min_value=0, max_value=MAX_TIME_MS, **kwargs)


# --- The RPC viewset ------------------------------------------------------------


class StrictJSONParser(JSONParser):
    """JSON only, parsed by `core.json_input.json_loads_strict`: the one place a body's strings are checked.

    The size limit is checked before a byte is read (see `RpcViewSet.initial`)
    and again here, on what the stream really holds. UTF-8 only; NUL
    characters, unpaired surrogates, repeated keys, `NaN` and integers longer
    than any field takes are `INVALID_INPUT` naming their field, so nothing
    after this point (a serializer, the database, the renderer) meets them.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1 if limit is not None else -1) if stream is not None else b""
        if limit is not None and len(raw) > limit:
            raise InvalidInput.field("body", f"the request body is too large (at most {limit} bytes)")
        return json_loads_strict(raw)


class EscapedJSONRenderer(JSONRenderer):
    """JSON with `<`, `>` and `&` written as `\\u003c`, `\\u003e`, `\\u0026`.

    Error details name the fields a client sent (an unknown field is echoed
    back by name). The escapes are the same JSON to every client, but no
    browser that sniffs the answer as HTML finds live markup in it. In JSON
    these characters only occur inside strings, so the replacement is exact.
    """

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        try:
            rendered: bytes = super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            # A string no UTF-8 encoder can write (an unpaired surrogate) got past
            # the parser: written as ASCII escapes rather than failing after the
            # view (or the exception handler) has answered.
            rendered = json.dumps(
                data, ensure_ascii=True, cls=self.encoder_class, separators=(",", ":")
            ).encode()
        return rendered.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """`Authorization: Bearer bc_...` in the OpenAPI document (and Swagger UI's Authorize button)."""

    target_class = "core.authentication.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "a token from `manage.py issue_token`"}


class RpcAutoSchema(AutoSchema):
    """Operation ids and tags as the contract names methods: `capacity.byPool`, tag `capacity`."""

    def _method_path(self) -> list[str]:
        return [part for part in self.path.split("/") if part][-2:]

    def get_operation_id(self) -> str:
        return ".".join(self._method_path())

    def get_tags(self) -> list[str]:
        return self._method_path()[:1]


def check_json_body(request: Request) -> None:
    """Refuse a body that is too large, empty, or not declared as JSON, before parsing it."""
    meta = request.META
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and length > limit:
        raise InvalidInput.field("body", f"the request body is too large (at most {limit} bytes)")
    media_type = (request.content_type or "").split(";", 1)[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        raise InvalidInput.field("body", "Content-Type must be application/json")
    if length == 0:
        raise InvalidInput.field("body", "must be a JSON object")


class RpcViewSet(viewsets.ViewSet):
    """Base for every `POST /api/compute/<group>/<method>` group: bearer tokens, JSON in and out."""

    authentication_classes = [BearerTokenAuthentication]
    permission_classes = [PrincipalRequired]
    parser_classes = [StrictJSONParser]
    renderer_classes = [EscapedJSONRenderer]
    schema = RpcAutoSchema()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # Authentication and the principal check first: an anonymous caller
        # learns nothing about what a valid body looks like.
        super().initial(request, *args, **kwargs)
        if request.method == "POST":
            check_json_body(request)


S = TypeVar("S", bound=serializers.BaseSerializer)
F = TypeVar("F", bound=Callable[..., Any])

ERROR_RESPONSES: dict[int, type[serializers.Serializer]] = {
    400: ErrorSerializer,
    401: ErrorSerializer,
    403: ErrorSerializer,
    404: ErrorSerializer,
}


def rpc_action(
    method: str,
    *,
    request: type[serializers.BaseSerializer],
    response: type[serializers.BaseSerializer],
    summary: str,
    description: str = "",
    status: int = 200,
    errors: dict[int, type[serializers.Serializer]] | None = None,
    examples: list[OpenApiExample] | None = None,
) -> Callable[[F], F]:
    """`@action(detail=False, methods=["post"], url_path=method)` plus its exact `@extend_schema`."""

    def decorate(func: F) -> F:
        responses: dict[int, Any] = {status: response, **ERROR_RESPONSES, **(errors or {})}
        # extend_schema goes on the outside, as drf-spectacular documents for actions.
        # `replica_aware`: the lag-tolerant reads may run on a replica (core.replica); a no-op without one.
        routed: Any = action(detail=False, methods=["post"], url_path=method)(replica_aware(func))
        text = description or func.__doc__ or ""
        decorated: F = extend_schema(
            request=request, responses=responses, summary=summary, description=text, examples=examples
        )(routed)
        return decorated

    return decorate


def rpc_input(request: Request, serializer_class: type[serializers.BaseSerializer]) -> dict[str, Any]:
    """Validate the body; every bad field ends up in one INVALID_INPUT."""
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    data: dict[str, Any] = dict(serializer.validated_data)
    return data


def rpc_tenant_input(
    request: Request, serializer_class: type[serializers.BaseSerializer], *, permission: str
) -> dict[str, Any]:
    """`rpc_input`, then the decision on the body's tenant: a method "decided on the tenant"."""
    data = rpc_input(request, serializer_class)
    decide_tenant(principal=principal_of(request), tenant_id=data["tenant_id"], permission=permission)
    if permission in WRITE_PERMISSIONS:
        rpc_write_count(request, tenant_id=data["tenant_id"])
    return data


def rpc_write_count(request: Request, *, tenant_id: str) -> None:
    """Count a write against the token's and the tenant's rate limits (after the decision, so a
    refused caller spends nothing); `RATE_LIMITED` beyond them."""
    writes_count(token_id=str(request.auth.pk), tenant_id=tenant_id)


def rpc_platform_input(
    request: Request, serializer_class: type[serializers.BaseSerializer], *, permission: str
) -> dict[str, Any]:
    """`rpc_input`, then the decision on the platform: the node operations and node reports."""
    data = rpc_input(request, serializer_class)
    decide_platform(principal=principal_of(request), permission=permission)
    return data


def rpc_output(
    serializer_class: type[serializers.BaseSerializer], instance: Any, *, status: int = 200
) -> Response:
    """Serialize the service's or selector's answer."""
    return Response(serializer_class(instance).data, status=status)
