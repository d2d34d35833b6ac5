"""The admin of capacity's own tables: hourly usage (read-only, with its CSV).

Django's autodiscovery imports this package; each module registers its admins.
"""

from capacity.admin import usage

__all__ = ["usage"]
