# Per node and atom class, the healthy bookable atoms and the RUNNING bookings
# on them, kept by PostgreSQL in the statement that changes a booking, a device
# or a node's pool: the placer ranks nodes from these rows
# (`reservations.models.NodeAtomCount`).

from django.db import migrations, models
from django.db.models.expressions import CombinedExpression

from core.migration_helpers import row_trigger_on_change, statement_triggers


# Every trigger applies its rows in (node, class) order, as one upsert: two
# statements touching the same rows take them in one order and queue instead of
# deadlocking. A delta never meets a missing row in practice (the device trigger
# makes the row when the atom appears); if it did, the upsert still records it.
TRIGGERS_SQL = f"""
CREATE FUNCTION node_atom_counts_add(deltas jsonb) RETURNS void LANGUAGE sql AS $$
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

-- Bookings: a RUNNING booking on a healthy bookable atom counts once.
CREATE FUNCTION node_atom_counts_bookings() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    deltas jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT jsonb_agg(jsonb_build_object('node_id', d.node_id, 'pool_id', n.pool_id,
                   'device_class', d.device_class, 'atoms', 0, 'running', 1))
          INTO deltas
          FROM new_rows b JOIN inventory_device d ON d.id = b.device_id
          JOIN inventory_node n ON n.id = d.node_id
         WHERE b.phase = 1 AND d.bookable AND d.healthy;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT jsonb_agg(jsonb_build_object('node_id', d.node_id, 'pool_id', n.pool_id,
                   'device_class', d.device_class, 'atoms', 0, 'running', -1))
          INTO deltas
          FROM old_rows b JOIN inventory_device d ON d.id = b.device_id
          JOIN inventory_node n ON n.id = d.node_id
         WHERE b.phase = 1 AND d.bookable AND d.healthy;
    ELSE
        SELECT jsonb_agg(jsonb_build_object('node_id', d.node_id, 'pool_id', n.pool_id,
                   'device_class', d.device_class, 'atoms', 0,
                   'running', (nb.phase = 1)::int - (ob.phase = 1)::int))
          INTO deltas
          FROM old_rows ob JOIN new_rows nb ON nb.id = ob.id
          JOIN inventory_device d ON d.id = nb.device_id
          JOIN inventory_node n ON n.id = d.node_id
         WHERE (ob.phase = 1) <> (nb.phase = 1) AND d.bookable AND d.healthy;
    END IF;
    IF deltas IS NOT NULL THEN
        PERFORM node_atom_counts_add(deltas);
    END IF;
    RETURN NULL;
END $$;

{statement_triggers('node_atom_counts_bookings', 'device_bookings')}

-- Devices: an atom counts while it is healthy and bookable, with its RUNNING
-- bookings. A device that stops counting (or moves node or class) takes what it
-- added with it, read from its bookings as they are now; one that starts
-- counting brings its RUNNING bookings.
CREATE FUNCTION node_atom_counts_devices() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moved jsonb;
    deltas jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT jsonb_agg(jsonb_build_object('id', d.id, 'node_id', d.node_id,
                   'device_class', d.device_class, 'sign', 1))
          INTO moved
          FROM new_rows d WHERE d.bookable AND d.healthy;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT jsonb_agg(jsonb_build_object('id', d.id, 'node_id', d.node_id,
                   'device_class', d.device_class, 'sign', -1))
          INTO moved
          FROM old_rows d WHERE d.bookable AND d.healthy;
    ELSE
        SELECT jsonb_agg(m.row)
          INTO moved
          FROM (
              SELECT jsonb_build_object('id', o.id, 'node_id', o.node_id,
                         'device_class', o.device_class, 'sign', -1) AS row
                FROM old_rows o JOIN new_rows nw ON nw.id = o.id
               WHERE o.bookable AND o.healthy
                 AND NOT (nw.bookable AND nw.healthy AND nw.node_id = o.node_id
                          AND nw.device_class = o.device_class)
              UNION ALL
              SELECT jsonb_build_object('id', nw.id, 'node_id', nw.node_id,
                         'device_class', nw.device_class, 'sign', 1)
                FROM old_rows o JOIN new_rows nw ON nw.id = o.id
               WHERE nw.bookable AND nw.healthy
                 AND NOT (o.bookable AND o.healthy AND nw.node_id = o.node_id
                          AND nw.device_class = o.device_class)
          ) m;
    END IF;
    IF moved IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT jsonb_agg(jsonb_build_object('node_id', x.node_id, 'pool_id', n.pool_id,
               'device_class', x.device_class, 'atoms', x.sign,
               'running', x.sign * (SELECT count(*) FROM device_bookings b
                                     WHERE b.device_id = x.id AND b.phase = 1)))
      INTO deltas
      FROM jsonb_to_recordset(moved) AS x(id bigint, node_id varchar, device_class varchar, sign int)
      JOIN inventory_node n ON n.id = x.node_id;
    IF deltas IS NOT NULL THEN
        PERFORM node_atom_counts_add(deltas);
    END IF;
    RETURN NULL;
END $$;

{statement_triggers('node_atom_counts_devices', 'inventory_device')}

-- Nodes: the rows follow a node to its new pool, and go with it.
CREATE FUNCTION node_atom_counts_nodes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM node_atom_counts WHERE node_id = OLD.id;
    ELSE
        UPDATE node_atom_counts SET pool_id = NEW.pool_id WHERE node_id = NEW.id;
    END IF;
    RETURN NULL;
END $$;

{row_trigger_on_change('node_atom_counts_nodes_pool', 'inventory_node', 'pool_id', 'node_atom_counts_nodes')}
CREATE TRIGGER node_atom_counts_nodes_delete AFTER DELETE ON inventory_node
    FOR EACH ROW EXECUTE FUNCTION node_atom_counts_nodes();

-- What is there already.
INSERT INTO node_atom_counts (node_id, pool_id, device_class, atoms, running)
SELECT d.node_id, n.pool_id, d.device_class, count(*), COALESCE(sum(r.running), 0)
  FROM inventory_device d
  JOIN inventory_node n ON n.id = d.node_id
  LEFT JOIN (SELECT b.device_id, count(*) AS running FROM device_bookings b
              WHERE b.phase = 1 GROUP BY b.device_id) r ON r.device_id = d.id
 WHERE d.bookable AND d.healthy
 GROUP BY 1, 2, 3;
"""

