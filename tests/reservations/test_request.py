"""The reservation request: every field of the seeds' preview table, the class/sharing/pool rules,
selectors against the registry, the start rule, and the canonical digest."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest

from core.clock import compute_now, set_clock_offset, to_millis
from core.errors import InvalidInput
from inventory.models import Pool
from reservations.request.parse import (
    canonical_request_digest,
    check_request_against_pool,
    parse_reservation_request,
)
from tests.support.clock import MAX_MS

POOL_ID = "pool_01kabcdefghjkmnpqrstvwxyz0"
PROJECT_ID = "prj_01kabcdefghjkmnpqrstvwxyz0"
NOW_MS = 1_790_000_000_000


def body(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "tenantId": "acme",
        "poolId": POOL_ID,
        "devices": [{"class": "gpu", "count": 8, "selector": {"vramGiB": {"gte": 80}}}],
        "duration": "1d",
        "idempotencyKey": "train-42",
    }
    base.update(changes)
    return base


def device(**changes: Any) -> dict[str, Any]:
    return {"class": "gpu", "count": 1, **changes}


def parse(data: Any) -> Any:
    return parse_reservation_request(data, now_ms=NOW_MS)


def bad_fields(data: Any) -> list[str]:
    with pytest.raises(InvalidInput) as exc:
        parse(data)
    assert exc.value.code == "INVALID_INPUT"
    return [detail["field"] for detail in exc.value.details]


def without(name: str) -> dict[str, Any]:
    data = body()
    del data[name]
    return data


# --- Accepted ------------------------------------------------------------------------


def test_a_minimal_request_parses_with_its_defaults() -> None:
    request = parse(body())
    assert request.tenant_id == "acme"
    assert request.pool_id == POOL_ID
    assert request.duration_seconds == 86400
    assert request.idempotency_key == "train-42"
    assert request.binding == "hold"
    assert request.topology == "any"
    assert request.spot is False
    assert request.start_ms is None
    assert request.wait_timeout_ms == 0
    assert request.gang_size is None
    assert request.resources == {}
    (item,) = request.devices
    assert (item.device_class, item.count, item.sharing, item.topology) == ("gpu", 8, "exclusive", "any")
    assert item.selector == {"vramGiB": {"gte": 80}}
    assert request.raw == body()


def test_every_field_is_carried_into_the_request() -> None:
    request = parse(
        body(
            projectId=PROJECT_ID,
            devices=[
                device(count=4, topology="nvlink-all", sharing="exclusive", selector={"gpuModel": "H100"}),
                {"class": "nic.vf", "count": 2, "selector": {"linkGbps": {"gte": 400}}},
            ],
            topology="nvlink-all",
            start=NOW_MS + 3_600_000,
            duration=7200,
            binding="node",
            resources={"vcpu": 32, "memoryGiB": 256, "hugepages1Gi": 0},
            node={"profileId": "k8s/worker:1.31", "profileVersion": 3},
            leaseSeconds=600,
            spot=True,
            wait={"timeoutMs": 5000},
            gang={"size": 4, "topologyKey": "rack"},
        )
    )
    assert request.project_id == PROJECT_ID
    assert [d.device_class for d in request.devices] == ["gpu", "nic.vf"]
    assert request.devices[0].topology == "nvlink-all"
    assert request.devices[1].selector == {"linkGbps": {"gte": 400}}
    assert request.topology == "nvlink-all"
    assert request.start_ms == NOW_MS + 3_600_000
    assert request.duration_seconds == 7200
    assert request.binding == "node"
    assert request.resources == {"vcpu": 32, "memoryGiB": 256}  # a zero claim takes nothing
    assert request.node_profile == {"profileId": "k8s/worker:1.31", "profileVersion": 3}
    assert request.lease_seconds == 600
    assert request.spot is True
    assert request.wait_timeout_ms == 5000
    assert (request.gang_size, request.gang_topology_key) == (4, "rack")


def test_a_gang_without_topology_key_is_on_one_fabric() -> None:
    assert parse(body(gang={"size": 2})).gang_topology_key == "fabric"


@pytest.mark.parametrize(
    "changes",
    [
        {"devices": [device(count=1)]},
        {"devices": [device(count=64)]},
        {"devices": [device()] * 8},
        # The latest start: the horizon (`CAPACITY_MAX_START_AHEAD`, a year by default) from now.
        {"start": NOW_MS + 365 * 86400 * 1000},
        {"duration": 60},
        {"duration": 366 * 86400},
        {"duration": "PT8H"},
        {"resources": {"vcpu": 4096, "memoryGiB": 65536, "hugepages1Gi": 4096}},
        {"resources": {"vcpu": 0}},
        {"node": {"profileId": "a" * 128, "profileVersion": 1}},
        {"leaseSeconds": 30},
        {"leaseSeconds": 86400},
        {"idempotencyKey": "k" * 128},
        {"wait": {"timeoutMs": 0}},
        {"wait": {"timeoutMs": 30000}},
        {"gang": {"size": 2}},
        {"gang": {"size": 64, "topologyKey": "k" * 128}},
        {"projectId": None, "leaseSeconds": None, "start": None},
    ],
)
def test_values_at_the_limits_are_accepted(changes: dict[str, Any]) -> None:
    parse(body(**changes))


# --- Refused, naming the field --------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (without("tenantId"), "tenantId"),
        (body(tenantId="ac me"), "tenantId"),
        (body(tenantId="a" * 129), "tenantId"),
        (body(tenantId=5), "tenantId"),
        (without("poolId"), "poolId"),
        (body(poolId="pool_X"), "poolId"),
        (body(poolId="pool_" + "a" * 53), "poolId"),
        (body(projectId="prj_"), "projectId"),
        (body(projectId="prj_" + "a" * 53), "projectId"),
        (body(projectId=POOL_ID), "projectId"),
        (without("devices"), "devices"),
        (body(devices=[]), "devices"),
        (body(devices=[device()] * 9), "devices"),
        (body(devices={"class": "gpu"}), "devices"),
        (body(devices=["gpu"]), "devices[0]"),
        (body(devices=[{"count": 1}]), "devices[0].class"),
        (body(devices=[device(**{"class": "tpu"})]), "devices[0].class"),
        (body(devices=[{"class": "gpu"}]), "devices[0].count"),
        (body(devices=[device(count=0)]), "devices[0].count"),
        (body(devices=[device(count=65)]), "devices[0].count"),
        (body(devices=[device(count="8")]), "devices[0].count"),
        (body(devices=[device(count=8.5)]), "devices[0].count"),
        (body(devices=[device(count=True)]), "devices[0].count"),
        (body(devices=[device(selector="vramGiB >= 80")]), "devices[0].selector"),
        (body(devices=[device(selector={"vramGiB": {"gte": "80"}})]), "devices[0].selector.vramGiB"),
        (body(devices=[device(selector={"vramGB": 80})]), "devices[0].selector.vramGB"),
        (body(devices=[device(topology="ring")]), "devices[0].topology"),
        (body(devices=[device(sharing="shared")]), "devices[0].sharing"),
        (body(devices=[device(extra=1)]), "devices[0].extra"),
        (body(devices=[device(), device(count=0)]), "devices[1].count"),
        (body(topology="ring"), "topology"),
        (body(start=-1), "start"),
        (body(start=MAX_MS + 1), "start"),
        (body(start="1790000000000"), "start"),
        (without("duration"), "duration"),
        (body(duration="P1DT"), "duration"),
        (body(duration=59), "duration"),
        (body(duration="367d"), "duration"),
        (body(duration=None), "duration"),
        (body(binding="lease"), "binding"),
        (body(resources="lots"), "resources"),
        (body(resources={"vcpu": -1}), "resources.vcpu"),
        (body(resources={"vcpu": 4097}), "resources.vcpu"),
        (body(resources={"memoryGiB": 65537}), "resources.memoryGiB"),
        (body(resources={"hugepages1Gi": 4097}), "resources.hugepages1Gi"),
        (body(resources={"gpu": 1}), "resources.gpu"),
        (body(node={}), "node.profileId"),
        (body(node={"profileId": "bad profile"}), "node.profileId"),
        (body(node={"profileId": "a" * 129}), "node.profileId"),
        (body(node={"profileId": "p", "profileVersion": 0}), "node.profileVersion"),
        (body(node={"profileId": "p", "image": "x"}), "node.image"),
        (body(leaseSeconds=29), "leaseSeconds"),
        (body(leaseSeconds=86401), "leaseSeconds"),
        (body(spot="true"), "spot"),
        (body(spot=1), "spot"),
        (without("idempotencyKey"), "idempotencyKey"),
        (body(idempotencyKey=""), "idempotencyKey"),
        (body(idempotencyKey="a b"), "idempotencyKey"),
        (body(idempotencyKey="k" * 129), "idempotencyKey"),
        (body(wait={}), "wait.timeoutMs"),
        (body(wait={"timeoutMs": -1}), "wait.timeoutMs"),
        (body(wait={"timeoutMs": 30001}), "wait.timeoutMs"),
        (body(wait={"timeoutMs": 5, "retries": 1}), "wait.retries"),
        (body(gang={}), "gang.size"),
        (body(gang={"size": 1}), "gang.size"),
        (body(gang={"size": 65}), "gang.size"),
        (body(gang={"size": 2, "topologyKey": "k" * 129}), "gang.topologyKey"),
        (body(gang={"size": 2, "topologyKey": ""}), "gang.topologyKey"),
        (body(extra=1), "extra"),
    ],
)
def test_each_bad_field_is_invalid_input_naming_it(data: dict[str, Any], field: str) -> None:
    assert bad_fields(data) == [field]


@pytest.mark.parametrize("data", [[], "body", None, 5])
def test_a_body_that_is_not_an_object_is_invalid_input(data: Any) -> None:
    assert bad_fields(data) == ["body"]


def test_every_bad_field_is_named_at_once() -> None:
    data = body(
        tenantId="a b",
        devices=[device(count=0, extra=True)],
        duration="P1DT",
        leaseSeconds=1,
        wait={"timeoutMs": 99999},
        typo=1,
    )
    assert sorted(bad_fields(data)) == sorted(
        [
            "tenantId",
            "devices[0].count",
            "devices[0].extra",
            "duration",
            "leaseSeconds",
            "wait.timeoutMs",
            "typo",
        ]
    )


# --- Class, sharing and pool -----------------------------------------------------------


@pytest.mark.parametrize(
    ("device_class", "sharing"),
    [
        ("gpu", "mig"),
        ("gpu", "timeslice"),
        ("gpu.mig", "exclusive"),
        ("gpu.mig", "mps"),
        ("gpu.slot", "exclusive"),
        ("gpu.slot", "mig"),
        ("nic.vf", "timeslice"),
        ("disk", "mig"),
    ],
)
def test_a_sharing_that_contradicts_the_class_names_the_sharing(device_class: str, sharing: str) -> None:
    data = body(devices=[device(**{"class": device_class, "sharing": sharing})])
    assert bad_fields(data) == ["devices[0].sharing"]


@pytest.mark.parametrize(
    ("device_class", "sharing", "filled"),
    [
        ("gpu", None, "exclusive"),
        ("gpu.mig", None, "mig"),
        ("gpu.slot", None, None),
        ("gpu.slot", "mps", "mps"),
        ("gpu.slot", "timeslice", "timeslice"),
        ("nic.vf", "exclusive", "exclusive"),
    ],
)
def test_a_sharing_that_fits_the_class_is_kept_or_filled_in(
    device_class: str, sharing: str | None, filled: str | None
) -> None:
    item = device(**{"class": device_class})
    if sharing is not None:
        item["sharing"] = sharing
    assert parse(body(devices=[item])).devices[0].sharing == filled


def test_nvlink_all_on_a_non_gpu_item_is_refused() -> None:
    assert bad_fields(body(devices=[{"class": "disk", "count": 1, "topology": "nvlink-all"}])) == [
        "devices[0].topology"
    ]


def test_a_node_item_takes_exactly_one_node_atom() -> None:
    assert bad_fields(body(devices=[{"class": "node", "count": 2}])) == ["devices[0].count"]


def pool(sharing: str) -> Pool:
    return Pool(id=POOL_ID, sharing=sharing, slots_per_gpu=4 if sharing in ("timeslice", "mps") else None)


@pytest.mark.parametrize(
    ("item", "pool_sharing"),
    [
        (device(), "exclusive"),
        (device(**{"class": "gpu.mig"}), "mig"),
        (device(**{"class": "gpu.slot"}), "timeslice"),
        (device(**{"class": "gpu.slot"}), "mps"),
        (device(**{"class": "gpu.slot", "sharing": "mps"}), "mps"),
        ({"class": "nic.vf", "count": 1}, "mig"),
        ({"class": "disk", "count": 1}, "timeslice"),
    ],
)
def test_items_the_pool_can_serve_pass_the_pool_check(item: dict[str, Any], pool_sharing: str) -> None:
    check_request_against_pool(parse(body(devices=[item])), pool(pool_sharing))


@pytest.mark.parametrize(
    ("item", "pool_sharing", "field"),
    [
        (device(), "mig", "devices[0].class"),
        (device(), "timeslice", "devices[0].class"),
        (device(**{"class": "gpu.mig"}), "exclusive", "devices[0].class"),
        (device(**{"class": "gpu.slot"}), "exclusive", "devices[0].class"),
        (device(**{"class": "gpu.slot", "sharing": "mps"}), "timeslice", "devices[0].sharing"),
        (device(**{"class": "gpu.mig", "sharing": "mig"}), "mps", "devices[0].sharing"),
    ],
)
def test_items_the_pool_cannot_serve_are_invalid_input_by_field(
    item: dict[str, Any], pool_sharing: str, field: str
) -> None:
    with pytest.raises(InvalidInput) as exc:
        check_request_against_pool(parse(body(devices=[item])), pool(pool_sharing))
    assert [d["field"] for d in exc.value.details] == [field]


def test_the_pool_check_names_every_item_it_refuses() -> None:
    request = parse(body(devices=[device(), {"class": "nic.vf", "count": 1}, device(**{"class": "gpu.mig"})]))
    with pytest.raises(InvalidInput) as exc:
        check_request_against_pool(request, pool("timeslice"))
    assert [d["field"] for d in exc.value.details] == ["devices[0].class", "devices[2].class"]


# --- The start rule, by the database's clock ----------------------------------------------


@pytest.mark.django_db
def test_a_start_more_than_5_minutes_in_the_past_is_refused() -> None:
    now_ms = to_millis(compute_now())
    assert now_ms is not None
    with pytest.raises(InvalidInput) as exc:
        parse_reservation_request(body(start=now_ms - 6 * 60_000))
    assert [d["field"] for d in exc.value.details] == ["start"]


@pytest.mark.django_db
def test_a_start_a_little_in_the_past_is_now() -> None:
    now_ms = to_millis(compute_now())
    assert now_ms is not None
    assert parse_reservation_request(body(start=now_ms - 2 * 60_000)).start_ms is None


@pytest.mark.django_db
def test_a_future_start_is_kept() -> None:
    now_ms = to_millis(compute_now())
    assert now_ms is not None
    assert parse_reservation_request(body(start=now_ms + 3_600_000)).start_ms == now_ms + 3_600_000


@pytest.mark.django_db
def test_the_start_rule_follows_the_moved_database_clock() -> None:
    start = to_millis(compute_now())
    assert start is not None
    set_clock_offset(timedelta(minutes=10))
    with pytest.raises(InvalidInput):
        parse_reservation_request(body(start=start))


# --- The digest ------------------------------------------------------------------------


def digest(data: dict[str, Any], now_ms: int = NOW_MS) -> str:
    return canonical_request_digest(parse_reservation_request(data, now_ms=now_ms))


def test_the_digest_ignores_key_order() -> None:
    data = body(resources={"vcpu": 8, "memoryGiB": 64}, gang={"size": 2, "topologyKey": "rack"})
    reordered = {key: data[key] for key in reversed(list(data))}
    reordered["resources"] = {"memoryGiB": 64, "vcpu": 8}
    reordered["gang"] = {"topologyKey": "rack", "size": 2}
    assert digest(data) == digest(reordered)


def test_the_digest_ignores_spelled_out_defaults() -> None:
    spelled = body(
        devices=[
            {
                "class": "gpu",
                "count": 8,
                "selector": {"vramGiB": {"gte": 80}},
                "topology": "any",
                "sharing": "exclusive",
            }
        ],
        binding="hold",
        topology="any",
        spot=False,
        resources={"vcpu": 0},
        projectId=None,
        leaseSeconds=None,
    )
    assert digest(spelled) == digest(body())


def test_the_digest_ignores_equivalent_spellings() -> None:
    a = body(
        duration="1d",
        devices=[
            device(selector={"gpuModel": "H100", "numaNode": {"in": [1, 0]}}),
            {"class": "disk", "count": 1},
        ],
        gang={"size": 2},
    )
    b = body(
        duration=86400,
        devices=[
            {"class": "disk", "count": 1},
            device(selector={"numaNode": {"in": [0, 1, 0]}, "gpuModel": {"eq": "H100"}}),
        ],
        gang={"size": 2, "topologyKey": "fabric"},
    )
    assert digest(a) == digest(b)


def test_the_digest_ignores_how_long_the_call_may_wait() -> None:
    assert digest(body(wait={"timeoutMs": 3000})) == digest(body())


def test_the_digest_uses_the_start_as_given_not_the_now_it_became() -> None:
    data = body(start=NOW_MS + 30_000)
    # A retry after the start has passed (read as "now") is still the same request.
    assert digest(data, now_ms=NOW_MS) == digest(data, now_ms=NOW_MS + 120_000)
    assert digest(data) != digest(body())


@pytest.mark.parametrize(
    "changes",
    [
        {"devices": [{"class": "gpu", "count": 7, "selector": {"vramGiB": {"gte": 80}}}]},
        {"devices": [{"class": "gpu", "count": 8, "selector": {"vramGiB": {"gte": 40}}}]},
        {"duration": "2d"},
        {"binding": "node"},
        {"spot": True},
        {"poolId": "pool_01kabcdefghjkmnpqrstvwxyz1"},
        {"resources": {"vcpu": 1}},
        {"leaseSeconds": 60},
        {"start": NOW_MS + 3_600_000},
        {"gang": {"size": 2}},
        {"projectId": PROJECT_ID},
        {"node": {"profileId": "p"}},
        {"idempotencyKey": "other"},
    ],
)
def test_the_digest_changes_with_what_is_asked(changes: dict[str, Any]) -> None:
    assert digest(body(**changes)) != digest(body())


def test_the_digest_is_a_sha256_hex_string_and_does_not_touch_the_body() -> None:
    data = body()
    before = copy.deepcopy(data)
    value = digest(data)
    assert len(value) == 64
    assert int(value, 16) >= 0
    assert data == before
