# Per pool, atom class and value of the node label `fabric`, the counts that
# `capacity/byPool`'s fragmentation reports, kept by PostgreSQL from the
# per-node counts (`reservations.models.PoolFabricCount`): the read sums a few
# rows instead of every node of the pool.
#
# Each `node_atom_counts` row now carries what its node contributes with:
# whether the node is schedulable (`inventory.schedulability.schedulable_sql`,
# written out here as it stands today) and its `fabric` label. A statement-level
# trigger on `node_atom_counts` adds each changed row's new contribution and
# takes its old one away, so every writer of a booking, a device or a node is
# covered by the triggers that already keep those rows.

from django.db import migrations, models

from core.migration_helpers import statement_triggers


# A node's schedulability over the aliases `n` (the node) and `p` (its pool),
# as `schedulable_sql("n", "p.owner_id")` reads when this migration was written;
# `check_node_atom_counts` compares the kept column with today's predicate.
SCHEDULABLE_N = (
    "(n.role = 'host' AND NOT n.maintenance AND NOT n.cordoned"
    " AND n.provision_state IN ('adopted', 'deployed') AND n.connectivity = 'connected'"
    " AND n.noschedule_taints = 0 AND n.converged_specs >= 1"
    " AND (n.trust = 'platform' OR (n.trust = 'tenant-owned' AND n.owner_id = p.owner_id)))"
)
SCHEDULABLE_NEW = SCHEDULABLE_N.replace("n.", "NEW.")
FABRIC_N = "COALESCE(n.labels ->> 'fabric', '')"

# The columns of a node's row that its schedulability, pool and fabric read.
NODE_COLUMNS = (
    "pool_id",
    "role",
    "maintenance",
    "cordoned",
    "provision_state",
    "connectivity",
    "noschedule_taints",
    "converged_specs",
    "trust",
    "owner_id",
)
NODE_CHANGED = " OR ".join(
    [f"OLD.{column} IS DISTINCT FROM NEW.{column}" for column in NODE_COLUMNS]
    + ["(OLD.labels ->> 'fabric') IS DISTINCT FROM (NEW.labels ->> 'fabric')"]
)


def contribution(rows: str, sign: str) -> str:
    """SELECT: what each counted row of `rows` adds to its pool's fabric, times `sign`."""
    return f"""SELECT pool_id, device_class, fabric, {sign} AS nodes,
           {sign} * (running = 0)::int AS nodes_free,
           {sign} * (running = 0 AND (device_class <> 'gpu' OR atoms >= 8))::int AS whole_free,
           {sign} * CASE WHEN running > 0 THEN GREATEST(free, 0) ELSE 0 END AS stranded
      FROM {rows} WHERE schedulable AND atoms > 0"""


def fabric_upsert(source: str) -> str:
    """SQL: add the contributions `source` selects to their rows, in key order."""
    return f"""INSERT INTO pool_fabric_counts AS f
           (pool_id, device_class, fabric, nodes, nodes_free, whole_free, stranded)
    SELECT x.pool_id, x.device_class, x.fabric,
           sum(x.nodes), sum(x.nodes_free), sum(x.whole_free), sum(x.stranded)
      FROM ({source}) x
     GROUP BY 1, 2, 3
    HAVING sum(x.nodes) <> 0 OR sum(x.nodes_free) <> 0 OR sum(x.whole_free) <> 0 OR sum(x.stranded) <> 0
     ORDER BY x.pool_id COLLATE "C", x.device_class COLLATE "C", x.fabric COLLATE "C"
    ON CONFLICT (pool_id, device_class, fabric) DO UPDATE
       SET nodes = f.nodes + EXCLUDED.nodes, nodes_free = f.nodes_free + EXCLUDED.nodes_free,
           whole_free = f.whole_free + EXCLUDED.whole_free, stranded = f.stranded + EXCLUDED.stranded"""


