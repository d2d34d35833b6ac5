"""The operator's admin pages: the pool and node consoles, offerings, node resources, the counters.

Django's autodiscovery imports this package; each module registers its admins.
`console` holds what the two consoles share, `node_actions` the node console's actions.
"""

from operations.admin import counters, nodes, offerings, pools, resources

__all__ = ["counters", "nodes", "offerings", "pools", "resources"]
