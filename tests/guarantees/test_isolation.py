"""Tenant isolation and credentials: every method x pool (owned, offered, foreign, archived) x token.

The caller always names tenant `acme`. Relative to it, the pools are:

* owned: acme owns it;
* offered: `rival` owns it and offers it to acme;
* foreign: `rival` owns it and does not offer it;
* archived: `rival` owns it, offered it to acme, then archived it.

Each pool has a node with GPUs and a reservation with a lease: acme's in the
owned, offered and archived pools (made before the archive), rival's in the
foreign one. The tokens are acme's member and viewer, a member of rival, a
platform operator, two node agents narrowed by `issue_token` (one to the owned
pool's nodes, one to the offered pool's node), none, a revoked one and an
expired one.

The answer of each cell follows the contract: no credential (or an unknown,
revoked or expired one) is UNAUTHENTICATED before anything else; a credential
without the permission on `acme` is PERMISSION_DENIED before any pool or
reservation is looked up (so it learns nothing about what exists); a pool not
owned by or offered to acme, or archived and not acme's, is NOT_FOUND; node
and inventory methods are for platform bindings only, and a narrowed node
agent reports only for the nodes it was issued for (PERMISSION_DENIED for any
other) and lists only those. Pool and offering management (`pools/create` …
`offerings/withdraw`) is for operators only; `offerings/list` for `acme` is a
read on the tenant (its own offerings), PERMISSION_DENIED to any other tenant.

Decision recorded here where the contract is silent: a tenant keeps access to
its own reservation after the pool it was made in is archived (get, renew and,
above all, release), because the reservation is decided on the tenant and
archiving a pool must not strand running bookings.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from core import authentication
from core.models import ApiToken
from core.services import token_issue, token_revoke
from inventory.models import Device, Node, Pool
from reservations.request.parse import parse_reservation_request
from reservations.services import reservation_create
from tests.support.api import bearer_client, post
from tests.support.commands import run_command
from tests.support.envelope import error_without_request_id
from tests.support.factories import DeviceFactory, NodeFactory, OfferingFactory, PoolFactory, TenantFactory

CALLER = "acme"
POOL_KINDS = ("owned", "offered", "foreign", "archived")
# The node agents narrowed to a scope, and the pool kinds whose node each reaches.
AGENT_REACH = {"pool-agent": ("owned",), "node-agent": ("offered",)}
TOKEN_KINDS = ("tenant", "viewer", "other-tenant", "operator", *AGENT_REACH, "none", "revoked", "expired")


@dataclass
class World:
    pools: dict[str, Pool]
    nodes: dict[str, Node]
    devices: dict[str, Device]
    reservations: dict[str, str]
    tokens: dict[str, str | None]


def _book(pool: Pool, tenant_id: str, key: str) -> str:
    request = parse_reservation_request(
        {
            "tenantId": tenant_id,
            "poolId": pool.id,
            "devices": [{"class": "gpu", "count": 1}],
            "duration": "2h",
            "leaseSeconds": 3600,
            "idempotencyKey": key,
        }
    )
    reservation, _ = reservation_create(request=request, actor="setup")
    return str(reservation.pk)


def _issue_agent(*scope: str) -> str:
    """A node-agent token as `issue_token` prints it, narrowed by `scope`."""
    args = ("--platform", "--role", "node-agent", *scope)
    return run_command("issue_token", *args, stderr=io.StringIO()).strip()


@pytest.fixture
def world(db: Any) -> World:
    acme = TenantFactory(id=CALLER)
    rival = TenantFactory(id="rival")
    pools = {
        "owned": PoolFactory(owner=acme, name="acme-own"),
        "offered": PoolFactory(owner=rival, name="rival-offered"),
        "foreign": PoolFactory(owner=rival, name="rival-private"),
        "archived": PoolFactory(owner=rival, name="rival-archived"),
    }
    OfferingFactory(pool=pools["offered"], tenant=acme)
    OfferingFactory(pool=pools["archived"], tenant=acme)
    # Offered every pool by the management cells (`offerings/create`), then withdrawn.
    TenantFactory(id="matrix-guest")
    nodes: dict[str, Node] = {}
    devices: dict[str, Device] = {}
    for kind, pool in pools.items():
        nodes[kind] = NodeFactory.create(pool=pool, hostname=f"iso-{kind}")
        for index in range(4):
            device = DeviceFactory.create(node=nodes[kind])
            if index == 3:
                devices[kind] = device  # never booked: free to flip
    reservations = {
        kind: _book(pools[kind], CALLER if kind != "foreign" else rival.id, f"iso-{kind}")
        for kind in POOL_KINDS
    }
    Pool.objects.filter(pk=pools["archived"].pk).update(archived_at=timezone.now())
    pools["archived"].refresh_from_db()

    revoked_row, revoked = token_issue(tenant_id=CALLER, role="member", name="revoked")
    token_revoke(token=revoked_row)
    expired_row, expired = token_issue(tenant_id=CALLER, role="member", name="expired", expires_in_seconds=60)
    ApiToken.objects.filter(pk=expired_row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    tokens: dict[str, str | None] = {
        "tenant": token_issue(tenant_id=CALLER, role="member", name="acme member")[1],
        "viewer": token_issue(tenant_id=CALLER, role="viewer", name="acme viewer")[1],
        "other-tenant": token_issue(tenant_id=rival.id, role="member", name="rival member")[1],
        "operator": token_issue(tenant_id=None, role="operator", name="operator")[1],
        "pool-agent": _issue_agent("--pool", pools["owned"].id),
        "node-agent": _issue_agent("--node", nodes["offered"].id),
        "none": None,
        "revoked": revoked,
        "expired": expired,
    }
    return World(pools=pools, nodes=nodes, devices=devices, reservations=reservations, tokens=tokens)


# What each method needs: the permission's scope ("tenant", "pool" or "platform") and its kind.
TENANT_READS = ("capacity/summary", "reservations/list", "offerings/list")
RESERVATION_READS = ("reservations/get",)
RESERVATION_WRITES = ("reservations/renew", "reservations/release")
POOL_READS = (
    "capacity/byPool",
    "pools/capacity",
    "capacity/timeline",
    "capacity/preview",
    "capacity/explain",
    "capacity/earliest",
    "usage/hourly",
)
POOL_WRITES = ("reservations/create",)
PLATFORM = (
    "nodes/get",
    "nodes/cordon",
    "nodes/uncordon",
    "nodes/taint",
    "nodes/untaint",
    "nodes/setMaintenance",
    "devices/setHealth",
    "inventory/report",
    "nodes/list",
)
# Operators only; last in the matrix, as their cells change pools (each body is valid for every pool).
MANAGE = (
    *(f"pools/{verb}" for verb in ("create", "update", "archive", "unarchive", "list")),
    *(f"offerings/{verb}" for verb in ("create", "update", "withdraw")),
)
METHODS = TENANT_READS + RESERVATION_READS + POOL_READS + POOL_WRITES + PLATFORM + RESERVATION_WRITES + MANAGE


def body_for(method: str, kind: str, world: World, cell: str) -> dict[str, Any]:
    pool = world.pools[kind]
    node = world.nodes[kind]
    request = {
        "tenantId": CALLER,
        "poolId": pool.id,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h",
        "idempotencyKey": "matrix:" + cell.replace("/", ".").replace("|", ":"),
    }
    return {
        "capacity/summary": {"tenantId": CALLER},
        "reservations/list": {"tenantId": CALLER, "poolId": pool.id},
        "reservations/get": {"tenantId": CALLER, "reservationId": world.reservations[kind]},
        "reservations/renew": {"tenantId": CALLER, "reservationId": world.reservations[kind]},
        "reservations/release": {"tenantId": CALLER, "reservationId": world.reservations[kind]},
        "capacity/byPool": {"tenantId": CALLER, "poolId": pool.id},
        "pools/capacity": {"tenantId": CALLER, "poolId": pool.id},
        "capacity/timeline": {"tenantId": CALLER, "poolId": pool.id},
        "usage/hourly": {"tenantId": CALLER, "poolId": pool.id, "from": 0, "to": 86_400_000},
        "capacity/preview": request,
        "capacity/explain": request,
        "capacity/earliest": request,
        "reservations/create": request,
        "offerings/list": {"tenantId": CALLER},
        "pools/create": {"ownerTenantId": CALLER, "name": f"matrix-{kind}"},
        "pools/update": {"poolId": pool.id, "labels": {"matrix": kind}},
        "pools/archive": {"poolId": pool.id},
        "pools/unarchive": {"poolId": pool.id},
        "pools/list": {"ownerTenantId": CALLER},
        "offerings/create": {"poolId": pool.id, "tenantId": "matrix-guest", "quota": {"gpu": 1}},
        "offerings/update": {"poolId": pool.id, "tenantId": "matrix-guest", "quota": {"gpu": 2}},
        "offerings/withdraw": {"poolId": pool.id, "tenantId": "matrix-guest"},
        "nodes/get": {"nodeId": node.id},
        "nodes/list": {"poolId": pool.id},
        "nodes/cordon": {"nodeId": node.id, "reason": "matrix"},
        "nodes/uncordon": {"nodeId": node.id},
        "nodes/taint": {"nodeId": node.id, "key": "matrix/t", "effect": "PreferNoSchedule"},
        "nodes/untaint": {"nodeId": node.id, "key": "matrix/t"},
        "nodes/setMaintenance": {"nodeId": node.id, "on": False},
        "devices/setHealth": {"deviceUid": world.devices[kind].uid, "healthy": True},
        "inventory/report": {
            "nodeId": node.id,
            "report": {
                "hostname": node.hostname,
                "gpus": [
                    {"uuid": uid, "product": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559}
                    for uid in Device.objects.filter(node=node).order_by("id").values_list("uid", flat=True)
                ],
            },
        },
    }[method]


def expected(method: str, kind: str, token: str) -> tuple[int, str | None]:
    """The contract's answer for one cell: (HTTP status, error code or None)."""
    if token in ("none", "revoked", "expired"):
        return 401, "UNAUTHENTICATED"
    if token in AGENT_REACH:
        # A narrowed agent: its own nodes' reports, and a list (of its nodes only); nothing else.
        if method == "nodes/list" or (method == "inventory/report" and kind in AGENT_REACH[token]):
            return 200, None
        return 403, "PERMISSION_DENIED"
    if method in MANAGE:
        if token != "operator":
            return 403, "PERMISSION_DENIED"
        return (201, None) if method.endswith("/create") else (200, None)
    if method in PLATFORM:
        return (200, None) if token == "operator" else (403, "PERMISSION_DENIED")
    if token == "other-tenant":
        return 403, "PERMISSION_DENIED"
    writes = method in POOL_WRITES + RESERVATION_WRITES
    if token == "viewer" and writes:
        return 403, "PERMISSION_DENIED"
    if method in TENANT_READS:
        return 200, None
    if method in RESERVATION_READS + RESERVATION_WRITES:
        # The foreign pool's reservation is rival's: acme cannot see it, whoever asks for acme.
        return (404, "NOT_FOUND") if kind == "foreign" else (200, None)
    if kind in ("foreign", "archived"):
        return 404, "NOT_FOUND"
    return (201, None) if method == "reservations/create" else (200, None)


