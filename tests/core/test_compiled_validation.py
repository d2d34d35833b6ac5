"""The compiled walk (`core.api.compiled`) answers as DRF does, for every input serializer of the API.

Each body is validated both ways: by DRF's own `Serializer.run_validation` and by
`fast_validated`. The fast path may decline (None: DRF then answers); where it
answers, its validated data, or the exception it raises, is DRF's.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework import serializers

import config.urls  # noqa: F401  (every view, so every input serializer, is imported)
from core.api.compiled import fast_validated
from core.api.fields import DurationField, StrictSerializer, WholeRegexValidator
from reservations.api.serializers import ReservationRefInput
from reservations.request.serializers import ReservationRequestSerializer

pytestmark = [
    pytest.mark.django_db,
    # The create's strategy is large; hypothesis warns before printing it, which it never needs to.
    pytest.mark.filterwarnings("ignore:Generating overly large repr"),
]

NOW_MS = 1_780_000_000_000
POOL = "pool_01hzzzzzzzzzzzzzzzzzzzzzzz"
RESERVATION = "rsv_01hzzzzzzzzzzzzzzzzzzzzzzz"


def _input_classes() -> list[type[StrictSerializer]]:
    found: list[type[StrictSerializer]] = []
    todo = list(StrictSerializer.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls not in found:
            found.append(cls)
    return sorted(found, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


INPUTS = _input_classes()

_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=4),
    st.just([]),
    st.just({}),
)


def _values(field: serializers.Field, near_miss: bool) -> st.SearchStrategy[Any]:
    """What the field takes; with `near_miss`, also just past its edges, and anything else."""
    good: st.SearchStrategy[Any]
    edges: list[Any] = []
    if isinstance(field, serializers.ListSerializer):
        lo, hi = field.min_length or 0, field.max_length or 3
        good = st.lists(_bodies(field.child, near_miss), min_size=lo, max_size=min(hi, lo + 2))
        if near_miss:
            items = st.one_of(_bodies(field.child, near_miss), _junk)
            good = st.one_of(good, st.lists(items, min_size=0, max_size=hi + 1))
    elif isinstance(field, serializers.Serializer):
        good = _bodies(field, near_miss)
    elif isinstance(field, serializers.ChoiceField):
        good = st.sampled_from(sorted(field.choice_strings_to_values))
    elif isinstance(field, serializers.BooleanField):
        good = st.booleans()
    elif isinstance(field, serializers.IntegerField):
        lo = -10 if field.min_value is None else field.min_value
        hi = lo + 20 if field.max_value is None else field.max_value
        good = st.integers(lo, hi)
        if lo <= NOW_MS <= hi:  # a time: around now, where a start's rules draw their lines
            good = st.one_of(
                st.integers(NOW_MS - 240_000, NOW_MS + 2 * 86_400_000), st.just(NOW_MS - 400_000)
            )
        edges = [lo - 1, lo, hi, hi + 1, NOW_MS - 400_000]
    elif isinstance(field, DurationField):
        good = st.one_of(
            st.integers(field.minimum, field.maximum), st.sampled_from(["1h", "90s", "PT8H", "1d"])
        )
        edges = [field.minimum - 1, field.minimum, field.maximum, field.maximum + 1, "0s", "h1"]
    elif any(isinstance(v, WholeRegexValidator) for v in field.validators):
        (regex,) = [v.regex for v in field.validators if isinstance(v, WholeRegexValidator)]
        good = st.from_regex(regex, fullmatch=True)
        edges = [""]
    elif isinstance(field, serializers.CharField):
        good = st.text(max_size=field.max_length or 8)
        edges = ["x" * ((field.max_length or 8) + 1)]
    else:  # a field of the project's own (a selector, labels): empty, or anything
        good = st.just({})
        edges = [{"x": 1}]
    if not near_miss:
        return good
    return st.one_of(good, st.sampled_from(edges) if edges else good, _junk)


def _bodies(serializer: serializers.Serializer, near_miss: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Objects of the serializer's fields; with `near_miss`, sometimes a required one gone or one unknown."""
    fields = serializer.fields
    required = {name: _values(f, near_miss) for name, f in fields.items() if f.required}
    optional = {name: _values(f, near_miss) for name, f in fields.items() if not f.required}
    if not near_miss:
        return st.fixed_dictionaries(required, optional=optional)

    def shaped(body: dict[str, Any], drop: list[str], extra: dict[str, Any]) -> dict[str, Any]:
        return {**{k: v for k, v in body.items() if k not in drop}, **extra}

    drops = st.lists(st.sampled_from(sorted(required)), max_size=1) if required else st.just([])
    extras = st.dictionaries(st.sampled_from(["unknown", "x"]), _junk, max_size=1)
    return st.builds(shaped, st.fixed_dictionaries(required, optional=optional), drops, extras)


