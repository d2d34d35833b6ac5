"""Pool and offering management over HTTP (`pools/*`, `offerings/*`): operators change, tenants list.

Every refused change answers the contract's envelope and leaves the rows as
they were; every change is audited with its actor. The fleet-file rule: a
pool changed through the API is left alone by a later fleet load, which says so.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from core.models import AuditEvent, Tenant
from fleets.load import fleet_load
from inventory.models import Pool
from ledger.models import Offering, QuotaUsage
from tests.support.api import ClientFor, assert_error, invalid_fields, post_json
from tests.support.clock import now_ms
from tests.support.envelope import error_details
from tests.support.factories import DeviceFactory, NodeFactory, TenantFactory

pytestmark = pytest.mark.django_db


def rows() -> dict[str, Any]:
    """Every row these methods may write (the audit trail aside)."""
    return {
        "pools": list(
            Pool.objects.order_by("id").values_list(
                "id", "name", "sharing", "slots_per_gpu", "notice_seconds", "labels", "archived_at"
            )
        ),
        "offerings": list(Offering.objects.order_by("id").values_list("pool_id", "tenant_id")),
        "quotas": list(
            QuotaUsage.objects.order_by("id").values_list("pool_id", "tenant_id", "resource", "max", "mode")
        ),
    }


@pytest.fixture
def tenants(db: Any) -> list[Tenant]:
    return [TenantFactory.create(id=tenant) for tenant in ("acme", "beta", "gamma")]


@pytest.fixture
def operator_client(api_client_for: ClientFor, tenants: list[Tenant]) -> APIClient:
    return api_client_for(None, "operator")


def make_pool(client: APIClient, **extra: Any) -> dict[str, Any]:
    status, body = post_json(
        client, "pools/create", {"ownerTenantId": "acme", "name": "h100", "gpuModel": "H100", **extra}
    )
    assert status == 201, body
    return body


def test_an_operator_creates_lists_updates_archives_and_unarchives_a_pool(operator_client: APIClient) -> None:
    pool = make_pool(operator_client, labels={"region": "eu-west"}, gangTopologyKey="rack")
    assert (pool["ownerTenantId"], pool["name"], pool["sharing"], pool["labels"]) == (
        "acme",
        "h100",
        "exclusive",
        {"region": "eu-west"},
    )
    assert pool["gangTopologyKey"] == "rack" and pool["apiChangedAt"] is not None
    status, listed = post_json(operator_client, "pools/list", {"ownerTenantId": "acme"})
    assert status == 200 and [p["poolId"] for p in listed["pools"]] == [pool["poolId"]]
    status, updated = post_json(
        operator_client, "pools/update", {"poolId": pool["poolId"], "noticeSeconds": 120, "name": "h100-east"}
    )
    assert status == 200 and (updated["noticeSeconds"], updated["name"]) == (120, "h100-east")
    status, archived = post_json(operator_client, "pools/archive", {"poolId": pool["poolId"]})
    assert status == 200 and archived["archived"] and archived["archivedAt"]
    assert post_json(operator_client, "pools/list", {"archived": False})[1]["pools"] == []
    status, back = post_json(operator_client, "pools/unarchive", {"poolId": pool["poolId"]})
    assert status == 200 and not back["archived"]
    actions = list(
        AuditEvent.objects.filter(subject_id=pool["poolId"]).order_by("id").values_list("action", "actor")
    )
    assert [a for a, _ in actions] == ["pool.create", "pool.update", "pool.archive", "pool.unarchive"]
    assert all(actor.startswith("test operator@platform <") for _, actor in actions), actions


def test_pools_list_pages_with_a_cursor(operator_client: APIClient) -> None:
    ids = [make_pool(operator_client, name=f"p{i}")["poolId"] for i in range(3)]
    first = post_json(operator_client, "pools/list", {"limit": 2})[1]
    assert [p["poolId"] for p in first["pools"]] == ids[:2] and first["nextCursor"] == ids[1]
    second = post_json(operator_client, "pools/list", {"limit": 2, "cursor": first["nextCursor"]})[1]
    assert [p["poolId"] for p in second["pools"]] == ids[2:] and second["nextCursor"] is None


def test_a_refused_pool_change_answers_the_envelope_and_changes_nothing(operator_client: APIClient) -> None:
    pool = make_pool(operator_client)
    make_pool(operator_client, name="taken")
    node = NodeFactory(pool_id=pool["poolId"])
    DeviceFactory(node=node)  # a whole-GPU atom
    before = rows()
    status, body = post_json(operator_client, "pools/update", {"poolId": pool["poolId"], "name": "taken"})
    assert_error(status, body, "CONFLICT", 409)
    status, body = post_json(
        operator_client, "pools/update", {"poolId": pool["poolId"], "sharing": "timeslice", "slotsPerGpu": 4}
    )
    assert_error(status, body, "CONFLICT", 409)
    assert "1 GPU atoms" in body["error"]["message"]
    status, body = post_json(operator_client, "pools/update", {"poolId": pool["poolId"], "sharing": "mps"})
    assert invalid_fields(status, body) == {"slotsPerGpu"}
    status, body = post_json(operator_client, "pools/create", {"ownerTenantId": "acme", "name": "h100"})
    assert_error(status, body, "CONFLICT", 409)
    status, body = post_json(operator_client, "pools/create", {"ownerTenantId": "nobody", "name": "x"})
    assert invalid_fields(status, body) == {"ownerTenantId"}
    status, body = post_json(
        operator_client, "pools/create", {"ownerTenantId": "acme", "name": "bad name", "colour": "red"}
    )
    assert invalid_fields(status, body) == {"name", "colour"}
    status, body = post_json(
        operator_client, "pools/update", {"poolId": "pool_" + "0" * 26, "noticeSeconds": 5}
    )
    assert_error(status, body, "NOT_FOUND", 404)
    assert rows() == before
    assert not AuditEvent.objects.filter(action="pool.update").exists()


def test_the_sharing_mode_changes_while_no_atom_contradicts_it(operator_client: APIClient) -> None:
    pool = make_pool(operator_client)
    status, body = post_json(
        operator_client, "pools/update", {"poolId": pool["poolId"], "sharing": "timeslice", "slotsPerGpu": 4}
    )
    assert status == 200 and (body["sharing"], body["slotsPerGpu"]) == ("timeslice", 4)
    status, body = post_json(operator_client, "pools/update", {"poolId": pool["poolId"], "sharing": "mig"})
    assert status == 200 and (body["sharing"], body["slotsPerGpu"]) == ("mig", None)


def offer(client: APIClient, pool_id: str, **extra: Any) -> tuple[int, Any]:
    return post_json(client, "offerings/create", {"poolId": pool_id, "tenantId": "beta", **extra})


def test_an_operator_offers_changes_and_withdraws_an_offering(
    operator_client: APIClient, api_client_for: ClientFor
) -> None:
    pool = make_pool(operator_client)
    status, body = offer(
        operator_client, pool["poolId"], quota={"gpu": 16, "vcpu": 64}, quotaMode="concurrent"
    )
    assert status == 201, body
    assert body["tenantId"] == "beta" and body["quota"] == [
        {"resource": "gpu", "max": 16, "used": 0, "mode": "concurrent"},
        {"resource": "vcpu", "max": 64, "used": 0, "mode": "concurrent"},
    ]
    status, body = post_json(
        operator_client,
        "offerings/update",
        {
            "poolId": pool["poolId"],
            "tenantId": "beta",
            "quota": {"gpu": 8, "vcpu": None},
            "quotaMode": "counter",
        },
    )
    assert status == 200 and body["quota"] == [{"resource": "gpu", "max": 8, "used": 0, "mode": "counter"}]
    status, body = post_json(
        operator_client, "offerings/withdraw", {"poolId": pool["poolId"], "tenantId": "beta"}
    )
    assert status == 200 and body["withdrawn"] is True
    assert not Offering.objects.exists() and not QuotaUsage.objects.exists()
    actions = list(
        AuditEvent.objects.filter(action__startswith="offering.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["offering.create", "offering.update", "offering.withdraw"]


def _booked(pool_id: str, client: APIClient, gpus: int = 2) -> dict[str, Any]:
    node = NodeFactory(pool_id=pool_id)
    for _ in range(4):
        DeviceFactory(node=node, attributes={"gpuModel": "H100", "vramGiB": 80, "numaNode": 0})
    status, body = post_json(
        client,
        "reservations/create",
        {
            "tenantId": "beta",
            "poolId": pool_id,
            "devices": [{"class": "gpu", "count": gpus}],
            "duration": "1h",
            "idempotencyKey": f"held-{now_ms()}",
        },
    )
    assert status == 201, body
    return body


def test_lowering_a_counter_quota_below_its_use_and_withdrawing_with_live_reservations_are_refused(
    operator_client: APIClient, api_client_for: ClientFor
) -> None:
    pool = make_pool(operator_client)
    assert offer(operator_client, pool["poolId"], quota={"gpu": 4})[0] == 201
    beta = api_client_for("beta", "member")
    held = _booked(pool["poolId"], beta, gpus=2)
    before = rows()
    status, body = post_json(
        operator_client,
        "offerings/update",
        {"poolId": pool["poolId"], "tenantId": "beta", "quota": {"gpu": 1}},
    )
    assert_error(status, body, "CONFLICT", 409)
    assert error_details(body) == [
        {
            "field": "quota.gpu",
            "message": "2 in use, above a limit of 1",
            "resource": "gpu",
            "used": 2,
            "max": 1,
        }
    ]
    status, body = post_json(
        operator_client, "offerings/withdraw", {"poolId": pool["poolId"], "tenantId": "beta"}
    )
    assert_error(status, body, "CONFLICT", 409)
    assert "1 live reservations" in body["error"]["message"]
    assert rows() == before
    # Concurrent mode may be lowered below what is held: the held stays, new charges are refused.
    status, body = post_json(
        operator_client,
        "offerings/update",
        {"poolId": pool["poolId"], "tenantId": "beta", "quota": {"gpu": 1}, "quotaMode": "concurrent"},
    )
    assert status == 200 and body["quota"] == [{"resource": "gpu", "max": 1, "used": 2, "mode": "concurrent"}]
    # Once released, the offering can go.
    post_json(beta, "reservations/release", {"tenantId": "beta", "reservationId": held["id"]})
    status, body = post_json(
        operator_client, "offerings/withdraw", {"poolId": pool["poolId"], "tenantId": "beta"}
    )
    assert status == 200


def test_bad_offerings_are_refused_with_nothing_changed(operator_client: APIClient) -> None:
    pool = make_pool(operator_client)
    assert offer(operator_client, pool["poolId"], quota={"gpu": 4})[0] == 201
    before = rows()
    status, body = offer(operator_client, pool["poolId"])
    assert_error(status, body, "CONFLICT", 409)
    status, body = post_json(
        operator_client, "offerings/create", {"poolId": pool["poolId"], "tenantId": "acme"}
    )
    assert invalid_fields(status, body) == {"tenantId"}
    status, body = post_json(
        operator_client,
        "offerings/create",
        {"poolId": pool["poolId"], "tenantId": "gamma", "quota": {"tpu": 4}, "quotaMode": "peak"},
    )
    assert invalid_fields(status, body) == {"quota", "quotaMode"}
    status, body = post_json(
        operator_client,
        "offerings/update",
        {"poolId": pool["poolId"], "tenantId": "gamma", "quota": {"gpu": 1}},
    )
    assert_error(status, body, "NOT_FOUND", 404)
    status, body = post_json(
        operator_client,
        "offerings/update",
        {"poolId": pool["poolId"], "tenantId": "beta", "quota": {"gpu": -1}},
    )
    assert invalid_fields(status, body) == {"quota.gpu"}
    assert rows() == before


def test_a_tenant_lists_its_own_offerings_and_never_an_archived_pools(
    operator_client: APIClient, api_client_for: ClientFor
) -> None:
    shown = make_pool(operator_client, name="shown")
    hidden = make_pool(operator_client, name="hidden")
    elsewhere = make_pool(operator_client, name="gammas")
    for pool in (shown, hidden):
        assert offer(operator_client, pool["poolId"], quota={"gpu": 8})[0] == 201
    assert (
        post_json(operator_client, "offerings/create", {"poolId": elsewhere["poolId"], "tenantId": "gamma"})[
            0
        ]
        == 201
    )
    post_json(operator_client, "pools/archive", {"poolId": hidden["poolId"]})
    for role in ("member", "viewer"):
        status, body = post_json(api_client_for("beta", role), "offerings/list", {"tenantId": "beta"})
        assert status == 200 and [o["poolId"] for o in body["offerings"]] == [shown["poolId"]], role
        assert body["offerings"][0]["quota"] == [{"resource": "gpu", "max": 8, "used": 0, "mode": "counter"}]
        status, body = post_json(api_client_for("beta", role), "offerings/list", {"tenantId": "gamma"})
        assert_error(status, body, "PERMISSION_DENIED", 403)
        status, body = post_json(api_client_for("beta", role), "offerings/list", {})
        assert_error(status, body, "PERMISSION_DENIED", 403)
    status, body = post_json(operator_client, "offerings/list", {})
    assert status == 200 and len(body["offerings"]) == 3


def fleet(notice: int = 30, quota: int = 16) -> dict[str, Any]:
    return {
        "tenants": [{"id": "acme", "name": "Acme"}, {"id": "beta", "name": "Beta"}],
        "pools": [
            {
                "name": "filed",
                "owner": "acme",
                "noticeSeconds": notice,
                "offers": [{"tenant": "beta", "quota": {"gpu": quota}}],
            },
            {
                "name": "changed",
                "owner": "acme",
                "noticeSeconds": notice,
                "offers": [{"tenant": "beta", "quota": {"gpu": quota}}],
            },
        ],
        "nodes": [],
    }


def test_a_fleet_file_loaded_after_api_changes_keeps_them_and_says_so(operator_client: APIClient) -> None:
    ids = fleet_load(data=fleet())
    assert "keptByApi" not in ids
    changed = ids["pools"]["acme/changed"]
    post_json(operator_client, "pools/update", {"poolId": changed, "noticeSeconds": 600})
    post_json(
        operator_client, "offerings/update", {"poolId": changed, "tenantId": "beta", "quota": {"gpu": 4}}
    )
    again = fleet_load(data=fleet(notice=45, quota=32))
    assert again["keptByApi"] == ["acme/changed"] and again["pools"] == ids["pools"]
    kept = Pool.objects.get(pk=changed)
    assert kept.notice_seconds == 600
    assert QuotaUsage.objects.get(pool_id=changed, tenant_id="beta").max == 4
    # The pool the API never touched follows the file, through the same services (audited as the loader).
    filed = Pool.objects.get(pk=ids["pools"]["acme/filed"])
    assert filed.notice_seconds == 45
    assert QuotaUsage.objects.get(pool=filed, tenant_id="beta").max == 32
    assert AuditEvent.objects.filter(subject_id=filed.pk, action="pool.update", actor="fleet-loader").exists()
    # A withdrawn offering stays withdrawn: the file does not offer it again.
    post_json(operator_client, "offerings/withdraw", {"poolId": changed, "tenantId": "beta"})
    fleet_load(data=fleet())
    assert not Offering.objects.filter(pool_id=changed).exists()


def test_the_management_methods_are_in_the_openapi_document_with_examples(client: Any) -> None:
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    for method in (
        "pools/create",
        "pools/update",
        "pools/archive",
        "pools/unarchive",
        "pools/list",
        "offerings/create",
        "offerings/update",
        "offerings/withdraw",
        "offerings/list",
    ):
        operation = schema["paths"][f"/api/compute/{method}"]["post"]
        examples = operation["requestBody"]["content"]["application/json"].get("examples")
        assert examples, method


def test_a_gang_that_names_no_label_groups_by_the_pools_gang_topology_key(
    operator_client: APIClient, api_client_for: ClientFor
) -> None:
    pool = make_pool(operator_client, gangTopologyKey="rack")
    for fabric in ("ib-a", "ib-b"):
        node = NodeFactory(pool_id=pool["poolId"], labels={"fabric": fabric, "rack": "r01"})
        DeviceFactory(node=node, attributes={"gpuModel": "H100", "vramGiB": 80, "numaNode": 0})
    body = {
        "tenantId": "acme",
        "poolId": pool["poolId"],
        "devices": [{"class": "gpu", "count": 1}],
        "gang": {"size": 2},
        "duration": "1h",
        "idempotencyKey": "gang-1",
    }
    acme = api_client_for("acme", "member")
    # One rack, two fabrics: the pool's key (rack) fits the gang, a named `fabric` does not.
    assert post_json(acme, "capacity/preview", body)[1]["fits"] is True
    named = {**body, "gang": {"size": 2, "topologyKey": "fabric"}}
    assert post_json(acme, "capacity/preview", named)[1]["fits"] is False
    post_json(operator_client, "pools/update", {"poolId": pool["poolId"], "gangTopologyKey": ""})
    assert post_json(acme, "capacity/preview", body)[1]["fits"] is False


def test_pool_labels_and_gang_keys_are_checked(operator_client: APIClient) -> None:
    pool = make_pool(operator_client)
    before = rows()
    status, body = post_json(
        operator_client,
        "pools/update",
        {"poolId": pool["poolId"], "labels": {"bad key": "x"}, "gangTopologyKey": "two words"},
    )
    assert invalid_fields(status, body) == {"labels", "gangTopologyKey"}
    status, body = post_json(
        operator_client,
        "pools/update",
        {"poolId": pool["poolId"], "labels": {f"k{i}": "v" for i in range(65)}},
    )
    assert invalid_fields(status, body) == {"labels"}
    assert rows() == before


def test_switching_a_concurrent_offering_holding_more_than_its_limit_to_counter_is_refused(
    operator_client: APIClient, api_client_for: ClientFor
) -> None:
    pool = make_pool(operator_client)
    assert offer(operator_client, pool["poolId"], quota={"gpu": 2}, quotaMode="concurrent")[0] == 201
    beta = api_client_for("beta", "member")
    _booked(pool["poolId"], beta, gpus=2)
    status, body = post_json(
        beta,
        "reservations/create",
        {
            "tenantId": "beta",
            "poolId": pool["poolId"],
            "devices": [{"class": "gpu", "count": 2}],
            "duration": "1h",
            "start": now_ms() + 7 * 24 * 3_600_000,
            "idempotencyKey": "next-week",
        },
    )
    assert status == 201, body
    before = rows()
    status, body = post_json(
        operator_client,
        "offerings/update",
        {"poolId": pool["poolId"], "tenantId": "beta", "quotaMode": "counter"},
    )
    assert_error(status, body, "CONFLICT", 409)
    assert error_details(body) == [
        {
            "field": "quota.gpu",
            "message": "4 in use, above a limit of 2",
            "resource": "gpu",
            "used": 4,
            "max": 2,
        }
    ]
    assert rows() == before
