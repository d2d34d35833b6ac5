# The hourly usage the worker writes once an hour closes (capacity.usage), and the trigger that keeps it history.
from django.db import migrations, models
from django.db.models.expressions import Func

# A usage row is never changed or removed: a late change is a correction row.
# (TRUNCATE, which tests use between cases, fires no row trigger.)
WRITE_ONCE_SQL = """
CREATE FUNCTION capacity_usage_write_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is history: a closed hour is corrected with a new row, never changed', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER capacity_hourlyusage_write_once BEFORE UPDATE OR DELETE ON capacity_hourlyusage
    FOR EACH ROW EXECUTE FUNCTION capacity_usage_write_once();
CREATE TRIGGER capacity_usagehour_write_once BEFORE UPDATE OR DELETE ON capacity_usagehour
    FOR EACH ROW EXECUTE FUNCTION capacity_usage_write_once();
"""

WRITE_ONCE_REVERSE_SQL = """
DROP TRIGGER IF EXISTS capacity_hourlyusage_write_once ON capacity_hourlyusage;
DROP TRIGGER IF EXISTS capacity_usagehour_write_once ON capacity_usagehour;
DROP FUNCTION IF EXISTS capacity_usage_write_once();
"""


class Migration(migrations.Migration):
    dependencies = [("capacity", "0002_counters_move_to_ledger"), ("inventory", "0001_initial")]
    operations = [
        migrations.CreateModel(
            name="UsageHour",
            fields=[("hour", models.DateTimeField(primary_key=True, serialize=False)), ("closed_at", models.DateTimeField(db_default=Func(function="compute_now"))), ("rows", models.IntegerField(default=0))],
            options={"ordering": ["-hour"]},
        ),
        migrations.CreateModel(
            name="HourlyUsage",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)), ("hour", models.DateTimeField()),
                ("tenant_id", models.CharField(max_length=128)), ("pool_id", models.CharField(max_length=57)),
                ("project_id", models.CharField(blank=True, default="", max_length=56)), ("resource", models.CharField(max_length=16)),
                ("spot", models.BooleanField(default=False)), ("usage_us", models.BigIntegerField()),
                ("revision", models.PositiveSmallIntegerField(default=0)), ("created_at", models.DateTimeField(db_default=Func(function="compute_now"))),
            ],
            options={
                "verbose_name_plural": "hourly usage",
                "indexes": [models.Index(fields=["-hour"], name="hourly_usage_hour")],
                "constraints": [models.UniqueConstraint(fields=("tenant_id", "hour", "pool_id", "project_id", "resource", "spot", "revision"), name="hourly_usage_unique")],
            },
        ),
        migrations.RunSQL(WRITE_ONCE_SQL, WRITE_ONCE_REVERSE_SQL),
    ]
