"""The admin of what capacity reads and keeps: the pools' rollup rows and hourly usage, both read-only.

Django's autodiscovery imports this package; each module registers its admins.
"""

from capacity.admin import rollups, usage

__all__ = ["rollups", "usage"]
