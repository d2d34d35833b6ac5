# A quota's mode: `counter` (the default, every row as it was) or `concurrent` (the limit caps the
# peak of use over time). A concurrent row's `used` may pass `max`, so the CHECK spares it.

from django.db import migrations, models

MODES = [("counter", "Counter"), ("concurrent", "Concurrent")]
USED_IN_RANGE = models.Q(("used__gte", 0), models.Q(("mode", "concurrent"), ("used__lte", models.F("max")), _connector="OR"))


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]
    operations = [
        migrations.RemoveConstraint("quotausage", "quota_used_in_range"),
        migrations.AddField("quotausage", "mode", models.CharField(choices=MODES, db_default="counter", default="counter", max_length=16)),
        migrations.AddConstraint("quotausage", models.CheckConstraint(condition=USED_IN_RANGE, name="quota_used_in_range")),
        migrations.AddConstraint("quotausage", models.CheckConstraint(condition=models.Q(("mode__in", ["counter", "concurrent"])), name="quota_mode_known")),
    ]
