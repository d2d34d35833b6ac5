"""JSON as it enters the service: parsed once, strictly, and every string in it checked once.

The API's parser (`core.api.parsing.StrictJSONParser`) and the fleet-file loader
parse with `json_loads_strict`; the parsers of documents handed over already
parsed (`inventory.reports.report_parse`, `fleets.spec.fleet_parse`) check
their strings with `text_problem`. The rules:

* the bytes must be UTF-8 and the text JSON; `NaN`, `Infinity` and a key
  repeated in one object are refused (Python's `json` would take the last);
* no string, value or field name, may hold a NUL character (PostgreSQL's
  text cannot store one) or an unpaired UTF-16 surrogate (`"\\ud800"`, which
  no UTF-8 encoder can write back, so neither the database nor the renderer
  could take it);
* an integer longer than `MAX_INT_DIGITS` digits, or a number too large for a
  float, is refused by its field path, never with Python's own message.

A problem is reported as the contract's detail, `{"field": "devices[0].count",
"message": "integer too large"}`, with at most `MAX_ERROR_DETAILS` of them
and a last `{"field": "body", "message": "and N more"}`. A field name that
itself holds a bad character is named with it escaped (`\\u0000`), so the
answer can always be written.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from core.errors import MAX_ERROR_DETAILS, InvalidInput, more_detail

# No field of the contract takes an integer near this long (times are 15 digits);
# below Python's own limit on converting digits (4,300), so its message never shows.
MAX_INT_DIGITS = 64

_BAD_CHARACTER = re.compile("[\x00\ud800-\udfff]")
# The same rule for a JSON Schema (ECMA-262): a string without NUL. Unpaired surrogates need no
# rule there: UTF-8 JSON cannot carry them as characters, only as `\ud800` escapes.
FREE_TEXT_PATTERN = "^[^\\u0000]*$"
NUL_MESSAGE = "must not contain a NUL character (\\u0000)"
SURROGATE_MESSAGE = "must not contain an unpaired UTF-16 surrogate (\\ud800-\\udfff)"


def json_integer(value: object) -> int | None:
    """`value` as an integer when JSON Schema calls it one (`80` or `80.0`), else None (`true`, `80.5`).

    JSON has one number type; a client's JSON library may write 80 as 80.0, and
    the document's `"type": "integer"` admits both, so every integer field does.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def text_problem(text: str) -> str | None:
    """Why `text` cannot be taken (a NUL or an unpaired surrogate in it), or None."""
    found = _BAD_CHARACTER.search(text)
    if found is None:
        return None
    return NUL_MESSAGE if found.group() == "\x00" else SURROGATE_MESSAGE


def printable_name(name: str) -> str:
    """A field name fit to echo in an error: its NULs and surrogates written as `\\uXXXX`."""
    return _BAD_CHARACTER.sub(lambda found: f"\\u{ord(found.group()):04x}", name)


class _Refused:
    """What the decoder puts in place of a number it will not take; `input_problems` reports it."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


_TOO_LARGE = _Refused("integer too large")
_OUT_OF_RANGE = _Refused("number out of range")


class _NotJson(ValueError):
    """`NaN`, `Infinity` or `-Infinity`: Python's `json` reads them, JSON has no such tokens."""


class _RepeatedKeys(dict[str, Any]):
    """An object in which a key was repeated; `input_problems` names each repeated key."""

    repeated: list[str]


class _Decoder:
    """The hooks of one `json.loads` call; `suspect` says whether the document needs a walk at all."""

    def __init__(self) -> None:
        self.suspect = False

    def parse_int(self, text: str) -> int | _Refused:
        if len(text) - text.startswith("-") > MAX_INT_DIGITS:
            self.suspect = True
            return _TOO_LARGE
        return int(text)

    def parse_float(self, text: str) -> float | _Refused:
        value = float(text)
        if math.isfinite(value):
            return value
        self.suspect = True
        return _OUT_OF_RANGE

    def parse_constant(self, text: str) -> Any:
        raise _NotJson(f"{text} is not a JSON value")

    def object(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) == len(pairs):
            return obj
        self.suspect = True
        seen: set[str] = set()
        repeated = _RepeatedKeys(obj)
        repeated.repeated = []
        for key, _ in pairs:
            if key in seen and key not in repeated.repeated:
                repeated.repeated.append(key)
            seen.add(key)
        return repeated


