"""Durations: the compact and ISO forms, the limits, and properties over generated input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.durations import MAX_SECONDS, MIN_SECONDS, DurationError, format_duration, parse_duration
from tests.support.properties import no_deadline, on_arbitrary_and_near_miss_text, parsed_or_none

UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("45m", 2700),
        ("8h", 28800),
        ("1d", 86400),
        ("2w", 1209600),
        ("1h30m", 5400),
        ("1w2d3h4m5s", 788645),
        ("PT8H", 28800),
        ("P1D", 86400),
        ("P1DT12H", 129600),
        ("PT90M", 5400),
        ("P2W", 1209600),
        ("P1W2DT3H4M5S", 788645),
        ("3600", 3600),
        (" 1h ", 3600),
        (3600, 3600),
    ],
)
def test_it_reads_each_documented_form(text: str | int, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "P1DT",  # a T with no time part
        "PT",
        "P",
        "",
        "   ",
        "1M",  # units are lower case in the compact form
        "pt8h",  # designators are upper case in the ISO form
        "P1M",  # months have no fixed length
        "P1Y",
        "PT1.5H",
        "1.5h",
        "1h 30m",
        "30m1h",  # units out of order
        "1h1h",
        "h",
        "-5m",
        "\u0661\u0662m",  # Arabic-Indic digits, which int() would read
        "1d" + "0" * 100,
    ],
)
def test_it_refuses_malformed_strings(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


@pytest.mark.parametrize("value", [True, False, 3600.5, None, [3600], {"s": 3600}])
def test_it_refuses_values_that_are_neither_int_nor_string(value: object) -> None:
    with pytest.raises(DurationError):
        parse_duration(value)


def test_an_integral_json_number_is_an_integer() -> None:
    # JSON has one number type: JSON Schema's "integer" (and so the API document) admits 3600.0.
    assert parse_duration(3600.0) == 3600


@pytest.mark.parametrize("value", [0, 59, "59s", MAX_SECONDS + 1, "367d", "P53W", -60])
def test_it_refuses_durations_outside_60_seconds_to_366_days(value: object) -> None:
    with pytest.raises(DurationError, match="between 60 seconds and 366 days"):
        parse_duration(value)


def test_the_limits_themselves_are_accepted() -> None:
    assert parse_duration("1m") == MIN_SECONDS
    assert parse_duration("366d") == MAX_SECONDS


def test_format_duration_writes_the_shortest_compact_form() -> None:
    assert format_duration(5400) == "1h30m"
    assert format_duration(788645) == "1w2d3h4m5s"


seconds_in_range = st.integers(min_value=MIN_SECONDS, max_value=MAX_SECONDS)


@st.composite
def compact_strings(draw: st.DrawFn) -> tuple[str, int]:
    """A compact string (units in order, each optional, at least one) and its seconds."""
    counts = [draw(st.one_of(st.none(), st.integers(0, 400))) for _ in UNITS]
    if all(count is None for count in counts):
        counts[-1] = draw(st.integers(0, 400))
    text = "".join(f"{count}{unit}" for count, unit in zip(counts, UNITS, strict=True) if count is not None)
    seconds = sum(count * UNITS[unit] for count, unit in zip(counts, UNITS, strict=True) if count is not None)
    return text, seconds


@st.composite
def iso_strings(draw: st.DrawFn) -> tuple[str, int]:
    """An ISO 8601 duration (weeks, days, and time parts after T) and its seconds."""
    weeks, days, hours, minutes, secs = (draw(st.one_of(st.none(), st.integers(0, 400))) for _ in range(5))
    if all(part is None for part in (weeks, days, hours, minutes, secs)):
        hours = draw(st.integers(0, 400))
    date = "".join(f"{v}{u}" for v, u in ((weeks, "W"), (days, "D")) if v is not None)
    time = "".join(f"{v}{u}" for v, u in ((hours, "H"), (minutes, "M"), (secs, "S")) if v is not None)
    text = "P" + date + (f"T{time}" if time else "")
    seconds = sum(
        (v or 0) * u for v, u in ((weeks, 604800), (days, 86400), (hours, 3600), (minutes, 60), (secs, 1))
    )
    return text, seconds


@no_deadline
@given(seconds_in_range)
def test_any_number_of_seconds_round_trips_through_the_compact_form(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@no_deadline
@given(st.one_of(compact_strings(), iso_strings()))
def test_any_generated_valid_string_parses_to_its_seconds(case: tuple[str, int]) -> None:
    text, seconds = case
    if MIN_SECONDS <= seconds <= MAX_SECONDS:
        assert parse_duration(text) == seconds
    else:
        with pytest.raises(DurationError):
            parse_duration(text)


@on_arbitrary_and_near_miss_text(st.text(max_size=80), st.from_regex(r"\A[0-9PTWDHMSwdhms .-]{0,20}\Z"))
def test_text_raises_nothing_but_duration_error(texts: st.SearchStrategy[str], data: st.DataObject) -> None:
    seconds = parsed_or_none(parse_duration, data.draw(texts), DurationError)
    assert seconds is None or MIN_SECONDS <= seconds <= MAX_SECONDS
