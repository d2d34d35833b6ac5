# The distribution column of a PostgreSQL sharded by pool (docs/scaling.md, section 5):
# `device_bookings.pool_id` is the pool of the booked device's node, always, and the
# exclusion constraint of guard 1 becomes (pool_id =, device_id =, during &&).
#
# Equivalent on plain PostgreSQL because every booking of a device carries the same
# pool: a trigger sets it on insert (whatever the writer passed) and re-points a
# device's bookings, history included, when the device or its node moves to another
# pool. So two overlapping bookings of one device always share `pool_id`, and the new
# constraint refuses exactly the pairs the old one did.

from django.contrib.postgres.constraints import ExclusionConstraint
from django.db import migrations, models

from core.migration_helpers import row_trigger_on_change

POOL_SQL = f"""
CREATE FUNCTION device_bookings_pool() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT n.pool_id INTO NEW.pool_id
      FROM inventory_device d JOIN inventory_node n ON n.id = d.node_id
     WHERE d.id = NEW.device_id;
    RETURN NEW;
END $$;

CREATE TRIGGER device_bookings_pool BEFORE INSERT OR UPDATE OF device_id, pool_id ON device_bookings
    FOR EACH ROW EXECUTE FUNCTION device_bookings_pool();

-- A node that moves takes its devices' bookings with it; so does a device that moves.
CREATE FUNCTION device_bookings_pool_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'inventory_node' THEN
        UPDATE device_bookings b SET pool_id = NEW.pool_id
          FROM inventory_device d
         WHERE d.node_id = NEW.id AND b.device_id = d.id AND b.pool_id IS DISTINCT FROM NEW.pool_id;
    ELSE
        UPDATE device_bookings b SET pool_id = n.pool_id
          FROM inventory_node n
         WHERE n.id = NEW.node_id AND b.device_id = NEW.id AND b.pool_id IS DISTINCT FROM n.pool_id;
    END IF;
    RETURN NULL;
END $$;

{row_trigger_on_change('device_bookings_pool_node', 'inventory_node', 'pool_id', 'device_bookings_pool_follow')}
{row_trigger_on_change('device_bookings_pool_device', 'inventory_device', 'node_id', 'device_bookings_pool_follow')}

UPDATE device_bookings b SET pool_id = n.pool_id
  FROM inventory_device d JOIN inventory_node n ON n.id = d.node_id
 WHERE d.id = b.device_id;
"""

POOL_REVERSE_SQL = """
DROP TRIGGER device_bookings_pool_device ON inventory_device;
DROP TRIGGER device_bookings_pool_node ON inventory_node;
DROP FUNCTION device_bookings_pool_follow();
DROP TRIGGER device_bookings_pool ON device_bookings;
DROP FUNCTION device_bookings_pool();
"""


class Migration(migrations.Migration):
    dependencies = [("inventory", "0005_pool_management"), ("reservations", "0009_tenant_ends_index")]
    operations = [
        # Nullable until POOL_SQL has filled the existing rows, then required.
        migrations.AddField("devicebooking", "pool_id", models.CharField(editable=False, max_length=64, null=True)),
        migrations.RunSQL(POOL_SQL, POOL_REVERSE_SQL),
        migrations.AlterField("devicebooking", "pool_id", models.CharField(editable=False, max_length=64)),
        migrations.RemoveConstraint("devicebooking", "device_bookings_no_overlap"),
        migrations.AddConstraint("devicebooking", ExclusionConstraint(expressions=[("pool_id", "="), ("device", "="), ("during", "&&")], name="device_bookings_no_overlap")),
    ]