def _outcome(run: Any) -> tuple[str, Any]:
    try:
        return "answered", run()
    except serializers.ValidationError:
        return "refused", None
    except Exception as exc:  # compared with what DRF raised, not hidden
        return "raised", type(exc)


def _both(cls: type[StrictSerializer], body: Any) -> tuple[tuple[str, Any], tuple[str, Any]]:
    def drf() -> Any:
        serializer = cls(data=body, context={"now_ms": NOW_MS})
        return serializers.Serializer.run_validation(serializer, body)

    def fast() -> Any:
        return fast_validated(cls(data=body, context={"now_ms": NOW_MS}), body)

    return _outcome(drf), _outcome(fast)


@pytest.mark.parametrize("near_miss", [False, True], ids=["well-formed", "near-miss"])
@pytest.mark.parametrize("cls", INPUTS, ids=lambda cls: cls.__name__)
@settings(deadline=None, max_examples=100)
@given(data=st.data())
def test_the_compiled_walk_answers_as_drf_or_leaves_the_body_to_it(
    cls: type, near_miss: bool, data: st.DataObject
) -> None:
    body = data.draw(_bodies(cls(), near_miss))
    drf, fast = _both(cls, body)
    if drf[0] == "answered":
        # Every input serializer can be walked (`_followable`): a body DRF takes, the walk takes too.
        assert fast == drf
    elif fast != ("answered", None):  # None: declined, DRF answers
        assert fast == drf


def test_every_input_serializer_of_the_api_is_compared() -> None:
    names = {cls.__name__ for cls in INPUTS}
    assert {"ReservationRequestSerializer", "ReservationRefInput", "DeviceItemSerializer"} <= names
    assert len(INPUTS) >= 20


@pytest.mark.parametrize(
    ("cls", "body"),
    [
        pytest.param(
            ReservationRequestSerializer,
            {
                "tenantId": "acme",
                "poolId": POOL,
                "devices": [{"class": "gpu", "count": 1}],
                "duration": 3600,
                "idempotencyKey": "k-1",
            },
            id="a plain create",
        ),
        pytest.param(
            ReservationRequestSerializer,
            {
                "tenantId": "acme",
                "poolId": POOL,
                "devices": [
                    {"class": "gpu", "count": 2, "topology": "nvlink-all"},
                    {"class": "nic.vf", "count": 1},
                ],
                "duration": "2h",
                "start": NOW_MS + 3_600_000,
                "resources": {"vcpu": 8},
                "gang": {"size": 2},
                "spot": False,
                "idempotencyKey": "k-2",
            },
            id="a gang create starting later",
        ),
        pytest.param(ReservationRefInput, {"tenantId": "acme", "reservationId": RESERVATION}, id="a release"),
    ],
)
def test_the_bodies_clients_send_take_the_compiled_walk(cls: type, body: dict[str, Any]) -> None:
    drf, fast = _both(cls, body)
    assert drf[0] == "answered"
    assert fast == drf


def _create(**changes: Any) -> dict[str, Any]:
    body = {
        "tenantId": "acme",
        "poolId": POOL,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": 3600,
        "idempotencyKey": "k-1",
        **changes,
    }
    return {name: value for name, value in body.items() if value is not None}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_create(devices=[{"class": "gpu", "count": 1}] * 9), id="nine items"),
        pytest.param(_create(devices=[]), id="no item"),
        pytest.param(_create(devices=[None]), id="an item that is not an object"),
        pytest.param(_create(devices={"class": "gpu", "count": 1}), id="items not in a list"),
        pytest.param(_create(start=NOW_MS - 600_000), id="a start ten minutes ago"),
        pytest.param(_create(duration=59), id="a duration under a minute"),
        pytest.param(_create(idempotencyKey=None), id="no idempotency key"),
        pytest.param(_create(colour="red"), id="an unknown field"),
        pytest.param(_create(devices=[{"class": "disk", "count": 1, "sharing": "mps"}]), id="a class's mode"),
        pytest.param(_create(gang={"size": 1}), id="a gang of one"),
        pytest.param(_create(resources=[]), id="resources that are a list"),
        pytest.param(_create(wait="1s"), id="a wait that is a string"),
    ],
)
def test_a_create_drf_refuses_is_left_to_drf(body: dict[str, Any]) -> None:
    drf, fast = _both(ReservationRequestSerializer, body)
    assert drf == ("refused", None)
    assert fast == ("answered", None)  # declined


def test_a_refused_body_is_left_to_drf_for_its_error() -> None:
    body = {"tenantId": "acme", "reservationId": "rsv_short", "colour": "red"}
    assert fast_validated(ReservationRefInput(data=body), body) is None
    serializer = ReservationRefInput(data=body)
    assert not serializer.is_valid()
    assert set(serializer.errors) == {"reservationId", "colour"}