TRIGGERS_SQL = f"""
-- A new row takes its node's schedulability and fabric; a delta leaves them.
-- Each is read by the node's key in a subquery of its own: a join here let
-- the planner hash the whole node table on every booking statement (about
-- 1 ms at 10,000 nodes), where a probe per node costs microseconds.
CREATE OR REPLACE FUNCTION node_atom_counts_add(deltas jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO node_atom_counts AS c (node_id, pool_id, device_class, atoms, running, schedulable, fabric)
    SELECT x.node_id, x.pool_id, x.device_class, sum(x.atoms), sum(x.running),
           COALESCE((SELECT {SCHEDULABLE_N} FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id
                      WHERE n.id = x.node_id), false),
           COALESCE((SELECT {FABRIC_N} FROM inventory_node n WHERE n.id = x.node_id), '')
      FROM jsonb_to_recordset(deltas)
           AS x(node_id varchar, pool_id varchar, device_class varchar, atoms int, running int)
     GROUP BY 1, 2, 3
    HAVING sum(x.atoms) <> 0 OR sum(x.running) <> 0
     ORDER BY x.node_id COLLATE "C", x.device_class COLLATE "C"
    ON CONFLICT (node_id, device_class) DO UPDATE
       SET atoms = c.atoms + EXCLUDED.atoms, running = c.running + EXCLUDED.running,
           pool_id = EXCLUDED.pool_id
$$;

-- Nodes: the rows follow a node to its new pool and take its schedulability
-- and fabric when any of them changes, and go with it.
CREATE OR REPLACE FUNCTION node_atom_counts_nodes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM node_atom_counts WHERE node_id = OLD.id;
    ELSE
        UPDATE node_atom_counts c
           SET pool_id = NEW.pool_id, schedulable = s.schedulable, fabric = s.fabric
          FROM (SELECT {SCHEDULABLE_NEW} AS schedulable, COALESCE(NEW.labels ->> 'fabric', '') AS fabric
                  FROM inventory_pool p WHERE p.id = NEW.pool_id) s
         WHERE c.node_id = NEW.id
           AND (c.pool_id, c.schedulable, c.fabric) IS DISTINCT FROM (NEW.pool_id, s.schedulable, s.fabric);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER node_atom_counts_nodes_pool ON inventory_node;
CREATE TRIGGER node_atom_counts_nodes_change AFTER UPDATE ON inventory_node
    FOR EACH ROW WHEN ({NODE_CHANGED})
    EXECUTE FUNCTION node_atom_counts_nodes();

-- Pools: a new owner changes which tenant-owned nodes are schedulable.
CREATE FUNCTION node_atom_counts_pools() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE node_atom_counts c SET schedulable = s.schedulable
      FROM (SELECT n.id, {SCHEDULABLE_N} AS schedulable
              FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id
             WHERE n.pool_id = NEW.id) s
     WHERE c.node_id = s.id AND c.schedulable IS DISTINCT FROM s.schedulable;
    RETURN NULL;
END $$;

CREATE TRIGGER node_atom_counts_pools_owner AFTER UPDATE OF owner_id ON inventory_pool
    FOR EACH ROW WHEN (OLD.owner_id IS DISTINCT FROM NEW.owner_id)
    EXECUTE FUNCTION node_atom_counts_pools();

-- The fabric counts: each changed row's new contribution in, its old one out.
CREATE FUNCTION pool_fabric_counts_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- The per-node upsert fires this with no row inserted when every row existed.
        IF NOT EXISTS (SELECT FROM new_rows) THEN
            RETURN NULL;
        END IF;
        {fabric_upsert(contribution("new_rows", "1"))};
    ELSIF TG_OP = 'DELETE' THEN
        {fabric_upsert(contribution("old_rows", "-1"))};
    ELSE
        {fabric_upsert(contribution("new_rows", "1") + " UNION ALL " + contribution("old_rows", "-1"))};
    END IF;
    RETURN NULL;
END $$;

-- What is there already, before the fabric counts' triggers count it once more.
UPDATE node_atom_counts c SET schedulable = {SCHEDULABLE_N}, fabric = {FABRIC_N}
  FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id
 WHERE n.id = c.node_id;
{fabric_upsert(contribution("node_atom_counts", "1"))};

{statement_triggers("pool_fabric_counts_apply", "node_atom_counts")}
"""

REVERSE_SQL = """
DROP TRIGGER pool_fabric_counts_apply_delete ON node_atom_counts;
DROP TRIGGER pool_fabric_counts_apply_update ON node_atom_counts;
DROP TRIGGER pool_fabric_counts_apply_insert ON node_atom_counts;
DROP FUNCTION pool_fabric_counts_apply();
DROP TRIGGER node_atom_counts_pools_owner ON inventory_pool;
DROP FUNCTION node_atom_counts_pools();
DROP TRIGGER node_atom_counts_nodes_change ON inventory_node;
CREATE OR REPLACE FUNCTION node_atom_counts_nodes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM node_atom_counts WHERE node_id = OLD.id;
    ELSE
        UPDATE node_atom_counts SET pool_id = NEW.pool_id WHERE node_id = NEW.id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER node_atom_counts_nodes_pool AFTER UPDATE OF pool_id ON inventory_node
    FOR EACH ROW WHEN (OLD.pool_id IS DISTINCT FROM NEW.pool_id)
    EXECUTE FUNCTION node_atom_counts_nodes();
CREATE OR REPLACE FUNCTION node_atom_counts_add(deltas jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO node_atom_counts AS c (node_id, pool_id, device_class, atoms, running)
    SELECT x.node_id, x.pool_id, x.device_class, sum(x.atoms), sum(x.running)
      FROM jsonb_to_recordset(deltas)
           AS x(node_id varchar, pool_id varchar, device_class varchar, atoms int, running int)
     GROUP BY 1, 2, 3
    HAVING sum(x.atoms) <> 0 OR sum(x.running) <> 0
     ORDER BY x.node_id COLLATE "C", x.device_class COLLATE "C"
    ON CONFLICT (node_id, device_class) DO UPDATE
       SET atoms = c.atoms + EXCLUDED.atoms, running = c.running + EXCLUDED.running,
           pool_id = EXCLUDED.pool_id
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("inventory", "0008_device_node_hold"), ("reservations", "0016_repair_requests")]
    operations = [
        migrations.AddField(
            model_name="nodeatomcount", name="schedulable", field=models.BooleanField(db_default=False)
        ),
        migrations.AddField(model_name="nodeatomcount", name="fabric", field=models.TextField(db_default="")),
        migrations.CreateModel(
            name="PoolFabricCount",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("pool_id", models.CharField(max_length=57)),
                ("device_class", models.CharField(max_length=16)),
                ("fabric", models.TextField()),
                ("nodes", models.IntegerField(default=0)),
                ("nodes_free", models.IntegerField(default=0)),
                ("whole_free", models.IntegerField(default=0)),
                ("stranded", models.IntegerField(default=0)),
            ],
            options={
                "db_table": "pool_fabric_counts",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("pool_id", "device_class", "fabric"), name="pool_fabric_counts_unique"
                    )
                ],
            },
        ),
        migrations.RunSQL(TRIGGERS_SQL, REVERSE_SQL),
    ]
