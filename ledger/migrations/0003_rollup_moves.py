# State only: the rollup table now belongs to `reservations`, beside the bookings it counts;
# its rows and constraints stay where they are.
from django.db import migrations

from core.migration_helpers import state_only


class Migration(migrations.Migration):
    dependencies = [("ledger", "0002_quota_mode")]
    operations = [state_only(migrations.DeleteModel("PoolCapacityRollup"))]
