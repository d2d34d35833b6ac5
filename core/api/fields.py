"""Strict input: serializers and fields that take a JSON value only as the contract spells it.

DRF coerces (`"5"` to 5, `1` to True, 5 to `"5"`) and ignores unknown fields;
these refuse both, so a client's bug is an INVALID_INPUT naming the field.
"""

from __future__ import annotations

import heapq
import re
import threading
from typing import Any, cast

from django.core.validators import RegexValidator
from django.utils.functional import cached_property
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.settings import api_settings
from rest_framework.utils.serializer_helpers import BindingDict

from core.api.compiled import fast_validated
from core.constants import MAX_TIME_MS, NODE_ID_REGEX, POOL_ID_REGEX, TENANT_ID_REGEX
from core.durations import (
    DURATION_PATTERN,
    MAX_SECONDS,
    MAX_TEXT_LENGTH,
    MIN_SECONDS,
    DurationError,
    parse_duration,
)
from core.errors import MAX_ERROR_DETAILS, more_detail

# Per thread, per input serializer class: the bound fields of one instance, made once.
_BUILT = threading.local()


class StrictSerializer(serializers.Serializer):
    """An input serializer that refuses unknown fields, at every depth (nest StrictSerializers).

    Its fields are built once per class and thread, not deep-copied for every
    request as DRF does (a create's body has about a hundred fields at every
    depth; copying them was most of its validation's time). What a request
    validates is kept on the serializer it made (`validated_data`, `errors`);
    the fields keep nothing of it, and no input serializer's field reads the
    context (the root's own `validate_*` methods read the request's).
    """

    _prototype = False

    @cached_property
    def fields(self) -> BindingDict:
        if self._prototype or self.parent is not None:
            # The prototype itself, or a part nested in one: bound the way DRF binds them.
            built: BindingDict = super().fields
            return built
        by_class: dict[type, BindingDict] = _BUILT.__dict__.setdefault("fields", {})
        fields = by_class.get(type(self))
        if fields is None:
            prototype = type(self)()
            prototype._prototype = True
            fields = by_class[type(self)] = prototype.fields
        return fields

    def run_validation(self, data: Any = empty) -> Any:
        if self.parent is None:
            # A body the compiled walk can follow is validated by it; anything else, errors included, by DRF.
            validated = fast_validated(self, data)
            if validated is not None:
                return validated
        return super().run_validation(data)

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            if self.parent is None:
                raise serializers.ValidationError({"body": ["must be a JSON object"]})
            raise serializers.ValidationError(["must be a JSON object"])
        # Unknown fields and bad known fields are reported together: `details`
        # names every bad field, so a client fixes its request in one go. Only
        # the first unknown ones (in name order) are named, and the rest counted:
        # a body of 100,000 unknown keys gets an answer the size of any other.
        unknown = set(data) - set(self.fields)
        errors: dict[str, Any] = {
            name: ["unknown field"] for name in heapq.nsmallest(MAX_ERROR_DETAILS, unknown)
        }
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if not isinstance(exc.detail, dict):
                raise
            errors.update(exc.detail)
        if len(unknown) > MAX_ERROR_DETAILS:
            more = more_detail(len(unknown) - MAX_ERROR_DETAILS, "unknown fields")["message"]
            errors.setdefault(api_settings.NON_FIELD_ERRORS_KEY, []).append(more)
        if errors:
            raise serializers.ValidationError(errors)
        return value


class StrictIntegerField(serializers.IntegerField):
    """An integer that must be a JSON number without a fraction: `"5"`, `5.5` and `true` are refused."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        if isinstance(data, float) and not data.is_integer():
            self.fail("invalid")
        value: int = super().to_internal_value(data)
        return value


class StrictBooleanField(serializers.BooleanField):
    """A JSON `true` or `false` only; `"yes"` or `1` would hide a client's bug."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    """A JSON string only (DRF would turn `5` into `"5"`); whitespace kept as sent."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        value: str = super().to_internal_value(data)
        return value


class WholeRegexValidator(RegexValidator):
    """A `RegexValidator` that matches the whole value (`fullmatch`).

    The patterns keep the contract's `^…$` spelling, which is what they mean in
    the OpenAPI document (ECMA-262, where `$` is the end of the text). In
    Python `$` also matches before a final newline, so `re.search` would take
    `"abc\n"` for `^[a-z]+$`; `fullmatch` does not.
    """

    def __call__(self, value: Any) -> None:
        pattern = cast(re.Pattern[str], self.regex)  # compiled by RegexValidator.__init__
        if not isinstance(value, str) or pattern.fullmatch(value) is None:
            raise serializers.ValidationError(self.message, code=self.code)


class StrictRegexField(StrictCharField):
    """A JSON string matching a pattern whole, with the pattern in the error message."""

    def __init__(self, regex: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators.append(WholeRegexValidator(regex, message=f"must match {regex}"))


def tenant_id_field(**kwargs: Any) -> StrictRegexField:
    kwargs.setdefault("source", "tenant_id")
    return StrictRegexField(TENANT_ID_REGEX, max_length=128, **kwargs)


def pool_id_field(**kwargs: Any) -> StrictRegexField:
    kwargs.setdefault("source", "pool_id")
    return StrictRegexField(POOL_ID_REGEX, max_length=57, **kwargs)


def node_id_field(**kwargs: Any) -> StrictRegexField:
    kwargs.setdefault("source", "node_id")
    return StrictRegexField(NODE_ID_REGEX, max_length=57, **kwargs)


def time_ms_field(**kwargs: Any) -> StrictIntegerField:
    return StrictIntegerField(min_value=0, max_value=MAX_TIME_MS, **kwargs)


class DurationField(serializers.Field):
    """Seconds, or a duration string (`90s`, `1h30m`, `1d`, `PT8H`), between `minimum` and `maximum`."""

    def __init__(
        self, *, minimum: int = MIN_SECONDS, maximum: int = MAX_SECONDS, example: str = "1h30m", **kwargs: Any
    ) -> None:
        self.minimum, self.maximum, self.example = minimum, maximum, example
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        try:
            return parse_duration(data, minimum=self.minimum, maximum=self.maximum)
        except DurationError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def to_representation(self, value: Any) -> Any:
        return value

    def openapi_schema(self) -> dict[str, Any]:
        """The integer's range is the schema's; a string's value is bounded by the same range (a rule)."""
        return {
            "oneOf": [
                {"type": "integer", "minimum": self.minimum, "maximum": self.maximum},
                {"type": "string", "pattern": DURATION_PATTERN, "maxLength": MAX_TEXT_LENGTH},
            ],
            "example": self.example,
        }
