"""The CLI's selector expressions, read into the API's selector object.

The one reader of this syntax: the operators' `manage.py capacity --selector`
reads it through this module too (`capacity.cli_device_match`), with the server's
attribute registry, since the tenant's CLI never imports the server's code:

* comma-separated clauses, one per attribute: `vramGiB >= 80, gpuModel == H100`;
* comparisons `==` (or `=`), `!=`, `>`, `>=`, `<`, `<=`;
* lists `name in (a, b)` and `name notin (a, b)`;
* presence `name exists` and `name !exists`;
* values may be quoted (`"..."` or `'...'`, backslash escapes) to hold commas,
  parentheses or spaces at the ends; a quoted value is always a string.

The answer is the API's form, `{"vramGiB": {"gte": 80}, "gpuModel": {"eq": "H100"}}`,
with `in`/`notIn` lists sorted and de-duplicated, exactly as the server
normalizes it. Values are typed by the attribute registry as the server knows
it today; an attribute this module does not know is passed on (an unquoted
integer as a number) and the server decides, so a newer server's attributes
work without a newer CLI.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# How a clause's values are typed: `int`, `str`, or None (unknown: an unquoted integer is a number).
KindOf = Callable[[str], type | None]

# The server's attribute registry (`inventory.attributes.ATTRIBUTE_TYPES`); node labels are strings.
INT_ATTRIBUTES = frozenset({"vramGiB", "numaNode", "memoryGiB", "slotIndex", "linkGbps", "sizeGiB"})
STRING_ATTRIBUTES = frozenset({"gpuProduct", "gpuModel", "pciBusId", "nvlinkDomain", "migProfile", "media"})
NODE_LABEL_PREFIX = "node."

_SYMBOLS = {"==": "eq", "=": "eq", "!=": "ne", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}
_ORDERED = frozenset({"gt", "gte", "lt", "lte"})
_NAME = r"[A-Za-z][A-Za-z0-9._/-]*"
_QUOTED = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'"
_COMPARE_CLAUSE = re.compile(rf"({_NAME})\s*(==|!=|>=|<=|=|>|<)\s*(.*)", re.DOTALL)
_LIST_CLAUSE = re.compile(rf"({_NAME})\s+(in|notin)\s*\((.*)\)", re.DOTALL | re.IGNORECASE)
_EXISTS_CLAUSE = re.compile(rf"({_NAME})\s+(!?exists)", re.IGNORECASE)
_QUOTED_VALUE = re.compile(_QUOTED, re.DOTALL)
# An unquoted value: words separated by single spaces, none of the syntax's characters,
# so a missing comma is an error rather than part of a value.
_BARE_VALUE = re.compile(r"[^\s\"'(),=!<>\\]+(?: [^\s\"'(),=!<>\\]+)*")
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,16}")


class SelectorError(ValueError):
    """A selector that cannot be read; `problems` holds one line per bad clause."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def attribute_kind(name: str) -> type | None:
    """`int` or `str` for an attribute this CLI knows, None for one it does not."""
    if name.startswith(NODE_LABEL_PREFIX) and len(name) > len(NODE_LABEL_PREFIX):
        return str
    if name in INT_ATTRIBUTES:
        return int
    if name in STRING_ATTRIBUTES:
        return str
    return None


def split_clauses(text: str) -> list[str]:
    """Split on commas outside quotes and parentheses."""
    clauses: list[str] = []
    depth = 0
    quote: str | None = None
    escaped = False
    current: list[str] = []
    for char in text:
        if quote is not None:
            current.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
            continue
        if char in "\"'":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            clauses.append("".join(current))
            current = []
            continue
        current.append(char)
    clauses.append("".join(current))
    return clauses


def _read_value(token: str) -> tuple[str, bool] | None:
    """A value's text and whether it was quoted, or None when it is not one value."""
    token = token.strip()
    if _QUOTED_VALUE.fullmatch(token):
        return re.sub(r"\\(.)", r"\1", token[1:-1], flags=re.DOTALL), True
    if _BARE_VALUE.fullmatch(token):
        return token, False
    return None


def _typed(kind: type | None, text: str, quoted: bool) -> Any:
    """The value as the attribute's type; a quoted value is always a string."""
    if kind is int:
        if quoted or not _INT_TEXT.fullmatch(text):
            raise ValueError("needs an integer")
        return int(text)
    if kind is None and not quoted and _INT_TEXT.fullmatch(text):
        return int(text)
    return text


