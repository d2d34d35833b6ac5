"""The operator's admin pages: the pool and node consoles, offerings, quotas, node resources.

Django's autodiscovery imports this package; each module registers its admins.
`console` holds what the two consoles share, `node_actions` the node console's actions.
"""

from operations.admin import nodes, offerings, pools, quotas, resources

__all__ = ["nodes", "offerings", "pools", "quotas", "resources"]
