"""psycopg's list dumper, with its answer for a flat list of strings or integers kept per connection.

A Python list sent as a parameter becomes a PostgreSQL array. For each one,
psycopg looks at every element to find their type (and, for integers, the
largest, which picks int2, int4, int8 or numeric), then builds a new dumper
with a transformer of its own: about 15 µs per list, and a create and its
release send some thirty lists (ids, resources, amounts). The statement's
transformer is new for every statement, so nothing of that is kept.

Here the two common cases, a flat list whose elements are all `str`, or all
`int`, are recognised in one pass, and the dumper psycopg built for that
element type (for integers, for that width) the first time is reused by
every later statement on the connection: the same oid, the same element
dumper, the same text. Everything else (an empty list, a None, a nested
list, mixed types, any other element type) goes through psycopg's own code.
"""

from __future__ import annotations

import re
from typing import Any

from psycopg.adapt import PyFormat
from psycopg.types import array

# The element types whose dumpers depend only on the connection (its encoding), not on the value.
_SIMPLE = (str, int)

# What makes psycopg quote an element (its `_get_needs_quotes_regexp`), looked for once in the
# elements joined by commas: a quote, a brace, a backslash or white space anywhere; an empty element
# or the word NULL between two commas (or an end). A comma inside an element is found by counting
# them, and text that is not ASCII (psycopg also quotes some Unicode spaces) is left to psycopg.
_SPECIAL = re.compile(rb'["{}\\\s]')
_EMPTY_OR_NULL = re.compile(rb"(?i)(?:^|,)(?:null)?(?:,|$)")


def _flat_element(obj: list[Any]) -> Any:
    """The element psycopg would pick for a flat list of one simple type, or None to let psycopg look."""
    if not obj:
        return None
    kinds = set(map(type, obj))
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    if kind not in _SIMPLE:
        return None
    if kind is int:
        # psycopg's rule: the largest magnitude decides the width (a negative n counts as -n - 1).
        high, low = max(obj), min(obj)
        return high if low >= 0 else max(high, -low - 1)
    return obj[-1]


class ListDumper(array.ListDumper):
    """The text-format list dumper, with the upgrade for flat `str` and `int` lists kept on the connection."""

    def get_key(self, obj: list[Any], format: PyFormat) -> Any:
        if self.oid:
            return self.cls
        item = _flat_element(obj)
        if item is None:
            return super().get_key(obj, format)
        return (self.cls, self._tx.get_dumper(item, format).get_key(item, format))

    def upgrade(self, obj: list[Any], format: PyFormat) -> array.BaseListDumper:
        if self.oid:
            return self
        item = _flat_element(obj)
        kept: dict[Any, array.BaseListDumper] | None = getattr(self.connection, "list_dumpers", None)
        if item is None or kept is None:
            return super().upgrade(obj, format)
        key = (self._tx.get_dumper(item, format).get_key(item, format), format)
        dumper = kept.get(key)
        if dumper is None:
            dumper = kept[key] = super().upgrade(obj, format)
        return dumper

    def dump(self, obj: list[Any]) -> bytes | None:
        """The array's text in one join where no element needs quoting; psycopg's own walk otherwise."""
        sub = self.sub_dumper
        if sub is None or self.delimiter != b"," or not obj:
            return super().dump(obj)
        kinds = set(map(type, obj))
        kind = kinds.pop() if len(kinds) == 1 else None
        if kind not in _SIMPLE:
            return super().dump(obj)
        if kind is int:
            return b"{" + ",".join(map(str, obj)).encode() + b"}"
        dump = sub.dump
        texts: list[Any] = [dump(item) for item in obj]  # bytes: a str element's dumper returns no None
        joined = b",".join(texts)
        if (
            not joined.isascii()
            or joined.count(b",") != len(obj) - 1
            or _SPECIAL.search(joined)
            or _EMPTY_OR_NULL.search(joined)
        ):
            return super().dump(obj)
        return b"{" + joined + b"}"


def list_dumper_register(connection: Any) -> None:
    """Use `ListDumper` for the lists this connection sends, and give it the connection's store."""
    connection.list_dumpers = {}
    connection.adapters.register_dumper(list, ListDumper)