def _parse_clause(clause: str, kind_of: KindOf) -> tuple[str, dict[str, Any]]:
    """One clause as (attribute, `{operator: value}`); ValueError says why not."""
    text = clause.strip()
    if not text:
        raise ValueError("is empty")
    match = _EXISTS_CLAUSE.fullmatch(text)
    if match:
        return match.group(1), {"exists": not match.group(2).startswith("!")}
    match = _LIST_CLAUSE.fullmatch(text)
    if match:
        name, keyword, inner = match.groups()
        kind = kind_of(name)
        values: list[Any] = []
        for item in split_clauses(inner):
            read = _read_value(item)
            if read is None:
                raise ValueError(f"cannot read the list value {item.strip()!r}")
            try:
                values.append(_typed(kind, *read))
            except ValueError as exc:
                raise ValueError(f"{name}: in/notin values: each {exc}") from None
        try:
            values = sorted(set(values))
        except TypeError:
            raise ValueError(f"{name}: mixes numbers and text in one list") from None
        return name, {"in" if keyword.lower() == "in" else "notIn": values}
    match = _COMPARE_CLAUSE.fullmatch(text)
    if match:
        name, symbol, rest = match.groups()
        read = _read_value(rest)
        if read is None:
            raise ValueError(
                "needs one value after the operator (quote it if it holds , ( ) = ! < > or quotes)"
            )
        op = _SYMBOLS[symbol]
        kind = kind_of(name)
        if op in _ORDERED and kind is str:
            raise ValueError(f"{name}: {op} compares integers; {name} is a string attribute")
        try:
            return name, {op: _typed(kind, *read)}
        except ValueError as exc:
            raise ValueError(f"{name}: {op} value {exc}") from None
    raise ValueError("is not `name op value`, `name in (a, b)`, `name notin (a, b)` or `name [!]exists`")


@dataclass(frozen=True)
class Clause:
    """One clause as written, and what it says (`name`, `spec` in the API's form) or why it cannot be read."""

    text: str
    name: str | None
    spec: dict[str, Any] | None
    problem: str | None


def read_clauses(text: str, *, kind_of: KindOf = attribute_kind) -> list[Clause]:
    """Every clause of `text`, read or refused, in order: the one reader of the syntax.

    `kind_of(name)` types the values (`int`, `str`, or None: an unquoted integer
    is a number). The tenants' CLI passes what it knows of the registry; the
    operators' `manage.py capacity --selector` passes the server's registry and
    then normalizes each clause as the API does (`capacity.cli_device_match`).
    """
    clauses: list[Clause] = []
    seen: set[str] = set()
    for raw in split_clauses(text):
        shown = raw.strip()
        try:
            name, spec = _parse_clause(raw, kind_of)
        except ValueError as exc:
            clauses.append(Clause(shown, None, None, str(exc)))
            continue
        if name in seen:
            clauses.append(
                Clause(shown, name, None, f"{name} already has a condition; use one per attribute")
            )
            continue
        seen.add(name)
        clauses.append(Clause(shown, name, spec, None))
    return clauses


def parse_selector(text: str, *, kind_of: KindOf = attribute_kind) -> dict[str, dict[str, Any]]:
    """`"vramGiB >= 80, gpuModel == H100"` as the API's selector object; SelectorError names bad clauses."""
    if not text.strip():
        return {}
    clauses = read_clauses(text, kind_of=kind_of)
    problems = [f"clause {c.text!r}: {c.problem}" for c in clauses if c.problem is not None]
    if problems:
        raise SelectorError(problems)
    return {c.name: c.spec for c in clauses if c.name is not None and c.spec is not None}


# How each operator is written back (`=` reads as `==`, which is how it is written).
_CLI_OF = {op: symbol for symbol, op in _SYMBOLS.items() if symbol != "="}


def _cli_value(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = str(value)
    if _BARE_VALUE.fullmatch(text) and not _INT_TEXT.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector_text(selector: dict[str, dict[str, Any]]) -> str:
    """A selector object as this syntax writes it; `read_clauses` reads it back to the same object."""
    clauses = []
    for name, ops in selector.items():
        for op, value in ops.items():
            if op == "exists":
                clauses.append(f"{name} {'exists' if value else '!exists'}")
            elif op in ("in", "notIn"):
                keyword = "in" if op == "in" else "notin"
                clauses.append(f"{name} {keyword} ({', '.join(_cli_value(v) for v in value)})")
            else:
                clauses.append(f"{name} {_CLI_OF[op]} {_cli_value(value)}")
    return ", ".join(clauses)
