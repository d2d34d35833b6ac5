"""Fixtures of the cross-cutting guarantees: the torture fleet the concurrency and fault runs fight over."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.torture.fleet import Fleet, fleet_logged


@pytest.fixture
def fleet(transactional_db: Any) -> Iterator[Fleet]:
    """The torture fleet, with the commit-order log installed for the length of the test."""
    with fleet_logged() as built:
        yield built
