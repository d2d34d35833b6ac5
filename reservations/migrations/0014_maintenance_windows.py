# Maintenance windows: planned downtime of some nodes, held as `maintenance`
# bookings of every atom (guard 1 refuses a tenant's booking into it), and the
# function that fills a window wherever its atoms are free. A tenant booking
# that was in the window when it was scheduled (one that could not move)
# leaves a hole; when that booking is cut or removed, the statement's trigger
# fills the hole in the same transaction, so no later booking can take it.

import functools

import django.db.models.deletion
from django.db import migrations, models

import core.ids

FILL_SQL = """
CREATE FUNCTION maintenance_windows_fill(devices bigint[]) RETURNS integer LANGUAGE sql AS $$
    WITH parts AS (
        SELECT d.id AS device_id, w.id AS window_id,
               unnest(tstzmultirange(tstzrange(w.starts_at, w.ends_at, '[)'))
                      - COALESCE((SELECT range_agg(b.during) FROM device_bookings b
                                   WHERE b.device_id = d.id
                                     AND b.during && tstzrange(w.starts_at, w.ends_at, '[)')),
                                 '{}'::tstzmultirange)) AS part
          FROM inventory_device d
          JOIN reservations_maintenancewindownode m ON m.node_id = d.node_id
          JOIN reservations_maintenancewindow w ON w.id = m.window_id
         WHERE d.id = ANY(devices) AND d.bookable
           AND w.state IN ('scheduled', 'active') AND w.ends_at > compute_now()
    ),
    added AS (
        INSERT INTO device_bookings (device_id, allocation_id, window_id, purpose, during)
        SELECT p.device_id, NULL, p.window_id, 'maintenance', p.part FROM parts p
         ORDER BY p.device_id, p.part
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*)::integer FROM added
$$;

-- A tenant booking cut or removed inside a live window gives its atom back to the window.
-- One probe of the (small) live windows first, so a release with no window around pays one index read.
CREATE FUNCTION maintenance_windows_refill_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    devices bigint[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM reservations_maintenancewindow w
                    WHERE w.state IN ('scheduled', 'active')) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(DISTINCT o.device_id) INTO devices FROM old_rows o WHERE o.purpose = 'allocation';
    IF devices IS NOT NULL THEN
        PERFORM maintenance_windows_fill(devices);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION maintenance_windows_refill_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    devices bigint[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM reservations_maintenancewindow w
                    WHERE w.state IN ('scheduled', 'active')) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(DISTINCT o.device_id) INTO devices
      FROM old_rows o JOIN new_rows n ON n.id = o.id
     WHERE o.purpose = 'allocation' AND o.during IS DISTINCT FROM n.during;
    IF devices IS NOT NULL THEN
        PERFORM maintenance_windows_fill(devices);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER maintenance_windows_refill_deleted AFTER DELETE ON device_bookings
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION maintenance_windows_refill_deleted();
CREATE TRIGGER maintenance_windows_refill_updated AFTER UPDATE ON device_bookings
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION maintenance_windows_refill_updated();
"""

FILL_REVERSE_SQL = """
DROP TRIGGER maintenance_windows_refill_updated ON device_bookings;
DROP TRIGGER maintenance_windows_refill_deleted ON device_bookings;
DROP FUNCTION maintenance_windows_refill_updated();
DROP FUNCTION maintenance_windows_refill_deleted();
DROP FUNCTION maintenance_windows_fill(bigint[]);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0008_device_node_hold"),
        ("reservations", "0013_allocation_placement"),
    ]

    operations = [
        migrations.CreateModel(
            name="MaintenanceWindow",
            fields=[
                (
                    "id",
                    models.CharField(
                        default=functools.partial(core.ids.new_id, *("mw",), **{}),
                        max_length=57,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("reason", models.TextField()),
                ("starts_at", models.DateTimeField()),
                ("ends_at", models.DateTimeField()),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("scheduled", "Scheduled"),
                            ("active", "Active"),
                            ("ended", "Ended"),
                            ("cancelled", "Cancelled"),
                        ],
                        default="scheduled",
                        max_length=16,
                    ),
                ),
                ("created_by", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(db_default=models.Func(function="compute_now"))),
                ("updated_at", models.DateTimeField(db_default=models.Func(function="compute_now"))),
            ],
            options={
                "db_table": "reservations_maintenancewindow",
            },
        ),
        migrations.CreateModel(
            name="MaintenanceWindowNode",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("switched_on", models.BooleanField(default=False)),
            ],
            options={
                "db_table": "reservations_maintenancewindownode",
            },
        ),
        migrations.RemoveConstraint(
            model_name="devicebooking",
            name="device_bookings_allocation_iff_purpose",
        ),
        migrations.AlterField(
            model_name="devicebooking",
            name="purpose",
            field=models.CharField(
                choices=[
                    ("allocation", "Allocation"),
                    ("layout-change", "Layout Change"),
                    ("maintenance", "Maintenance"),
                ],
                default="allocation",
                max_length=16,
            ),
        ),
        migrations.AddIndex(
            model_name="maintenancewindow",
            index=models.Index(
                condition=models.Q(("state__in", ["scheduled", "active"])),
                fields=["starts_at", "ends_at"],
                name="maintenance_window_live",
            ),
        ),
        migrations.AddConstraint(
            model_name="maintenancewindow",
            constraint=models.CheckConstraint(
                condition=models.Q(("ends_at__gt", models.F("starts_at"))),
                name="maintenance_window_ends_after_start",
            ),
        ),
        migrations.AddField(
            model_name="devicebooking",
            name="window",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="bookings",
                to="reservations.maintenancewindow",
            ),
        ),
        migrations.AddIndex(
            model_name="devicebooking",
            index=models.Index(
                condition=models.Q(("window__isnull", False)), fields=["window"], name="booking_window"
            ),
        ),
        migrations.AddConstraint(
            model_name="devicebooking",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("allocation__isnull", False), ("purpose", "allocation"), ("window__isnull", True)
                    ),
                    models.Q(
                        ("allocation__isnull", True), ("purpose", "layout-change"), ("window__isnull", True)
                    ),
                    models.Q(
                        ("allocation__isnull", True), ("purpose", "maintenance"), ("window__isnull", False)
                    ),
                    _connector="OR",
                ),
                name="device_bookings_allocation_iff_purpose",
            ),
        ),
        migrations.AddField(
            model_name="maintenancewindownode",
            name="node",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="maintenance_windows",
                to="inventory.node",
            ),
        ),
        migrations.AddField(
            model_name="maintenancewindownode",
            name="window",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="members",
                to="reservations.maintenancewindow",
            ),
        ),
        migrations.AddIndex(
            model_name="maintenancewindownode",
            index=models.Index(fields=["node"], name="maintenance_window_node"),
        ),
        migrations.AddConstraint(
            model_name="maintenancewindownode",
            constraint=models.UniqueConstraint(
                fields=("window", "node"), name="maintenance_window_node_unique"
            ),
        ),
        migrations.RunSQL(FILL_SQL, reverse_sql=FILL_REVERSE_SQL),
    ]
