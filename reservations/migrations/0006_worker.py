# The always-on worker's records: booking phases (with their insert trigger and
# a backfill from the clock), the delivery outbox, the at-risk marks of
# BookingRepair, and the fake daemon's record of scalar claims and profiles.

from django.db import migrations, models
from django.db.models.deletion import CASCADE

import reservations.models

PHASE_SQL = """
UPDATE device_bookings
   SET phase = CASE WHEN upper(during) <= compute_now() THEN 2
                    WHEN lower(during) <= compute_now() THEN 1
                    ELSE 0 END;

-- Every writer's phase comes from the same clock its deltas use (the
-- transaction's compute_now()), whatever it passed.
CREATE FUNCTION device_bookings_phase() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.phase := CASE WHEN upper(NEW.during) <= compute_now() THEN 2
                      WHEN lower(NEW.during) <= compute_now() THEN 1
                      ELSE 0 END;
    RETURN NEW;
END $$;

CREATE TRIGGER device_bookings_phase BEFORE INSERT ON device_bookings
    FOR EACH ROW EXECUTE FUNCTION device_bookings_phase();
"""

PHASE_REVERSE_SQL = """
DROP TRIGGER device_bookings_phase ON device_bookings;
DROP FUNCTION device_bookings_phase();
"""

# What the fake node daemon accepted besides atoms: one row per allocation,
# its scalar claims and the node profile, checked against the node's capacity.
CLAIMS_SQL = """
CREATE TABLE fake_daemon_claims (
    id bigserial PRIMARY KEY,
    node_id varchar(64) NOT NULL,
    reservation_id varchar(64) NOT NULL,
    allocation_id varchar(64) NOT NULL UNIQUE,
    resources jsonb NOT NULL DEFAULT '{}'::jsonb,
    node_profile jsonb,
    starts_at timestamptz NOT NULL,
    ends_at timestamptz NOT NULL
);
CREATE INDEX fake_daemon_claims_node ON fake_daemon_claims (node_id);
CREATE INDEX fake_daemon_claims_reservation ON fake_daemon_claims (reservation_id);
"""


class Migration(migrations.Migration):
    dependencies = [("core", "0004_workerjob"), ("inventory", "0004_node_heartbeat_watch"), ("reservations", "0005_wait_slots")]
    operations = [
        migrations.CreateModel(
            name="Delivery",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("kind", models.CharField(choices=[("assign", "Assign"), ("shorten", "Shorten")], max_length=8)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("next_attempt_at", models.DateTimeField(db_default=models.Func(function="compute_now"))),
                ("last_error", models.TextField(blank=True)), ("created_at", models.DateTimeField(db_default=models.Func(function="compute_now"))),
            ],
        ),
        migrations.AddField("devicebooking", "phase", models.PositiveSmallIntegerField(choices=[(0, "Future"), (1, "Running"), (2, "Over")], db_default=0)),
        # Existing bookings take the phase their window has now; the rollups were
        # counted from the same clock, so they stay equal to a rebuild.
        migrations.RunSQL(PHASE_SQL, reverse_sql=PHASE_REVERSE_SQL),
        migrations.RunSQL(CLAIMS_SQL, reverse_sql="DROP TABLE fake_daemon_claims"),
        migrations.AddField("reservation", "at_risk_reason", models.TextField(blank=True)),
        migrations.AddField("reservation", "at_risk_since", models.DateTimeField(blank=True, null=True)),
        migrations.AddIndex("devicebooking", models.Index(reservations.models.LowerBound("during"), condition=models.Q(("phase", 0)), name="booking_phase_future")),
        migrations.AddIndex("devicebooking", models.Index(reservations.models.Upper("during"), condition=models.Q(("phase", 1)), name="booking_phase_running")),
        migrations.AddIndex("reservation", models.Index(condition=models.Q(("state__in", ["scheduled", "active"])), fields=["ends_at"], name="reservation_live_ends")),
        migrations.AddIndex("reservation", models.Index(condition=models.Q(("at_risk_since__isnull", False)), fields=["pool", "at_risk_since"], name="reservation_at_risk")),
        migrations.AddField("delivery", "reservation", models.ForeignKey(on_delete=CASCADE, related_name="deliveries", to="reservations.reservation")),
        migrations.AddIndex("delivery", models.Index(fields=["next_attempt_at"], name="delivery_due")),
    ]
