"""`capacity/earliest`: the first start that fits, exact to the millisecond, or why none does.

Over HTTP: the answer is where the blocking bookings end, a create at that
start succeeds and one second earlier is refused; gangs, bad input in the
envelope, and a tenant who cannot see the pool. On generated fleets (a
property test): whatever the bookings and the request, a create at the answer
succeeds, a create one second earlier fails, and the placer fits at no earlier
instant where a booking ends (the only instants where a fit can begin), so
nothing earlier was missed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from core.clock import compute_now, to_millis
from core.errors import NoCapacity
from inventory.models import Device, Node, Pool
from reservations.models import DeviceBooking, Reservation
from reservations.placer.earliest import placement_earliest
from reservations.placer.filters import Window
from reservations.placer.plan import placement_plan
from reservations.request.types import ReservationRequest
from reservations.services import reservation_create
from tests.support.api import invalid_fields, post, post_json
from tests.support.placement import gpu_request, make_node
from tests.support.properties import rolled_back
from tests.support.records import book

EARLIEST = "capacity/earliest"


def body(pool: Pool, gpus: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "tenantId": "acme",
        "poolId": pool.id,
        "devices": [{"class": "gpu", "count": gpus}],
        "duration": "1h",
        "idempotencyKey": "when-1",
        **extra,
    }


def _book_all(node: Node, start: timedelta, end: timedelta, count: int | None = None) -> DeviceBooking:
    """Book the node's first `count` GPUs (all by default) for [now + start, now + end); the last booking."""
    devices = list(Device.objects.filter(node=node, device_class="gpu").order_by("uid"))[:count]
    return [book(device, start, end) for device in devices][-1]


