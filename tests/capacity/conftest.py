"""Fixtures of the capacity tests: this connection's clock, moved forward step by step."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from core.clock import compute_now, set_clock_offset


@pytest.fixture
def clock() -> Iterator[Any]:
    """Moves this connection's clock forward by a total offset; put back when the test ends."""
    state = {"offset": timedelta(0)}

    def move(by: timedelta) -> datetime:
        state["offset"] += by
        set_clock_offset(state["offset"])
        return compute_now()

    yield move
    set_clock_offset(timedelta(0))
