"""Fixtures of the cross-cutting guarantees: the torture fleet the concurrency and fault runs fight over,
and the commit hooks and gates the guards' races are held with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from reservations.placer import commit
from tests.support.races import Hooks, open_every_gate
from tests.support.torture.fleet import Fleet, fleet_logged


@pytest.fixture
def fleet(transactional_db: Any) -> Iterator[Fleet]:
    """The torture fleet, with the commit-order log installed for the length of the test."""
    with fleet_logged() as built:
        yield built


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    """The commit's hooks, empty before and after the test."""
    commit.HOOKS.clear()
    yield commit.HOOKS
    commit.HOOKS.clear()


@pytest.fixture(autouse=True)
def open_every_gate_at_the_end() -> Iterator[None]:
    """A failing test (a guard removed) lets its held threads go at once instead of after JOIN_SECONDS."""
    yield
    open_every_gate()
