# State only: the rollup and quota tables now belong to the `ledger` app, rows and constraints untouched.
from django.db import migrations

from core.migration_helpers import state_only


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial"), ("capacity", "0001_initial")]
    operations = [
        state_only(
            migrations.RemoveField("quotausage", "pool"),
            migrations.RemoveField("quotausage", "tenant"),
            migrations.DeleteModel("PoolCapacityRollup"),
            migrations.DeleteModel("QuotaUsage"),
        ),
    ]
