"""The RPC viewset: the base of every `POST /api/compute/<group>/<method>` group and its steps.

A view reads as: validate (`rpc_input`) → decide (`core.decisions`) → call one
service or selector → serialize (`rpc_output`); `rpc_tenant_input` and
`rpc_platform_input` are the first two steps for the usual decisions.
`rpc_action` declares a method and its OpenAPI operation, every answer included
(`core.api.schema`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.parsing import EscapedJSONRenderer, JSONNegotiation, StrictJSONParser, check_json_body
from core.api.schema import RpcAutoSchema, Rule, method_responses, rules_description
from core.authentication import BearerTokenAuthentication, PrincipalRequired, principal_of
from core.decisions import WRITE_PERMISSIONS, decide_platform, decide_tenant
from core.ratelimit import WriteCount, write_counted, writes_count
from core.replica import replica_aware


class RpcViewSet(viewsets.ViewSet):
    """Base for every `POST /api/compute/<group>/<method>` group: bearer tokens, JSON in and out."""

    authentication_classes = [BearerTokenAuthentication]
    permission_classes = [PrincipalRequired]
    parser_classes = [StrictJSONParser]
    renderer_classes = [EscapedJSONRenderer]
    content_negotiation_class = JSONNegotiation
    schema = RpcAutoSchema()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # Authentication and the principal check first: an anonymous caller
        # learns nothing about what a valid body looks like.
        super().initial(request, *args, **kwargs)
        if request.method == "POST":
            check_json_body(request)


F = TypeVar("F", bound=Callable[..., Any])


def rpc_action(
    method: str,
    *,
    request: type[serializers.BaseSerializer],
    response: type[serializers.BaseSerializer],
    summary: str,
    description: str = "",
    status: int = 200,
    refuses: tuple[str, ...] = (),
    replay: str = "",
    rules: tuple[Rule, ...] = (),
    examples: list[OpenApiExample] | None = None,
) -> Callable[[F], F]:
    """`@action(detail=False, methods=["post"], url_path=method)` plus its exact `@extend_schema`.

    `refuses`: the contract codes beyond those every method answers (`CONFLICT`,
    `NO_CAPACITY`, `QUOTA_EXCEEDED`, `RATE_LIMITED`); `replay`: what the 200 of
    an idempotent create's replay means, beside its `status`; `rules`: what the
    server checks that the schema cannot state.
    """

    def decorate(func: F) -> F:
        responses = method_responses(response=response, status=status, refuses=refuses, replay=replay)
        # extend_schema goes on the outside, as drf-spectacular documents for actions.
        # `replica_aware`: the lag-tolerant reads may run on a replica (core.replica); a no-op without one.
        routed: Any = action(detail=False, methods=["post"], url_path=method)(replica_aware(func))
        routed.rpc_rules = rules
        text = (description or func.__doc__ or "") + rules_description(rules)
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
    request: Request,
    serializer_class: type[serializers.BaseSerializer],
    *,
    permission: str,
    count_write: bool = True,
) -> dict[str, Any]:
    """`rpc_input`, then the decision on the body's tenant: a method "decided on the tenant".

    A write is counted against the rate limits here, unless `count_write` is
    False: the view then counts it in the write's own statement (`rpc_write_counted`).
    """
    data = rpc_input(request, serializer_class)
    decide_tenant(principal=principal_of(request), tenant_id=data["tenant_id"], permission=permission)
    if permission in WRITE_PERMISSIONS and count_write:
        rpc_write_count(request, tenant_id=data["tenant_id"])
    return data


def rpc_write_count(request: Request, *, tenant_id: str) -> None:
    """Count a write against the token's and the tenant's rate limits (after the decision, so a
    refused caller spends nothing); `RATE_LIMITED` beyond them."""
    writes_count(token_id=str(request.auth.pk), tenant_id=tenant_id)


def rpc_write_counted(request: Request, *, tenant_id: str) -> AbstractContextManager[WriteCount]:
    """`rpc_write_count`, folded into the write's own last statement (`core.ratelimit.write_counted`)."""
    return write_counted(token_id=str(request.auth.pk), tenant_id=tenant_id)


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
