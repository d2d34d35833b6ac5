"""The one validation path of the reservation request, for `capacity/preview` and `reservations/create`.

contract.md: both methods take the same body, "validated the same way". Both
views call `reservation_request_resolve`, which does, in this order:

1. parse the body (`parse_reservation_request`): INVALID_INPUT naming every
   bad field, a `start` more than 5 minutes past or beyond the horizon
   (`CAPACITY_MAX_START_AHEAD`) included;
2. decide on the pool (`ledger.access.decide_pool`): PERMISSION_DENIED
   without the method's permission on the tenant, NOT_FOUND when the pool is
   not visible to it;
3. a `projectId` must be one of the tenant's projects: NOT_FOUND otherwise
   (another tenant's project looks like one that does not exist);
4. the devices against the pool's sharing mode (`check_request_against_pool`):
   INVALID_INPUT naming `devices[i].sharing` or `devices[i].class`. A class the
   pool never serves (a `gpu` item in a MIG pool) is a bad request, not a
   request that finds no capacity: no release will ever make it fit.

Authentication (401) runs before the view, so the answer keeps the contract's
order 401, 400, 403, 404; the pool check needs the pool, so it comes last.
The create service and the preview selector take the result and check
nothing again.

Callers without a principal (the CLI, scripts, tests calling the service)
use `reservation_request_check`: steps 3 and 4, with the pool looked up by
its visibility to the request's tenant instead of decided for a principal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from core.errors import NotFound
from core.models import Principal
from core.ratelimit import WriteCount
from inventory.models import Pool, Project
from ledger.access import decide_pool, visible_pools
from reservations.request.parse import check_request_against_pool, parse_reservation_request
from reservations.request.types import ReservationRequest


@dataclass(frozen=True)
class ResolvedRequest:
    """A reservation request that passed every check, with the pool and the project it names."""

    request: ReservationRequest
    pool: Pool
    project: Project | None = None


def reservation_request_resolve(
    *, principal: Principal, data: Any, permission: str, counted_token_id: str | None = None
) -> ResolvedRequest:
    """Parse, decide on the pool, check the project and the pool's sharing mode (module docstring).

    A write names the token it is counted against (`counted_token_id`): the
    count rides in the pool's statement, and RATE_LIMITED comes after every
    other refusal of the request.
    """
    request = parse_reservation_request(data)
    rate = None
    if counted_token_id is not None:
        rate = WriteCount(token_id=counted_token_id, tenant_id=request.tenant_id)
    pool = decide_pool(
        principal=principal,
        tenant_id=request.tenant_id,
        pool_id=request.pool_id,
        permission=permission,
        rate=rate,
    )
    resolved = _resolved(request, pool)
    if rate is not None:
        rate.check_taken()
    return resolved


def reservation_request_check(request: ReservationRequest) -> ResolvedRequest:
    """The same checks for a parsed request without a principal: the pool must be visible to its tenant."""
    pool = visible_pools(tenant_id=request.tenant_id).filter(pk=request.pool_id).first()
    if pool is None:
        raise NotFound("pool not found")
    return _resolved(request, pool)


def _resolved(request: ReservationRequest, pool: Pool) -> ResolvedRequest:
    gang = request.raw.get("gang") if isinstance(request.raw, dict) else None
    named = isinstance(gang, dict) and "topologyKey" in gang
    if request.gang_size and pool.gang_topology_key and not named:
        # A gang that names no label groups by the pool's key (`pools/update`), else by `fabric`.
        request = replace(request, gang_topology_key=pool.gang_topology_key)
    project = None
    if request.project_id:
        project = Project.objects.filter(pk=request.project_id, tenant_id=request.tenant_id).first()
        if project is None:
            raise NotFound("project not found")
    check_request_against_pool(request, pool)
    return ResolvedRequest(request=request, pool=pool, project=project)


def resolve_refusals(twin: str) -> str:
    """The refusals `create` and `preview` share (`reservation_request_resolve`), for their API docs."""
    return (
        "Decided on the pool; NOT_FOUND for a `projectId` that is not the tenant's, INVALID_INPUT for a "
        f"device class or `sharing` the pool's sharing mode never serves, as `{twin}` answers."
    )