def call(token: str | None, method: str, body: dict[str, Any]) -> Any:
    return post(bearer_client(token) if token is not None else APIClient(), method, body)


@pytest.mark.django_db
@pytest.mark.parametrize("token_kind", TOKEN_KINDS)
def test_every_method_on_every_pool_answers_what_the_contract_says(world: World, token_kind: str) -> None:
    wrong: list[str] = []
    for method in METHODS:
        for kind in POOL_KINDS:
            cell = f"{method}|{kind}|{token_kind}"
            response = call(world.tokens[token_kind], method, body_for(method, kind, world, cell))
            status, code = expected(method, kind, token_kind)
            body = response.json()
            got_code = body.get("error", {}).get("code") if isinstance(body, dict) else None
            if response.status_code != status or got_code != code:
                wrong.append(f"{cell}: expected {status} {code}, got {response.status_code} {body}")
                continue
            if code is not None:
                assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert not wrong, "\n".join(wrong)


@pytest.mark.django_db
def test_the_summary_lists_only_pools_the_tenant_owns_or_is_offered_and_never_an_archived_one(
    world: World,
) -> None:
    for token_kind in ("tenant", "viewer", "operator"):
        answer = call(world.tokens[token_kind], "capacity/summary", {"tenantId": CALLER}).json()
        listed = {pool["poolId"] for pool in answer["pools"]}
        assert listed == {world.pools["owned"].id, world.pools["offered"].id}, token_kind