REVERSE_SQL = """
DROP TRIGGER node_atom_counts_nodes_delete ON inventory_node;
DROP TRIGGER node_atom_counts_nodes_pool ON inventory_node;
DROP FUNCTION node_atom_counts_nodes();
DROP TRIGGER node_atom_counts_devices_delete ON inventory_device;
DROP TRIGGER node_atom_counts_devices_update ON inventory_device;
DROP TRIGGER node_atom_counts_devices_insert ON inventory_device;
DROP FUNCTION node_atom_counts_devices();
DROP TRIGGER node_atom_counts_bookings_delete ON device_bookings;
DROP TRIGGER node_atom_counts_bookings_update ON device_bookings;
DROP TRIGGER node_atom_counts_bookings_insert ON device_bookings;
DROP FUNCTION node_atom_counts_bookings();
DROP FUNCTION node_atom_counts_add(jsonb);
"""


class Migration(migrations.Migration):
    dependencies = [("inventory", "0004_node_heartbeat_watch"), ("reservations", "0006_worker")]
    operations = [
        migrations.CreateModel(
            name="NodeAtomCount",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("node_id", models.CharField(max_length=57)), ("pool_id", models.CharField(max_length=57)),
                ("device_class", models.CharField(max_length=16)),
                ("atoms", models.IntegerField(default=0)), ("running", models.IntegerField(default=0)),
                ("free", models.GeneratedField(db_persist=True, expression=CombinedExpression(models.F("atoms"), "-", models.F("running")), output_field=models.IntegerField())),
                ("spread", models.GeneratedField(db_persist=True, expression=models.Func(models.F("node_id"), function="hashtext"), output_field=models.IntegerField())),
            ],
            options={
                "db_table": "node_atom_counts",
                "indexes": [models.Index(fields=["pool_id", "device_class", "free", "spread"], name="node_atom_counts_rank")],
                "constraints": [models.UniqueConstraint(fields=("node_id", "device_class"), name="node_atom_counts_unique")],
            },
        ),
        migrations.RunSQL(TRIGGERS_SQL, REVERSE_SQL),
    ]
