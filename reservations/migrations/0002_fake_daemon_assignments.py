# The fake node daemon's own memory (guard 6): what each node believes it holds.
# A plain table, not a model: it stands for state that lives on the node, so
# nothing in the control plane's ORM reads or constrains it.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("reservations", "0001_initial")]
    operations = [
        migrations.RunSQL(
            sql="""
            CREATE TABLE fake_daemon_assignments (
                id bigserial PRIMARY KEY,
                node_id varchar(57) NOT NULL,
                device_uid varchar(255) NOT NULL,
                reservation_id varchar(57) NOT NULL,
                allocation_id varchar(58) NOT NULL,
                starts_at timestamptz NOT NULL,
                ends_at timestamptz NOT NULL
            );
            -- The daemon looks up what it holds per device.
            CREATE INDEX fake_daemon_assignments_device ON fake_daemon_assignments (device_uid);
            CREATE INDEX fake_daemon_assignments_reservation ON fake_daemon_assignments (reservation_id);
            """,
            reverse_sql="DROP TABLE fake_daemon_assignments;",
        ),
    ]
