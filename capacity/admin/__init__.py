"""The operator admin of the top layer: node and pool consoles, and the ledger's counters.

Django's autodiscovery imports this package; each module registers its admins.
"""

from capacity.admin import consoles, counters, resources

__all__ = ["consoles", "counters", "resources"]
