"""Models made from plain SQL rows, as the ORM makes them, for the hot paths that build no queryset.

Building a queryset (filters, annotations, the compiler) costs about half a
millisecond of Python per query; a write path that reads three rows spends
more on that than on the database. These helpers select a model's columns in
one statement of the caller's and turn the row into the model the way the ORM
does (`Model.from_db`, with each field's database converter, such as JSON's).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


@cache
def model_columns(model: type[Model], alias: str) -> str:
    """The model's columns, qualified by `alias`, in field order: the select list `model_from_row` reads."""
    return ", ".join(f"{alias}.{connection.ops.quote_name(f.column)}" for f in model._meta.concrete_fields)


def model_width(model: type[Model]) -> int:
    """How many values of a row are the model's (the caller's own columns follow them)."""
    return len(model._meta.concrete_fields)


def model_from_row(model: type[M], values: Sequence[Any]) -> M:
    """The model from the first `model_width(model)` values of a row selected with `model_columns`."""
    fields = model._meta.concrete_fields
    converted = [
        field.from_db_value(value, None, connection) if hasattr(field, "from_db_value") else value
        for field, value in zip(fields, values[: len(fields)], strict=True)
    ]
    return model.from_db(connection.alias, [field.attname for field in fields], converted)
