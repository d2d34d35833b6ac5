"""The OpenAPI document: how every method's operation, answers and request schema are declared.

Clients are generated from `/api/schema/` (docs/openapi.json is its committed
copy), so the document states exactly what the server does:

* every answer a method gives, with its body (`method_responses`): the
  success, the replay of an idempotent create, the 4xx every method can give,
  409 and 429 where the method refuses so, and the envelope as `default`;
* what a request may hold: a request object refuses unknown fields
  (`additionalProperties: false`), a free string refuses the NUL character the
  parser refuses (`FREE_TEXT_PATTERN`), a map's keys are the names it takes;
* what no schema can state (a rule across fields, a bound on a parsed
  value) as the operation's `x-rules`, repeated in its description, which the
  schema tests read to know what a schema-valid request may still be refused for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent, append_meta
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from core.api.envelope import ErrorSerializer
from core.api.fields import StrictSerializer
from core.json_input import FREE_TEXT_PATTERN

# The answers every method can give, and the codes each carries.
COMMON_ERRORS: dict[int, str] = {
    400: "INVALID_INPUT: the body is not a JSON object, has an unknown field, misses a required one, "
    "or breaks a constraint; `details` names every bad field",
    401: "UNAUTHENTICATED: no bearer token, or an unknown, revoked or expired one",
    403: "PERMISSION_DENIED: the token grants no binding for this method on the tenant",
    404: "NOT_FOUND: the pool, node, device or reservation is not visible to the tenant",
}
# The refusals a method declares, by contract code: the HTTP status and what it means.
REFUSALS: dict[str, tuple[int, str]] = {
    "CONFLICT": (409, "CONFLICT: the state forbids the call, or the key was used with another request"),
    "NO_CAPACITY": (409, "NO_CAPACITY: the request does not fit; `details` carries the placer's reason"),
    "QUOTA_EXCEEDED": (409, "QUOTA_EXCEEDED: the tenant's quota in the pool would be exceeded"),
    "RATE_LIMITED": (
        429,
        "RATE_LIMITED: beyond the token's or the tenant's writes per minute, or too many waiting creates; "
        "retry after `Retry-After` seconds",
    ),
}
DEFAULT_ANSWER = "Any other error, in the same envelope: INTERNAL (500) for a bug, never with a traceback"
RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before the call is worth retrying",
        "schema": {"type": "integer", "minimum": 1},
    }
}


@dataclass(frozen=True)
class Rule:
    """A check the server makes that no JSON Schema keyword states: the fields it reads, in words."""

    fields: tuple[str, ...]
    text: str

    def as_extension(self) -> dict[str, Any]:
        return {"fields": list(self.fields), "rule": self.text}


# The rule every paginated list shares.
CURSOR_RULE = Rule(("cursor",), "a cursor is a `nextCursor` this API returned for the same list")


def method_responses(
    *,
    response: type[serializers.BaseSerializer],
    status: int,
    refuses: Iterable[str],
    replay: str = "",
) -> dict[Any, Any]:
    """Every answer of one method, for `extend_schema(responses=...)`."""
    answers: dict[Any, Any] = {status: response}
    if replay:
        answers[status] = OpenApiResponse(response, description="Created")
        answers[200] = OpenApiResponse(response, description=replay)
    for http, text in COMMON_ERRORS.items():
        answers[http] = OpenApiResponse(ErrorSerializer, description=text)
    by_status: dict[int, list[str]] = {}
    for code in refuses:
        http, text = REFUSALS[code]
        by_status.setdefault(http, []).append(text)
    for http, texts in sorted(by_status.items()):
        # One answer per status; a 409 lists each code it may carry, one per line.
        answers[http] = OpenApiResponse(ErrorSerializer, description="\n\n".join(texts))
    answers["default"] = OpenApiResponse(ErrorSerializer, description=DEFAULT_ANSWER)
    return answers


def rules_description(rules: Iterable[Rule]) -> str:
    """The rules as a paragraph of the method's description."""
    lines = [f"* {rule.text} (`{'`, `'.join(rule.fields)}`)" for rule in rules]
    if not lines:
        return ""
    return "\n\nChecked by the server beyond what the schema states:\n\n" + "\n".join(lines)


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """`Authorization: Bearer bc_...` in the OpenAPI document (and Swagger UI's Authorize button)."""

    target_class = "core.authentication.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "a token from `manage.py issue_token`"}


