"""Node and device changes with their consequences: rollups at once, waits woken, repair asked for.

The callers (the API, the admin, the management commands, liveness) change
nodes through these functions, never through `inventory.operations` directly.
"""

from __future__ import annotations

from inventory.operations import (
    device_set_health,
    node_cordon,
    node_set_maintenance,
    node_taint,
    node_uncordon,
    node_untaint,
)

__all__ = [
    "device_set_health",
    "node_cordon",
    "node_set_maintenance",
    "node_taint",
    "node_uncordon",
    "node_untaint",
]
