"""The admin through Django's test client."""

from __future__ import annotations

from typing import Any


def messages_of(response: Any) -> list[str]:
    """The messages the admin showed on `response` (followed to its last page)."""
    return [str(m) for m in response.context["messages"]]
