"""Liveness: a node that stopped reporting becomes `disconnected`."""

from __future__ import annotations


def nodes_mark_stale(*, limit: int = 500) -> int:
    """Disconnect connected nodes whose last report is older than the threshold; return how many."""
    raise NotImplementedError