@pytest.mark.django_db
def test_a_tenant_list_never_shows_another_tenants_reservations(world: World) -> None:
    for kind in POOL_KINDS:
        answer = call(
            world.tokens["operator"],
            "reservations/list",
            {"tenantId": CALLER, "poolId": world.pools[kind].id},
        ).json()
        ids = {r["id"] for r in answer["reservations"]}
        assert world.reservations["foreign"] not in ids
        assert all(r["tenantId"] == CALLER for r in answer["reservations"])


@pytest.mark.django_db
def test_not_found_never_says_whether_the_pool_exists(world: World) -> None:
    missing_pool = "pool_" + "0" * 26
    for kind in ("foreign", "archived"):
        hidden = call(
            world.tokens["tenant"], "capacity/byPool", {"tenantId": CALLER, "poolId": world.pools[kind].id}
        )
        absent = call(world.tokens["tenant"], "capacity/byPool", {"tenantId": CALLER, "poolId": missing_pool})
        # The same answer but for each request's own id.
        assert (hidden.status_code, error_without_request_id(hidden.json())) == (
            absent.status_code,
            error_without_request_id(absent.json()),
        )


@pytest.mark.django_db
def test_tokens_are_stored_only_as_hashes(world: World) -> None:
    secret = world.tokens["tenant"]
    assert secret is not None
    row = ApiToken.objects.get(digest=hashlib.sha256(secret.encode()).hexdigest())
    # Only a short display prefix survives in clear, never enough to use.
    assert row.prefix == secret[: len(row.prefix)] and len(row.prefix) < len(secret) // 3
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(t)::text FROM core_apitoken t")
        dumped = " ".join(r[0] for r in cursor.fetchall())
    for plain in world.tokens.values():
        if plain is not None:
            assert plain not in dumped


