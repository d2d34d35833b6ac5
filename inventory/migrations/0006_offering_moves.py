# State only: offerings now belong to `ledger`, beside the quotas they carry; the table
# `inventory_offering`, its rows and constraints stay where they are.
from django.db import migrations

from core.migration_helpers import state_only


class Migration(migrations.Migration):
    dependencies = [("inventory", "0005_pool_management")]
    operations = [state_only(migrations.DeleteModel("Offering"))]