class RpcAutoSchema(AutoSchema):
    """Operations named as the contract names methods, and request schemas as strict as the parser."""

    def _method_path(self) -> list[str]:
        return [part for part in self.path.split("/") if part][-2:]

    def get_operation_id(self) -> str:
        return ".".join(self._method_path())

    def get_tags(self) -> list[str]:
        return self._method_path()[:1]

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)
        action = getattr(self.view, "action", None) or ""
        rules = getattr(getattr(self.view, action, None), "rpc_rules", ())
        if operation is not None and rules:
            operation["x-rules"] = [rule.as_extension() for rule in rules]
        if operation is not None and "requestBody" in operation:
            # Every method takes a JSON object, even one whose fields are all optional (`{}`).
            operation["requestBody"]["required"] = True
        if operation is not None and 429 in _declared(operation):
            operation["responses"]["429"]["headers"] = RETRY_AFTER
        return operation

    def _map_serializer_field(self, field: Any, direction: str, bypass_extensions: bool = False) -> Any:
        # A field whose rules no DRF attribute says (a selector, a duration, a node report)
        # states its own schema, beside the code that checks it.
        own = getattr(field, "openapi_schema", None)
        if not callable(own):
            return super()._map_serializer_field(field, direction, bypass_extensions)
        meta = self._get_serializer_field_meta(field, direction)
        name = getattr(field, "openapi_component", "")
        if not name:
            return append_meta(own(), meta)
        # A named component (`Selector`, `NodeReport`): one type in a generated client, not one per use.
        component = ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, schema=own(), object=name)
        self.registry.register_on_missing(component)
        return append_meta(component.ref, meta)

    def _map_basic_serializer(self, serializer: Any, direction: str) -> dict[str, Any]:
        mapped: dict[str, Any] = super()._map_basic_serializer(serializer, direction)
        if type(serializer).__dict__.get("__doc__") is None:
            # A docstring inherited from a base (StrictSerializer's) says nothing of this object.
            mapped.pop("description", None)
        if direction != "request":
            return mapped
        if isinstance(serializer, StrictSerializer):
            mapped["additionalProperties"] = False
        # After drf-spectacular has written each field's validators (their patterns among them).
        for name, field_schema in mapped.get("properties", {}).items():
            field = serializer.fields.get(name)
            if field is not None:
                request_field_schema(field, field_schema)
        return mapped


def request_field_schema(field: serializers.Field, schema: dict[str, Any]) -> None:
    """What a request field refuses that drf-spectacular leaves out of its schema."""
    if isinstance(field, serializers.ListSerializer):
        bounds = {
            "minItems": getattr(field, "min_length", None),
            "maxItems": getattr(field, "max_length", None),
        }
        schema.update({key: bound for key, bound in bounds.items() if bound is not None})
    if isinstance(field, serializers.CharField) and not field.allow_blank and "pattern" not in schema:
        schema.setdefault("minLength", 1)
    _hoist_default(schema)
    _refuse_nul(schema)


def _hoist_default(schema: dict[str, Any]) -> None:
    """A default inside one `oneOf` branch (drf-spectacular's blank branch beside it) belongs outside."""
    for branch in schema.get("oneOf", []):
        if isinstance(branch, dict) and "default" in branch:
            schema["default"] = branch.pop("default")


def _declared(operation: dict[str, Any]) -> set[int]:
    return {int(code) for code in operation.get("responses", {}) if code.isdigit()}


def _refuse_nul(schema: Any) -> None:
    """A request string that states no pattern or enum refuses NUL, as the parser does."""
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    is_string = kind == "string" or (isinstance(kind, list) and "string" in kind)
    constrained = {"pattern", "enum", "format"} & set(schema)
    if is_string and schema.get("maxLength") != 0 and not constrained:
        schema["pattern"] = FREE_TEXT_PATTERN
    for key in ("items", "additionalProperties"):
        _refuse_nul(schema.get(key))
    for part in schema.get("oneOf", []) + schema.get("anyOf", []):
        _refuse_nul(part)
    for part in schema.get("patternProperties", {}).values():
        _refuse_nul(part)