@pytest.mark.django_db
def test_tokens_are_compared_in_constant_time(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[str, str]] = []
    real = authentication.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(authentication.hmac, "compare_digest", spy)
    response = call(world.tokens["tenant"], "capacity/summary", {"tenantId": CALLER})
    assert response.status_code == 200
    assert compared and all(len(a) == len(b) == 64 for a, b in compared)
    # A near miss (one character off) is refused like any unknown token.
    secret = world.tokens["tenant"]
    assert secret is not None
    near = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    assert call(near, "capacity/summary", {"tenantId": CALLER}).status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        "Bearer  ",
        "Basic dXNlcjpwYXNz",
        "Bearer a b",
        "bearer bc_x",
        "Token bc_x",
        "Bearer \u00e9t\u00e9",
    ],
)
def test_malformed_authorization_headers_are_unauthenticated(world: World, header: str) -> None:
    client = APIClient()
    response = client.post(
        "/api/compute/capacity/summary", {"tenantId": CALLER}, format="json", HTTP_AUTHORIZATION=header
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


@pytest.mark.django_db
def test_a_node_agent_may_report_and_nothing_else(world: World) -> None:
    _, agent = token_issue(tenant_id=None, role="node-agent", name="agent")
    report = body_for("inventory/report", "owned", world, "agent")
    assert call(agent, "inventory/report", report).status_code == 200
    for method in ("nodes/cordon", "devices/setHealth", "capacity/summary", "reservations/create"):
        response = call(agent, method, body_for(method, "owned", world, f"agent-{method}"))
        assert response.status_code == 403, (method, response.json())


@pytest.mark.django_db
def test_a_narrowed_agent_lists_only_its_nodes_and_wipes_none_of_the_others(world: World) -> None:
    for token_kind, reach in AGENT_REACH.items():
        for kind in POOL_KINDS:
            node = world.nodes[kind]
            listed = call(world.tokens[token_kind], "nodes/list", {"poolId": world.pools[kind].id}).json()
            assert [n["id"] for n in listed["nodes"]] == ([node.id] if kind in reach else []), (
                token_kind,
                kind,
            )
            if kind in reach:
                continue
            before = sorted(Device.objects.filter(node=node).values_list("uid", "healthy", "vanished_at"))
            heartbeat = Node.objects.get(pk=node.pk).last_heartbeat_at
            wipe = {"nodeId": node.id, "report": {"hostname": node.hostname, "gpus": []}}
            response = call(world.tokens[token_kind], "inventory/report", wipe)
            assert response.status_code == 403, (token_kind, kind, response.json())
            after = sorted(Device.objects.filter(node=node).values_list("uid", "healthy", "vanished_at"))
            assert after == before and Node.objects.get(pk=node.pk).last_heartbeat_at == heartbeat
        everything = call(world.tokens[token_kind], "nodes/list", {}).json()
        assert {n["id"] for n in everything["nodes"]} == {world.nodes[k].id for k in reach}


# --- At-risk reservations: a tenant sees its own marks, and only a count of the pool's --------


@pytest.mark.django_db
def test_another_tenants_at_risk_reservation_shows_only_as_the_pools_count(world: World) -> None:
    """`atRisk` is on the tenant's own reservations; `capacity/byPool` counts the pool's, never naming one."""
    from operations.services import device_set_health
    from reservations.lifecycle.repair_sweep import bookings_repair

    pool = world.pools["offered"]
    rivals = _book(pool, "rival", "iso-rival-at-risk")
    rival_uid = Device.objects.get(bookings__allocation__reservation_id=rivals).uid
    device_set_health(
        device=Device.objects.get(uid=rival_uid), healthy=False, reason="XID 79", actor="operator"
    )
    assert bookings_repair() == 1

    acme = world.tokens["tenant"]
    by_pool = call(acme, "capacity/byPool", {"tenantId": CALLER, "poolId": pool.id}).json()
    assert by_pool["atRiskReservations"] == 1
    assert rivals not in json.dumps(by_pool) and rival_uid not in json.dumps(by_pool)
    listed = call(acme, "reservations/list", {"tenantId": CALLER, "poolId": pool.id}).json()
    assert [r["id"] for r in listed["reservations"]] == [world.reservations["offered"]]
    assert listed["reservations"][0]["atRisk"] is None
    assert call(acme, "reservations/get", {"tenantId": CALLER, "reservationId": rivals}).status_code == 404
    rival = world.tokens["other-tenant"]
    mine = call(rival, "reservations/get", {"tenantId": "rival", "reservationId": rivals}).json()
    assert mine["atRisk"]["reason"] == f"GPU {rival_uid} is unhealthy; it is running and cannot move"
    # Another tenant's pool, not offered to acme: not even the count.
    foreign = world.pools["foreign"]
    refused = call(acme, "capacity/byPool", {"tenantId": CALLER, "poolId": foreign.id})
    assert refused.status_code == 404 and set(refused.json()) == {"error"}


# --- Usage: a tenant sees its own hours only --------------------------------------------------


@pytest.mark.django_db
def test_a_tenants_usage_never_shows_another_tenants_hours(world: World) -> None:
    """Every pool's reservation has run an hour; acme's usage is its own, whoever asks for acme."""
    from core.clock import compute_now, set_clock_offset, to_millis

    start = compute_now()
    set_clock_offset(timedelta(hours=1))
    try:
        times = {"from": to_millis(start), "to": to_millis(start + timedelta(hours=1))}
        acme_pools = {world.pools[kind].id for kind in ("owned", "offered", "archived")}
        for token in ("tenant", "viewer", "operator"):
            answer = call(world.tokens[token], "usage/hourly", {"tenantId": CALLER, **times}).json()
            assert {row["poolId"] for row in answer["rows"]} == acme_pools, token
        rival = call(world.tokens["other-tenant"], "usage/hourly", {"tenantId": "rival", **times}).json()
        assert {row["poolId"] for row in rival["rows"]} == {world.pools["foreign"].id}
        denied = call(world.tokens["other-tenant"], "usage/hourly", {"tenantId": CALLER, **times})
        assert denied.status_code == 403
    finally:
        set_clock_offset(timedelta(0))
