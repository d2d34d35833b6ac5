"""Moved to `tests.support.factories`; this name stays only until the modules still importing it switch.

(`tests/guarantees/test_preview_create_agreement.py`, being written alongside the move, imports it.)
"""

from tests.support.factories import (
    AllocationFactory,
    DeviceFactory,
    NodeFactory,
    NodeResourceFactory,
    OfferingFactory,
    PoolFactory,
    ProjectFactory,
    QuotaUsageFactory,
    ReservationFactory,
    TaintFactory,
    TenantFactory,
)

__all__ = [
    "AllocationFactory",
    "DeviceFactory",
    "NodeFactory",
    "NodeResourceFactory",
    "OfferingFactory",
    "PoolFactory",
    "ProjectFactory",
    "QuotaUsageFactory",
    "ReservationFactory",
    "TaintFactory",
    "TenantFactory",
]