def _ms(at: datetime) -> int:
    """An instant as the API's milliseconds, rounded up (a booking may end at any microsecond)."""
    return -(-int(at.timestamp() * 1_000_000) // 1000)


@pytest.mark.django_db
def test_the_answer_is_where_the_blocking_bookings_end_and_create_agrees(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    partly = make_node(owned_pool, hostname="partly")
    busy = make_node(owned_pool, hostname="busy")
    # "partly" has 3 GPUs taken now and 2 more from 30 minutes on: 8 free only after 5 hours.
    _book_all(partly, timedelta(minutes=-10), timedelta(hours=2), count=3)
    for device in Device.objects.filter(node=partly).order_by("uid")[3:5]:
        book(device, timedelta(minutes=30), timedelta(hours=5))
    # "busy" is wholly booked for 3 hours: the earliest 8-GPU hour starts when that ends.
    ends = _book_all(busy, timedelta(minutes=-5), timedelta(hours=3)).during.upper

    status, answer = post_json(owner_client, EARLIEST, body(owned_pool))
    assert status == 200, answer
    assert answer["fits"] is True and answer["reason"] is None
    assert answer["start"] == _ms(ends)
    assert answer["end"] == answer["start"] + 3_600_000
    assert [c["nodeId"] for c in answer["candidates"]] == [busy.id]
    assert answer["searchedFrom"] <= to_millis(compute_now())
    assert answer["instantsTried"] >= 2

    # One second earlier, a create is refused; at the answer, it is made on that node.
    early = post(owner_client, "reservations/create", body(owned_pool, start=answer["start"] - 1000))
    assert early.status_code == 409 and early.json()["error"]["code"] == "NO_CAPACITY"
    made = post(owner_client, "reservations/create", body(owned_pool, start=answer["start"]))
    assert made.status_code == 201, made.json()
    assert [a["nodeId"] for a in made.json()["allocations"]] == [busy.id]


@pytest.mark.django_db
def test_a_request_that_fits_now_answers_now_and_a_gang_waits_for_its_fabric(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    ib1 = [make_node(owned_pool, hostname=f"ib1-{i}", labels={"fabric": "ib-1"}) for i in range(2)]
    ib2 = [make_node(owned_pool, hostname=f"ib2-{i}", labels={"fabric": "ib-2"}) for i in range(2)]
    _book_all(ib1[0], timedelta(minutes=-5), timedelta(hours=6))
    _book_all(ib2[1], timedelta(minutes=-5), timedelta(hours=4), count=1)
    _book_all(ib2[0], timedelta(hours=1), timedelta(hours=2), count=1)

    now = post_json(owner_client, EARLIEST, body(owned_pool))[1]
    assert now["fits"] and now["start"] == now["searchedFrom"] and now["instantsTried"] == 1

    # Two whole nodes on one fabric for 2 hours: ib-2 is whole once its booking ends at 4 hours
    # (the 1-2 hour booking on ib2-0 is over by then); ib-1 only after 6.
    gang = post_json(owner_client, EARLIEST, body(owned_pool, gang={"size": 2}, duration="2h"))[1]
    assert gang["fits"], gang
    assert abs(gang["start"] - (now["searchedFrom"] + 4 * 3_600_000)) < 60_000
    assert {c["nodeId"] for c in gang["candidates"]} == {n.id for n in ib2}


@pytest.mark.django_db
def test_nothing_in_the_horizon_answers_why_and_the_horizon_is_searched_to_its_end(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    node = make_node(owned_pool, hostname="only")
    _book_all(node, timedelta(minutes=-5), timedelta(days=2))
    status, answer = post_json(owner_client, EARLIEST, body(owned_pool, horizon="1d"))
    assert status == 200
    assert answer["fits"] is False and answer["start"] is None and answer["candidates"] == []
    assert answer["reason"]["code"] == "NO_START_IN_HORIZON"
    assert answer["searchedTo"] - answer["searchedFrom"] == 86_400_000
    later = post_json(owner_client, EARLIEST, body(owned_pool, horizon="3d"))[1]
    assert later["fits"] and later["start"] > answer["searchedTo"]
    # Searching from a later instant starts there.
    start = answer["searchedFrom"] + 3 * 86_400_000
    moved = post_json(owner_client, EARLIEST, body(owned_pool, **{"from": start}))[1]
    assert moved["fits"] and moved["start"] == moved["searchedFrom"] == start


@pytest.mark.django_db
def test_a_search_that_runs_out_of_tries_says_how_far_it_got(
    owner_client: APIClient, owned_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reservations.placer import earliest

    node = make_node(owned_pool, hostname="only")
    ends = _book_all(node, timedelta(minutes=-5), timedelta(hours=3)).during.upper
    monkeypatch.setattr(earliest, "MAX_TRIED", 1)
    answer = post_json(owner_client, EARLIEST, body(owned_pool))[1]
    assert answer["fits"] is False and answer["reason"]["code"] == "SEARCH_LIMIT"
    assert answer["searchedTo"] == to_millis(ends) and answer["instantsTried"] == 1
    # Asked again from there, it answers that very instant.
    again = post_json(owner_client, EARLIEST, body(owned_pool, **{"from": _ms(ends)}))[1]
    assert again["fits"] and again["start"] == _ms(ends)


@pytest.mark.django_db
def test_bad_input_is_refused_in_the_envelope_and_an_unseen_pool_is_not_found(
    owner_client: APIClient, outsider_client: APIClient, owned_pool: Pool
) -> None:
    make_node(owned_pool, hostname="here")
    before = Reservation.objects.count()
    assert invalid_fields(*post_json(owner_client, EARLIEST, body(owned_pool, horizon="31d"))) == {"horizon"}
    assert invalid_fields(*post_json(owner_client, EARLIEST, body(owned_pool, horizon="soon"))) == {"horizon"}
    past = to_millis(compute_now() - timedelta(hours=1))
    assert invalid_fields(*post_json(owner_client, EARLIEST, body(owned_pool, **{"from": past}))) == {"from"}
    started = post_json(owner_client, EARLIEST, body(owned_pool, start=to_millis(compute_now())))
    assert invalid_fields(*started) == {"start"}
    assert "give `from`" in started[1]["error"]["message"]
    assert invalid_fields(*post_json(owner_client, EARLIEST, body(owned_pool, gpus=0))) == {
        "devices[0].count"
    }
    unknown = post_json(owner_client, EARLIEST, body(owned_pool, soon=True))
    assert unknown[0] == 400 and unknown[1]["error"]["code"] == "INVALID_INPUT"
    hidden = post(outsider_client, EARLIEST, {**body(owned_pool), "tenantId": "gamma"})
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "NOT_FOUND"
    assert Reservation.objects.count() == before


# --- the property: exact on generated fleets -----------------------------------------


GPUS_PER_NODE = 4

bookings_strategy = st.lists(
    # (node, gpu, start in minutes from now, length in minutes)
    st.tuples(
        st.integers(0, 2), st.integers(0, GPUS_PER_NODE - 1), st.integers(-60, 480), st.integers(10, 300)
    ),
    min_size=4,
    max_size=30,
)
requests_strategy = st.fixed_dictionaries(
    {
        "count": st.sampled_from([1, 2, 3, 4, 4]),
        "gang": st.sampled_from([None, None, 2]),
        "binding": st.sampled_from(["hold", "hold", "node"]),
        "nvlink": st.booleans(),
        "minutes": st.integers(30, 360),
    }
)


def _request(
    pool: Pool, shape: dict[str, Any], key: str, start: datetime | None = None
) -> ReservationRequest:
    request = gpu_request(
        pool,
        shape["count"],
        duration_seconds=shape["minutes"] * 60,
        idempotency_key=key,
        gang_size=shape["gang"],
        binding=shape["binding"] if not shape["gang"] else "hold",
        item_topology="nvlink-all" if shape["nvlink"] else "any",
        start_ms=None if start is None else to_millis(start),
    )
    return request


def _fits_at(request: ReservationRequest, pool: Pool, at: datetime, now: datetime) -> bool:
    window = Window(start=at, end=at + timedelta(seconds=request.duration_seconds), now=now)
    return placement_plan(request=request, pool=pool, window=window).fits


def _creates(pool: Pool, shape: dict[str, Any], at: datetime, key: str) -> bool:
    """Whether `reservations/create` at `at` succeeds (undone at once)."""
    try:
        with rolled_back():
            reservation_create(request=_request(pool, shape, key, start=at), actor="test", pool=pool)
    except NoCapacity:
        return False
    return True


@pytest.mark.django_db
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(bookings=bookings_strategy, shape=requests_strategy)
def test_earliest_is_exact_on_generated_fleets(
    owned_pool: Pool, bookings: list[tuple[int, int, int, int]], shape: dict[str, Any]
) -> None:
    with rolled_back():
        _example(owned_pool, bookings, shape)


def _example(pool: Pool, bookings: list[tuple[int, int, int, int]], shape: dict[str, Any]) -> None:
    nodes = [
        make_node(
            pool,
            gpus=GPUS_PER_NODE,
            numa_split=2,
            nvlink=["a", "a", "a", "b"],
            labels={"fabric": "ib-1" if index < 2 else "ib-2"},
            hostname=f"gen-{index}",
        )
        for index in range(3)
    ]
    now = compute_now()
    for node_index, gpu, start, length in bookings:
        device = Device.objects.filter(node=nodes[node_index]).order_by("uid")[gpu]
        lower, upper = now + timedelta(minutes=start), now + timedelta(minutes=start + length, seconds=gpu)
        if DeviceBooking.objects.filter(device=device, during__overlap=(lower, upper)).exists():
            continue
        book(device, lower, upper)
    until = now + timedelta(hours=12)
    request = _request(pool, shape, "probe")
    found = placement_earliest(request=request, pool=pool, start=now, until=until, now=now)

    answer = found.plan.window.start if found.fits and found.plan else None
    if answer is not None:
        assert _creates(pool, shape, answer if answer > now else now, "at-answer"), (shape, answer - now)
        if answer - timedelta(seconds=1) > now:
            assert not _creates(pool, shape, answer - timedelta(seconds=1), "one-second-early")
    # No earlier instant where a fit could begin fits: `now` and every booking end before the answer.
    ends = DeviceBooking.objects.filter(device__node__pool=pool).values_list("during", flat=True)
    instants = sorted({now} | {r.upper for r in ends if now < r.upper <= until})
    for at in instants:
        at_ms = datetime.fromtimestamp(_ms(at) / 1000, tz=UTC) if at > now else now
        if answer is not None and at_ms >= answer:
            break
        assert not _fits_at(request, pool, at_ms, now), (shape, at - now, answer, bookings)


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["capacity/earliest", "capacity/explain"])
def test_the_method_is_in_the_openapi_document_with_its_examples(method: str) -> None:
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    operation = response.json()["paths"][f"/api/compute/{method}"]["post"]
    assert operation["operationId"] == method.replace("/", ".")
    request_examples = operation["requestBody"]["content"]["application/json"]["examples"]
    response_examples = operation["responses"]["200"]["content"]["application/json"]["examples"]
    assert request_examples and response_examples
    assert {"400", "404"} <= set(operation["responses"])
    if method == "capacity/earliest":
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        fields = response.json()["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
        assert {"from", "horizon", "devices", "gang", "duration"} <= set(fields) and "start" not in fields
        example = next(iter(response_examples.values()))["value"]
        assert {"fits", "start", "end", "candidates", "reason", "searchedFrom", "searchedTo"} <= set(example)
