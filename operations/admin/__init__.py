"""The operator's admin pages: the pool and node consoles, node resources, the counters.

Django's autodiscovery imports this package; each module registers its admins.
"""

from operations.admin import consoles, counters, resources

__all__ = ["consoles", "counters", "resources"]
