"""Selectors: the API object form, the CLI string form, the Python matcher, and their round trips."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capacity.cli_device_match import SelectorSyntaxError, parse_cli_selector, selector_to_cli
from core.errors import InvalidInput
from inventory.attributes import ATTRIBUTE_TYPES
from reservations.request.device_match import MAX_INT, normalize_selector, selector_matches, selector_to_api
from reservations.request.types import Selector
from tests.support.properties import no_deadline, on_arbitrary_and_near_miss_text, parsed_or_none

FIELD = "devices[0].selector"


def fields_of(exc: pytest.ExceptionInfo[InvalidInput]) -> list[str]:
    return [detail["field"] for detail in exc.value.details]


# --- The API object form ---------------------------------------------------------


def test_the_contract_example_normalizes_with_eq_made_explicit() -> None:
    selector = normalize_selector({"vramGiB": {"gte": 80}, "gpuModel": "H100"}, field=FIELD)
    assert selector == {"vramGiB": {"gte": 80}, "gpuModel": {"eq": "H100"}}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"eq": 80}, {"eq": 80}),
        ({"ne": 40}, {"ne": 40}),
        ({"gt": 40}, {"gt": 40}),
        ({"lt": 100}, {"lt": 100}),
        ({"lte": 100}, {"lte": 100}),
        ({"in": [80, 40, 80]}, {"in": [40, 80]}),
        ({"notIn": [94]}, {"notIn": [94]}),
        ({"exists": False}, {"exists": False}),
    ],
)
def test_every_operator_is_accepted_on_an_int_attribute(
    spec: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert normalize_selector({"vramGiB": spec}, field=FIELD) == {"vramGiB": expected}


def test_node_labels_are_string_attributes() -> None:
    selector = normalize_selector({"node.fabric": {"in": ["ib-2", "ib-1"]}}, field=FIELD)
    assert selector == {"node.fabric": {"in": ["ib-1", "ib-2"]}}


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"vramGB": {"gte": 80}}, f"{FIELD}.vramGB"),  # unknown attribute
        ({"vramGiB": {"gte": "80"}}, f"{FIELD}.vramGiB"),  # wrong type
        ({"vramGiB": "80"}, f"{FIELD}.vramGiB"),
        ({"vramGiB": True}, f"{FIELD}.vramGiB"),  # a boolean is not an integer
        ({"vramGiB": 80.5}, f"{FIELD}.vramGiB"),
        ({"vramGiB": MAX_INT + 1}, f"{FIELD}.vramGiB"),
        ({"gpuModel": 100}, f"{FIELD}.gpuModel"),
        ({"gpuModel": {"gte": "H100"}}, f"{FIELD}.gpuModel"),  # ordering needs an int attribute
        ({"gpuModel": {"in": []}}, f"{FIELD}.gpuModel"),
        ({"gpuModel": {"in": "H100"}}, f"{FIELD}.gpuModel"),
        ({"gpuModel": {"notIn": ["H100", 1]}}, f"{FIELD}.gpuModel"),
        ({"gpuModel": {"exists": "yes"}}, f"{FIELD}.gpuModel"),
        ({"gpuModel": {"like": "H%"}}, f"{FIELD}.gpuModel"),  # unknown operator
        ({"vramGiB": {"gte": 80, "lte": 100}}, f"{FIELD}.vramGiB"),  # one operator per attribute
        ({"vramGiB": {}}, f"{FIELD}.vramGiB"),
        ({"gpuModel": None}, f"{FIELD}.gpuModel"),
        ({"gpuModel": ["H100"]}, f"{FIELD}.gpuModel"),
        ({"node.": "x"}, f"{FIELD}.node."),
        ({"node.a b": "x"}, f"{FIELD}.node.a b"),
        ("vramGiB >= 80", FIELD),  # not an object
        ([{"vramGiB": 80}], FIELD),
    ],
)
def test_a_bad_selector_is_invalid_input_naming_the_attribute(obj: Any, field: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        normalize_selector(obj, field=FIELD)
    assert fields_of(exc) == [field]
    assert exc.value.code == "INVALID_INPUT"


def test_every_bad_attribute_is_named_at_once() -> None:
    with pytest.raises(InvalidInput) as exc:
        normalize_selector({"vramGiB": "x", "gpuModel": "H100", "bogus": 1}, field=FIELD)
    assert sorted(fields_of(exc)) == [f"{FIELD}.bogus", f"{FIELD}.vramGiB"]


# --- The CLI string form ---------------------------------------------------------


def test_the_seeds_cli_example_parses() -> None:
    assert parse_cli_selector("vramGiB >= 80, gpuModel == H100") == {
        "vramGiB": {"gte": 80},
        "gpuModel": {"eq": "H100"},
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("vramGiB != 40", {"vramGiB": {"ne": 40}}),
        ("vramGiB>40", {"vramGiB": {"gt": 40}}),
        ("vramGiB < 100", {"vramGiB": {"lt": 100}}),
        ("vramGiB <= 100", {"vramGiB": {"lte": 100}}),
        ("gpuModel = H100", {"gpuModel": {"eq": "H100"}}),
        ("gpuModel in (H200, H100)", {"gpuModel": {"in": ["H100", "H200"]}}),
        ("numaNode notin (1)", {"numaNode": {"notIn": [1]}}),
        ("node.rack exists", {"node.rack": {"exists": True}}),
        ("migProfile !exists", {"migProfile": {"exists": False}}),
        ("gpuProduct == NVIDIA H100 80GB HBM3", {"gpuProduct": {"eq": "NVIDIA H100 80GB HBM3"}}),
        ("gpuProduct in (\"a, b\", 'c')", {"gpuProduct": {"in": ["a, b", "c"]}}),
        ('node.zone == "x \\"y\\""', {"node.zone": {"eq": 'x "y"'}}),
        ("", {}),
        ("   ", {}),
    ],
)
def test_each_cli_clause_form_parses(text: str, expected: Selector) -> None:
    assert parse_cli_selector(text) == expected


@pytest.mark.parametrize(
    ("text", "clause"),
    [
        ("vramGiB >= eighty", "vramGiB >= eighty"),
        ("vramGiB >= 80 gpuModel == H100", "vramGiB >= 80 gpuModel == H100"),  # a missing comma
        ("vramGiB >= 80, bogus == 1", "bogus == 1"),
        ("gpuModel > H100", "gpuModel > H100"),
        ("vramGiB >= 80,", ""),
        ("vramGiB ~ 80", "vramGiB ~ 80"),
        ("gpuModel in (H100", "gpuModel in (H100"),
        ("gpuModel in ()", "gpuModel in ()"),
        ('vramGiB == "80"', 'vramGiB == "80"'),  # a quoted value is a string
        ("vramGiB >= 80, vramGiB <= 100", "vramGiB <= 100"),  # one condition per attribute
    ],
)
def test_a_clause_it_cannot_parse_is_an_error_naming_the_clause(text: str, clause: str) -> None:
    with pytest.raises(SelectorSyntaxError) as exc:
        parse_cli_selector(text)
    assert exc.value.clause == clause
    assert f"clause {clause!r}" in exc.value.message


def test_every_bad_clause_is_reported() -> None:
    with pytest.raises(SelectorSyntaxError) as exc:
        parse_cli_selector("vramGiB >= x, gpuModel == H100, foo == 1")
    assert len(exc.value.details) == 2


# --- Matching --------------------------------------------------------------------

H100 = {"gpuModel": "H100", "vramGiB": 80, "numaNode": 0}
LABELS = {"fabric": "ib-1", "rack": "r01"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ({}, True),
        ({"vramGiB": {"gte": 80}}, True),
        ({"vramGiB": {"gt": 80}}, False),
        ({"vramGiB": {"lt": 80}}, False),
        ({"vramGiB": {"lte": 80}}, True),
        ({"gpuModel": {"eq": "H100"}}, True),
        ({"gpuModel": {"eq": "A100"}}, False),
        ({"gpuModel": {"in": ["A100", "H100"]}}, True),
        ({"gpuModel": {"notIn": ["H100"]}}, False),
        ({"node.fabric": {"eq": "ib-1"}}, True),
        ({"node.fabric": {"ne": "ib-1"}}, False),
        ({"node.zone": {"exists": True}}, False),
        ({"node.zone": {"exists": False}}, True),
        # ne and notIn match a device that lacks the attribute, as the placer's SQL does.
        ({"migProfile": {"ne": "3g.40gb"}}, True),
        ({"migProfile": {"notIn": ["3g.40gb"]}}, True),
        ({"migProfile": {"eq": "3g.40gb"}}, False),
        ({"linkGbps": {"gte": 0}}, False),
        ({"vramGiB": {"gte": 80}, "gpuModel": {"eq": "A100"}}, False),
    ],
)
def test_selector_matches_follows_each_operator(selector: Selector, matches: bool) -> None:
    assert selector_matches(selector, H100, LABELS) is matches


# --- Properties ------------------------------------------------------------------

INT_NAMES = sorted(name for name, kind in ATTRIBUTE_TYPES.items() if kind is int)
STR_NAMES = sorted(name for name, kind in ATTRIBUTE_TYPES.items() if kind is str)
label_names = st.from_regex(r"\Anode\.[A-Za-z0-9][A-Za-z0-9._/-]{0,12}\Z")
ints = st.integers(min_value=-MAX_INT, max_value=MAX_INT)
texts = st.text(max_size=20)


def _spec(values: st.SearchStrategy[Any], *, ordered: bool) -> st.SearchStrategy[dict[str, Any]]:
    ops = ["eq", "ne"] + (["gt", "gte", "lt", "lte"] if ordered else [])
    single = st.sampled_from(ops).flatmap(lambda op: values.map(lambda v: {op: v}))
    listed = st.sampled_from(["in", "notIn"]).flatmap(
        lambda op: st.lists(values, min_size=1, max_size=5).map(lambda vs: {op: sorted(set(vs))})
    )
    exists = st.booleans().map(lambda b: {"exists": b})
    return st.one_of(single, listed, exists)


@st.composite
def selectors(draw: st.DrawFn) -> Selector:
    """A valid, already normalized selector over the registry and node labels."""
    result: Selector = {}
    for name in draw(st.lists(st.sampled_from(INT_NAMES), max_size=3, unique=True)):
        result[name] = draw(_spec(ints, ordered=True))
    for name in draw(st.lists(st.one_of(st.sampled_from(STR_NAMES), label_names), max_size=3, unique=True)):
        result[name] = draw(_spec(texts, ordered=False))
    return result


@no_deadline
@given(selectors())
def test_generated_selectors_round_trip_through_the_api_form(selector: Selector) -> None:
    assert normalize_selector(selector_to_api(selector), field=FIELD) == selector


@no_deadline
@given(selectors())
def test_generated_selectors_round_trip_through_the_cli_form(selector: Selector) -> None:
    assert parse_cli_selector(selector_to_cli(selector)) == selector


@on_arbitrary_and_near_miss_text(
    st.text(max_size=120), st.from_regex(r"\A[a-zA-Z. ,()!=<>\"'\\0-9-]{0,40}\Z")
)
def test_cli_text_raises_only_the_parsers_error(texts: st.SearchStrategy[str], data: st.DataObject) -> None:
    selector = parsed_or_none(parse_cli_selector, data.draw(texts), SelectorSyntaxError)
    # What it accepts is a valid selector in every form.
    assert selector is None or normalize_selector(selector_to_api(selector), field=FIELD) == selector


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


@no_deadline
@given(st.one_of(json_values, st.dictionaries(st.sampled_from([*INT_NAMES, *STR_NAMES, "x"]), json_values)))
def test_arbitrary_api_objects_raise_only_invalid_input(obj: Any) -> None:
    try:
        selector = normalize_selector(obj, field=FIELD)
    except InvalidInput:
        return
    assert parse_cli_selector(selector_to_cli(selector)) == selector
