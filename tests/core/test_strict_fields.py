"""Input serializers build their fields once per thread: validations after it stay independent."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from core.errors import InvalidInput
from reservations.request.parse import parse_reservation_request
from reservations.request.serializers import ReservationRequestSerializer

POOL = "pool_01hzzzzzzzzzzzzzzzzzzzzzzz"


def body(key: str, **extra: Any) -> dict[str, Any]:
    return {
        "tenantId": "acme",
        "poolId": POOL,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h",
        "idempotencyKey": key,
        **extra,
    }


def test_two_serializers_of_one_class_share_the_fields_made_once_and_nothing_they_validated() -> None:
    first, second = ReservationRequestSerializer(data=body("a")), ReservationRequestSerializer(data={})
    assert first.fields is second.fields  # made once, not deep-copied per request
    assert first.is_valid() and first.validated_data["idempotencyKey"] == "a"
    assert not second.is_valid() and "tenantId" in second.errors
    # The first keeps what it validated; the refusal of the second left it alone.
    assert first.validated_data["idempotencyKey"] == "a" and not first.errors


def test_a_refused_body_between_two_accepted_ones_changes_neither() -> None:
    accepted = parse_reservation_request(body("one", devices=[{"class": "gpu", "count": 2}]))
    with pytest.raises(InvalidInput) as refused:
        parse_reservation_request(body("two", devices=[{"class": "gpu", "count": 0, "colour": "red"}]))
    fields = {detail["field"] for detail in refused.value.details}
    assert {"devices[0].count", "devices[0].colour"} <= fields
    again = parse_reservation_request(body("three"))
    assert (accepted.idempotency_key, accepted.devices[0].count) == ("one", 2)
    assert (again.idempotency_key, again.devices[0].count) == ("three", 1)


def test_threads_validate_at_once_each_with_its_own_fields() -> None:
    """gunicorn's threads share a process: each builds its own fields, and none sees another's body."""
    seen: dict[int, tuple[str, int]] = {}
    fields: dict[int, Any] = {}  # the objects, kept alive: an id alone can be reused
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def validate(n: int) -> None:
        try:
            start.wait()
            for round_ in range(50):
                key = f"k{n}-{round_}"
                request = parse_reservation_request(body(key, devices=[{"class": "gpu", "count": n + 1}]))
                assert (request.idempotency_key, request.devices[0].count) == (key, n + 1)
            seen[n] = (request.idempotency_key, request.devices[0].count)
            fields[n] = ReservationRequestSerializer(data={}).fields
        except BaseException as exc:  # reported below, with the thread's own assertion
            errors.append(exc)

    threads = [threading.Thread(target=validate, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert seen == {n: (f"k{n}-49", n + 1) for n in range(8)}
    assert len({id(built) for built in fields.values()}) == 8  # one set of fields per thread
