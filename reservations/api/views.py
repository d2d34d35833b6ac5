"""`reservations/{create,get,list,release,renew}`.

Each method: validate the body, decide (`core.decisions`), call one service or
selector, serialize. `create` and `capacity/preview` take the same body through one path,
`reservations.request.resolve.reservation_request_resolve` (parse, decide on the
pool, the project, the pool's sharing mode), so they never disagree on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from rest_framework.request import Request
from rest_framework.response import Response

from core.api.rpc import (
    RpcViewSet,
    rpc_action,
    rpc_output,
    rpc_tenant_input,
    rpc_write_counted,
)
from core.api.schema import CURSOR_RULE
from core.authentication import actor_of, principal_of
from core.decisions import RESERVATIONS_READ, RESERVATIONS_WRITE
from reservations.api.serializers import (
    ReservationListInput,
    ReservationListOutput,
    ReservationOutput,
    ReservationRefInput,
)
from reservations.request.resolve import reservation_request_resolve, resolve_refusals
from reservations.request.serializers import RESERVATION_REQUEST_RULES, ReservationRequestSerializer
from reservations.selectors import reservation_get, reservation_list, reservation_payload
from reservations.services import reservation_create, reservation_release_id, reservation_renew

F = TypeVar("F", bound=Callable[..., Any])

# A write counts against the token's and the tenant's rate limits (`core.ratelimit`).
WRITE = ("RATE_LIMITED",)


def _reservation_action(
    method: str,
    summary: str,
    description: str = "",
    refuses: tuple[str, ...] = (),
) -> Callable[[F], F]:
    """`get`, `release` and `renew`: `{tenantId, reservationId}` in, the reservation out."""
    return rpc_action(
        method,
        request=ReservationRefInput,
        response=ReservationOutput,
        summary=summary,
        description=description,
        refuses=refuses,
    )


def _reservation_response(tenant_id: str, reservation_id: str, *, status: int = 200) -> Response:
    reservation = reservation_get(tenant_id=tenant_id, reservation_id=reservation_id)
    # `reservation_payload` already answers in the contract's shape (plain ints
    # and strings); `ReservationOutput` documents it (OpenAPI) without a second
    # pass through DRF fields on the hot path.
    return Response(reservation_payload(reservation), status=status)


class ReservationsViewSet(RpcViewSet):
    """The reservations group."""

    @rpc_action(
        "create",
        request=ReservationRequestSerializer,
        response=ReservationOutput,
        status=201,
        summary="Place and book a reservation",
        description=(
            "Runs the placer and books the atoms in one transaction. 201 with the reservation; the same "
            "`idempotencyKey` with the same request answers 200 with the same reservation, with a "
            "different request CONFLICT. NO_CAPACITY (after `wait.timeoutMs`) carries the placer's reason; "
            "QUOTA_EXCEEDED when the tenant's quota in the pool would be exceeded. "
            + resolve_refusals("capacity/preview")
        ),
        refuses=("CONFLICT", "NO_CAPACITY", "QUOTA_EXCEEDED", *WRITE),
        replay="The same `idempotencyKey` with the same request: the reservation it made, unchanged",
        rules=RESERVATION_REQUEST_RULES,
    )
    def create_reservation(self, request: Request) -> Response:
        # The write is counted in the statement that reads the pool.
        resolved = reservation_request_resolve(
            principal=principal_of(request),
            data=request.data,
            permission=RESERVATIONS_WRITE,
            counted_token_id=str(request.auth.pk),
        )
        result = reservation_create(request=resolved.request, actor=actor_of(request), pool=resolved.pool)
        reservation = result.reservation
        if result.created:
            # Built from what the create wrote: nothing to read back. Its stored
            # state (active or scheduled, by the database clock of this create)
            # is its derived state at this instant.
            return Response(
                reservation_payload(reservation, state=reservation.state, allocations=result.allocations),
                status=201,
            )
        return _reservation_response(resolved.request.tenant_id, reservation.pk)

    @_reservation_action("get", "One reservation")
    def get_reservation(self, request: Request) -> Response:
        data = rpc_tenant_input(request, ReservationRefInput, permission=RESERVATIONS_READ)
        return _reservation_response(data["tenant_id"], data["reservation_id"])

    @rpc_action(
        "list",
        request=ReservationListInput,
        response=ReservationListOutput,
        summary="The tenant's reservations, newest first",
        description="Cursor-paginated on (createdAt, id); `nextCursor` is null on the last page.",
        rules=(CURSOR_RULE,),
    )
    def list_reservations(self, request: Request) -> Response:
        data = rpc_tenant_input(request, ReservationListInput, permission=RESERVATIONS_READ)
        page, next_cursor = reservation_list(
            tenant_id=data["tenant_id"],
            pool_id=data.get("pool_id"),
            state=data.get("state"),
            limit=data["limit"],
            cursor=data.get("cursor"),
        )
        return rpc_output(
            ReservationListOutput,
            {"reservations": [reservation_payload(r) for r in page], "nextCursor": next_cursor},
        )

    @_reservation_action(
        "release",
        "Release a reservation now",
        "Its running bookings end at compute_now(), future ones are deleted; scalars, quota and "
        "rollup counts are given back. Releasing twice answers the same.",
        refuses=WRITE,
    )
    def release_reservation(self, request: Request) -> Response:
        data = rpc_tenant_input(
            request, ReservationRefInput, permission=RESERVATIONS_WRITE, count_write=False
        )
        # The service locks the row filtered by tenant (NOT_FOUND otherwise): no read before it.
        # The write is counted in the release's last statement.
        with rpc_write_counted(request, tenant_id=data["tenant_id"]) as rate:
            reservation = reservation_release_id(
                reservation_id=data["reservation_id"],
                actor=actor_of(request),
                tenant_id=data["tenant_id"],
                rate=rate,
            )
        if getattr(reservation, "allocations_json", None) is not None:
            # Released now: the release's own statement read the answer; nothing to read back.
            return Response(reservation_payload(reservation, state="released"))
        return _reservation_response(data["tenant_id"], reservation.pk)

    @_reservation_action(
        "renew",
        "Renew a reservation's lease",
        "A new `leaseExpiresAt`, `leaseSeconds` from now. CONFLICT without a lease or once ended.",
        refuses=("CONFLICT", *WRITE),
    )
    def renew_reservation(self, request: Request) -> Response:
        data = rpc_tenant_input(request, ReservationRefInput, permission=RESERVATIONS_WRITE)
        reservation = reservation_get(tenant_id=data["tenant_id"], reservation_id=data["reservation_id"])
        reservation_renew(reservation=reservation, actor=actor_of(request))
        return _reservation_response(data["tenant_id"], reservation.pk)
