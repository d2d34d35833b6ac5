"""Device selectors: the API's object form, the CLI's string form, and a Python matcher.

Both forms normalize to `reservations.request.types.Selector`: attribute name →
`{operator: value}`, exactly one operator per attribute, values type-checked
against the attribute registry (`inventory.attributes`), so a selector the
placer receives can never compare `"80"` with `80`.

* API: `{"vramGiB": {"gte": 80}, "gpuModel": "H100"}`; a bare value means `eq`.
* CLI: `"vramGiB >= 80, gpuModel == H100"`, also `!=`, `>`, `<`, `<=`,
  `in (a, b)`, `notin (a, b)`, `exists`, `!exists`. Values may be quoted
  (`"..."` or `'...'`, with backslash escapes) to hold commas or spaces at the
  ends; unquoted values are read as written.

`in`/`notIn` lists are sorted and de-duplicated, so two selectors that mean the
same thing are equal (the request digest relies on it).

The placer matches in SQL (`reservations.placer.filters.selector_sql`);
`selector_matches` is the same rule in Python, for tests and the admin. As in
label selectors elsewhere, `ne` and `notIn` match a device that lacks the
attribute; every other comparison needs the attribute present.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from core.errors import InvalidInput
from core.json_input import FREE_TEXT_PATTERN, json_integer
from inventory.attributes import ATTRIBUTE_TYPES, NODE_LABEL_PREFIX, attribute_type
from reservations.request.types import Selector

OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "notIn", "exists")
ORDERED_OPERATORS = frozenset({"gt", "gte", "lt", "lte"})
LIST_OPERATORS = frozenset({"in", "notIn"})

# Bounds that keep one request's SQL and digest small; generous for real use.
MAX_ATTRIBUTES = 32
MAX_LIST_ITEMS = 64
MAX_STRING_LENGTH = 256
# Integers must survive a JSON round trip through any client (IEEE doubles).
MAX_INT = 2**53 - 1
# Node label keys as Kubernetes writes them (`topology.kubernetes.io/zone`).
_LABEL_NAME = re.compile(r"node\.[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


# --- The API object form ---------------------------------------------------------


def _value_schema(kind: type) -> dict[str, Any]:
    if kind is int:
        return {"type": "integer", "minimum": -MAX_INT, "maximum": MAX_INT}
    return {"type": "string", "maxLength": MAX_STRING_LENGTH, "pattern": FREE_TEXT_PATTERN}


def _entry_schema(kind: type) -> dict[str, Any]:
    """A bare value (`eq`) or an object of exactly one operator, typed by the attribute's kind."""
    value = _value_schema(kind)
    values = {"type": "array", "items": value, "minItems": 1, "maxItems": MAX_LIST_ITEMS}
    operators: dict[str, Any] = {"eq": value, "ne": value, "in": values, "notIn": values}
    operators["exists"] = {"type": "boolean"}
    if kind is int:
        operators |= {op: value for op in sorted(ORDERED_OPERATORS)}
    one_operator = {
        "type": "object",
        "properties": operators,
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
    }
    return {"oneOf": [value, one_operator]}


def selector_schema() -> dict[str, Any]:
    """The selector's JSON Schema, from the attribute registry: what `selector_errors` takes."""
    return {
        "type": "object",
        "description": "attribute → value (equality) or one operator object: "
        + ", ".join(OPERATORS)
        + "; a node label is `node.<label>`",
        "properties": {name: _entry_schema(kind) for name, kind in sorted(ATTRIBUTE_TYPES.items())},
        "patternProperties": {f"^{_LABEL_NAME.pattern}$": _entry_schema(str)},
        "additionalProperties": False,
        "maxProperties": MAX_ATTRIBUTES,
        "example": {"vramGiB": {"gte": 80}, "gpuModel": "H100"},
    }


def _typed(kind: type, value: Any) -> Any:
    """An integer attribute's value as an int (`80.0` is 80, as JSON Schema reads it); others as sent."""
    if kind is int:
        number = json_integer(value)
        return value if number is None else number
    return value


def _check_value(kind: type, value: Any) -> str | None:
    """Why `value` is not a valid `kind` value, or None."""
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be an integer"
        if abs(value) > MAX_INT:
            return f"must be between {-MAX_INT} and {MAX_INT}"
        return None
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > MAX_STRING_LENGTH:
        return f"must be at most {MAX_STRING_LENGTH} characters"
    return None


