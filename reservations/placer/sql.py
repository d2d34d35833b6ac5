"""A tiny parameter collector so the placer's SQL is built from fragments but never from values."""

from __future__ import annotations

from typing import Any


class Params:
    """Collects named parameters; `p(value)` returns the placeholder to splice into SQL."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def p(self, value: Any, cast: str = "") -> str:
        name = f"p{len(self.values)}"
        self.values[name] = value
        placeholder = f"%({name})s"
        return f"{placeholder}::{cast}" if cast else placeholder