# A NUL or a surrogate can only reach a decoded string through a `\u` escape (JSON refuses raw
# control characters, and UTF-8 cannot carry a surrogate), so text without one of these escapes
# holds no bad string and needs no walk. A match (a real surrogate pair, an escaped backslash
# before `u0000`) only means the walk runs.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


# A path to a value, built only when a problem is found: (parent, key or index).
_Path = tuple[Any, str | int] | None


def _render(path: _Path) -> str:
    """`devices[0].selector.gpuModel`; a path into a top-level list or none at all starts at `body`."""
    parts: list[str] = []
    while path is not None:
        path, step = path
        parts.append(f"[{step}]" if isinstance(step, int) else f".{printable_name(str(step))}")
    text = "".join(reversed(parts))
    return text[1:] if text.startswith(".") else f"body{text}"


def input_problems(data: Any) -> list[dict[str, str]]:
    """Every bad string, field name, repeated key or refused number in `data`, as capped details.

    Walks the whole document once, without recursion (a document as deep as
    the decoder allows is fine), and renders a path only for a problem.
    """
    details: list[dict[str, str]] = []
    count = 0

    def problem(path: _Path, message: str) -> None:
        nonlocal count
        count += 1
        if count <= MAX_ERROR_DETAILS:
            details.append({"field": _render(path), "message": message})

    stack: list[tuple[Any, _Path]] = [(data, None)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            message = text_problem(value)
            if message is not None:
                problem(path, message)
        elif isinstance(value, dict):
            for key in getattr(value, "repeated", ()):
                problem((path, key), "duplicate key: a key may appear once in an object")
            children: list[tuple[Any, _Path]] = []
            for key, item in value.items():
                child = (path, key)
                if isinstance(key, str):
                    message = text_problem(key)
                    if message is not None:
                        problem(child, f"field name {message}")
                children.append((item, child))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            stack.extend((value[index], (path, index)) for index in range(len(value) - 1, -1, -1))
        elif isinstance(value, _Refused):
            problem(path, value.message)
    if count > MAX_ERROR_DETAILS:
        details.append(more_detail(count - MAX_ERROR_DETAILS))
    return details


def check_input(data: Any) -> None:
    """Raise `InvalidInput` naming every problem `input_problems` finds in `data`."""
    details = input_problems(data)
    if details:
        raise InvalidInput.from_details(details)


def json_loads_strict(raw: bytes | str) -> Any:
    """Parse a JSON document strictly (see the module); `InvalidInput` names every problem."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput.field("body", f"not valid UTF-8 (at byte {exc.start})") from exc
    else:
        text = raw
    decoder = _Decoder()
    try:
        data = json.loads(
            text,
            object_pairs_hook=decoder.object,
            parse_int=decoder.parse_int,
            parse_float=decoder.parse_float,
            parse_constant=decoder.parse_constant,
        )
    except json.JSONDecodeError as exc:
        message = f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        raise InvalidInput.field("body", message) from exc
    except _NotJson as exc:
        raise InvalidInput.field("body", f"not valid JSON: {exc}") from exc
    except RecursionError as exc:
        # A body nested a few thousand levels deep exhausts the decoder's stack.
        raise InvalidInput.field("body", "not valid JSON: nested too deeply") from exc
    # Text handed over as `str` may hold a surrogate as it is, not only as an escape.
    if (
        decoder.suspect
        or _SUSPECT_ESCAPE.search(text)
        or (isinstance(raw, str) and _BAD_CHARACTER.search(text))
    ):
        check_input(data)
    return data