def normalize_entry(name: Any, spec: Any) -> tuple[dict[str, Any] | None, str | None]:
    """One attribute's `{operator: value}`, or the reason it is refused."""
    kind = attribute_type(name) if isinstance(name, str) else None
    if kind is None:
        known = ", ".join(sorted(ATTRIBUTE_TYPES))
        return None, f"unknown attribute; use one of {known}, or node.<label>"
    if name.startswith(NODE_LABEL_PREFIX) and not _LABEL_NAME.fullmatch(name):
        return None, "a node label name is letters, digits and . _ / -, at most 128 characters"
    if isinstance(spec, Mapping):
        if len(spec) != 1:
            return None, f"must hold exactly one operator ({', '.join(OPERATORS)})"
        op, value = next(iter(spec.items()))
    else:
        op, value = "eq", spec
    if op not in OPERATORS:
        return None, f"unknown operator {op!r}; use one of {', '.join(OPERATORS)}"
    if op == "exists":
        if not isinstance(value, bool):
            return None, "exists takes true or false"
        return {op: value}, None
    value = [_typed(kind, item) for item in value] if isinstance(value, list) else _typed(kind, value)
    if op in ORDERED_OPERATORS and kind is not int:
        return None, f"{op} compares integers; {name} is a string attribute"
    if op in LIST_OPERATORS:
        if not isinstance(value, list) or not value:
            return None, f"{op} takes a non-empty list of {'integers' if kind is int else 'strings'}"
        if len(value) > MAX_LIST_ITEMS:
            return None, f"{op} takes at most {MAX_LIST_ITEMS} values"
        for item in value:
            problem = _check_value(kind, item)
            if problem is not None:
                return None, f"{op} values: each {problem}"
        return {op: sorted(set(value))}, None
    problem = _check_value(kind, value)
    if problem is not None:
        return None, problem if op == "eq" and not isinstance(spec, Mapping) else f"{op} value {problem}"
    return {op: value}, None


def selector_errors(obj: Any) -> tuple[Selector, dict[str, str]]:
    """The normalized selector and, per attribute (`""` for the whole), what is wrong.

    The request serializer uses this to put errors under the right field name
    (`devices[0].selector.vramGiB`); `normalize_selector` raises them.
    """
    if not isinstance(obj, Mapping):
        return {}, {"": "must be an object mapping attribute names to a value or one operator"}
    if len(obj) > MAX_ATTRIBUTES:
        return {}, {"": f"must name at most {MAX_ATTRIBUTES} attributes"}
    selector: Selector = {}
    errors: dict[str, str] = {}
    for name, spec in obj.items():
        entry, problem = normalize_entry(name, spec)
        if problem is not None:
            errors[str(name)] = problem
        elif entry is not None:
            selector[name] = entry
    return selector, errors


def normalize_selector(obj: Any, *, field: str) -> Selector:
    """The API object form as a Selector; InvalidInput names `<field>.<attribute>` for each problem."""
    selector, errors = selector_errors(obj)
    if errors:
        details = [
            {"field": f"{field}.{name}" if name else field, "message": msg} for name, msg in errors.items()
        ]
        raise InvalidInput.from_details(details)
    return selector


def selector_to_api(selector: Selector) -> dict[str, Any]:
    """The API object form of a normalized selector (`normalize_selector` reads it back)."""
    return {name: dict(ops) for name, ops in selector.items()}


# --- Matching ----------------------------------------------------------------------


def _as_text(value: Any) -> str | None:
    """What PostgreSQL's `->>` gives for a JSON value: text for scalars, JSON for the rest."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _as_number(value: Any) -> int | float | None:
    """A JSON number as a number; anything else under an integer attribute never compares."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def selector_matches(selector: Selector, attributes: dict[str, Any], labels: dict[str, Any]) -> bool:
    """Whether a device (its attributes, its node's labels) matches; the placer's SQL rule in Python."""
    for name, ops in selector.items():
        kind: type
        if name.startswith(NODE_LABEL_PREFIX):
            source, key, kind = labels, name[len(NODE_LABEL_PREFIX) :], str
        else:
            source, key, kind = attributes, name, attribute_type(name) or str
        present = key in source
        raw = source.get(key)
        value: Any = _as_number(raw) if kind is int else _as_text(raw)
        for op, want in ops.items():
            if op == "exists":
                ok = present == want
            elif op == "eq":
                ok = value is not None and value == want
            elif op == "ne":
                ok = value is None or value != want
            elif op == "gt":
                ok = value is not None and value > want
            elif op == "gte":
                ok = value is not None and value >= want
            elif op == "lt":
                ok = value is not None and value < want
            elif op == "lte":
                ok = value is not None and value <= want
            elif op == "in":
                ok = value is not None and value in want
            elif op == "notIn":
                ok = value is None or value not in want
            else:
                ok = False
            if not ok:
                return False
    return True
