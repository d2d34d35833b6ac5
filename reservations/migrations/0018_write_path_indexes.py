"""The write path's indexes: guard 1 keyed device first, and no index written twice.

Every booking row version (a create's insert, a release's shortened range, the
worker's phase moves) writes an entry in each index of `device_bookings`, and
every reservation row version in each of `reservations_reservation`'s. Django
gave each foreign key an index of its own and, for a text key, a second
`varchar_pattern_ops` copy for `LIKE`, which no query of the service runs:

* `device_bookings`: the device's, the allocation's and the window's indexes
  were copies of `booking_device_ends` (leading with the device),
  `booking_allocation` and `booking_window`; two of them had a `LIKE` copy too.
* `reservations_allocation`: the reservation's index copied the lead of
  `allocation_one_per_node`; the node's keeps a plain index (`allocation_node`).
* `reservations_reservation`: the tenant's copied the lead of four declared
  indexes; the pool's and the project's keep plain ones.
* The `LIKE` copies of both tables' primary keys.

Guard 1's GiST index is rebuilt with the device first (`models.DeviceBooking`
says why). The rebuild holds the bookings table locked while it runs: about
8 s for a million bookings on a two-core machine.
"""

import django.contrib.postgres.constraints
import django.db.models.deletion
from django.db import migrations, models


# The `varchar_pattern_ops` copies Django made of the text primary keys (for `LIKE`).
_PRIMARY_KEY_LIKE = (
    ("reservations_reservation_id_fe6b2f17_like", "reservations_reservation"),
    ("reservations_allocation_id_e177cc03_like", "reservations_allocation"),
)


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0006_auth_changed"),
        ("inventory", "0008_device_node_hold"),
        ("reservations", "0017_pool_fabric_counts"),
    ]

    operations = [
        migrations.AlterField(
            model_name="allocation",
            name="node",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="allocations",
                to="inventory.node",
            ),
        ),
        migrations.AlterField(
            model_name="allocation",
            name="reservation",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="allocations",
                to="reservations.reservation",
            ),
        ),
        migrations.AlterField(
            model_name="delivery",
            name="reservation",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="deliveries",
                to="reservations.reservation",
            ),
        ),
        migrations.AlterField(
            model_name="devicebooking",
            name="allocation",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="bookings",
                to="reservations.allocation",
            ),
        ),
        migrations.AlterField(
            model_name="devicebooking",
            name="device",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="bookings",
                to="inventory.device",
            ),
        ),
        migrations.AlterField(
            model_name="devicebooking",
            name="window",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="bookings",
                to="reservations.maintenancewindow",
            ),
        ),
        migrations.AlterField(
            model_name="reservation",
            name="pool",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="reservations",
                to="inventory.pool",
            ),
        ),
        migrations.AlterField(
            model_name="reservation",
            name="project",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="inventory.project",
            ),
        ),
        migrations.AlterField(
            model_name="reservation",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="reservations",
                to="core.tenant",
            ),
        ),
        migrations.AddIndex(
            model_name="allocation",
            index=models.Index(fields=["node"], name="allocation_node"),
        ),
        migrations.AddIndex(
            model_name="delivery",
            index=models.Index(fields=["reservation"], name="delivery_reservation"),
        ),
        migrations.AddIndex(
            model_name="reservation",
            index=models.Index(fields=["pool"], name="reservation_pool"),
        ),
        migrations.AddIndex(
            model_name="reservation",
            index=models.Index(fields=["project"], name="reservation_project"),
        ),
        migrations.RunSQL(
            [f"DROP INDEX IF EXISTS {name}" for name, _ in _PRIMARY_KEY_LIKE],
            [
                f"CREATE INDEX IF NOT EXISTS {name} ON {table} (id varchar_pattern_ops)"
                for name, table in _PRIMARY_KEY_LIKE
            ],
        ),
        # Guard 1 reordered: dropped and added in this one transaction, which holds the
        # table's ACCESS EXCLUSIVE lock from the drop to the commit, so no booking is
        # written while the constraint is away.
        migrations.RemoveConstraint(
            model_name="devicebooking",
            name="device_bookings_no_overlap",
        ),
        migrations.AddConstraint(
            model_name="devicebooking",
            constraint=django.contrib.postgres.constraints.ExclusionConstraint(
                expressions=[("device", "="), ("pool_id", "="), ("during", "&&")],
                name="device_bookings_no_overlap",
            ),
        ),
    ]
