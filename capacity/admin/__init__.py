"""The operator admin of the top layer: node and pool consoles, the ledger's counters, hourly usage.

Django's autodiscovery imports this package; each module registers its admins.
"""

from capacity.admin import consoles, counters, resources, usage

__all__ = ["consoles", "counters", "resources", "usage"]
