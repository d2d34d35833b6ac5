"""The placer's scorers: each 0-100, combined as a weighted mean (also 0-100).

They are SQL expressions over the columns of `filters.features_sql`, so the
ranking and the `LIMIT` of the shortlist happen in one query, however large
the pool.

* **bin packing** (weight 40): prefer the node left with the fewest free atoms,
  so large nodes stay whole for large requests. `100 * wanted / free`: a node
  whose free atoms are exactly the request scores 100.
* **NUMA locality** (weight 30): the first device item's atoms on one
  `numaNode`. 100 when one NUMA node holds the whole count, else the share the
  best NUMA node holds.
* **PreferNoSchedule taint** (weight 20): 0 on a node with any
  `PreferNoSchedule` taint, 100 otherwise; such a node is used only when
  better ones are gone.
* **spot displacement** (weight 10): `100 * (1 - displaced / wanted)`, where
  `displaced` is how many atoms would be taken from spot reservations; 100 when
  nothing is displaced (always, outside displace mode).

Scores are rounded to two decimals, so many nodes tie; the plan orders equal
scores by a hash seeded per plan (`plan.placement_plan`), never by node id,
so concurrent plans for one request shape do not all try the same node first.
"""

from __future__ import annotations

WEIGHTS: dict[str, int] = {"binpack": 40, "numa": 30, "taint": 20, "spot": 10}

SCORERS: dict[str, str] = {
    "binpack": "(100.0 * f.wanted / GREATEST(f.free, 1))",
    "numa": (
        "(CASE WHEN f.primary_wanted <= 0 THEN 100.0"
        " ELSE 100.0 * LEAST(f.numa_best, f.primary_wanted) / f.primary_wanted END)"
    ),
    "taint": "(CASE WHEN f.soft_taints > 0 THEN 0.0 ELSE 100.0 END)",
    "spot": "(100.0 * (1 - LEAST(f.displaced, f.wanted)::numeric / GREATEST(f.wanted, 1)))",
}


def score_sql() -> str:
    """The weighted mean of every scorer, rounded to two decimals, over features alias `f`."""
    total = sum(WEIGHTS.values())
    terms = " + ".join(f"{weight} * {SCORERS[name]}" for name, weight in WEIGHTS.items())
    return f"round(({terms}) / {total}.0, 2)"
