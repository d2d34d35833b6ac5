"""Scalar claims on node resources (guard 3): the guarded claim and the give-back.

Only this module changes `inventory_noderesource.allocated`; node reports
change `allocatable` and `ratio` (`inventory.services.node_reports`). The `CHECK
(allocated <= floor(allocatable * ratio))` stands behind the guarded `UPDATE`.
"""

from __future__ import annotations

from django.db import connection

# Guard 3 for every scalar of a member in one statement: the WHERE clause is
# the capacity check, evaluated on the latest row version under the row lock,
# so two claims can never both fit the last units. `locked` takes the rows in
# resource order first (the UPDATE's join order is the planner's), so two
# placements on one node never lock them in opposite orders.
_CLAIM_SCALARS_SQL = """
WITH c AS (
    SELECT resource, amount
      FROM unnest(%(resources)s::varchar[], %(amounts)s::bigint[]) AS c(resource, amount)
),
locked AS (
    SELECT nr.id FROM inventory_noderesource nr
     WHERE nr.node_id = %(node)s AND nr.resource = ANY(%(resources)s::varchar[])
     ORDER BY nr.resource COLLATE "C"
       FOR UPDATE
)
UPDATE inventory_noderesource nr SET allocated = nr.allocated + c.amount
  FROM c
 WHERE nr.id IN (SELECT id FROM locked) AND nr.resource = c.resource
   AND nr.allocated + c.amount <= floor(nr.allocatable * nr.ratio)
"""


def node_resources_claim(*, node_id: str, resources: dict[str, int]) -> bool:
    """Claim every scalar or none: a short row count (one did not fit, or the node lacks it) loses."""
    names = sorted(name for name, amount in resources.items() if amount > 0)
    if not names:
        return True
    with connection.cursor() as cursor:
        cursor.execute(
            _CLAIM_SCALARS_SQL,
            {"node": node_id, "resources": names, "amounts": [resources[name] for name in names]},
        )
        return cursor.rowcount == len(names)


# The scalars an allocation gives back, all of a reservation's nodes and
# resources in one statement. `locked` takes the rows in (node, resource)
# order first, so two give-backs never lock them in opposite orders.
_SCALARS_GIVE_BACK_SQL = """
WITH locked AS (
    SELECT nr.id FROM inventory_noderesource nr
     WHERE (nr.node_id, nr.resource) IN (SELECT * FROM unnest(%(nodes)s::varchar[], %(resources)s::varchar[]))
     ORDER BY nr.node_id, nr.resource
       FOR UPDATE
)
UPDATE inventory_noderesource nr SET allocated = GREATEST(0, nr.allocated - g.amount)
  FROM (SELECT node_id, resource, sum(amount) AS amount
          FROM unnest(%(nodes)s::varchar[], %(resources)s::varchar[], %(amounts)s::bigint[])
               AS g(node_id, resource, amount)
         GROUP BY node_id, resource) g
 WHERE nr.id IN (SELECT id FROM locked) AND nr.node_id = g.node_id AND nr.resource = g.resource
"""


def node_resources_give_back(*, claims: list[tuple[str, str, int]]) -> None:
    """Give back `(node id, resource, amount)` claims, never below zero, in one statement."""
    if not claims:
        return
    claims = sorted(claims)
    with connection.cursor() as cursor:
        cursor.execute(
            _SCALARS_GIVE_BACK_SQL,
            {
                "nodes": [row[0] for row in claims],
                "resources": [row[1] for row in claims],
                "amounts": [row[2] for row in claims],
            },
        )
