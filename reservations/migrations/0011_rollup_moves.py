# State only: `pool_capacity_rollup` moves from `ledger` to `reservations` as it is (the table,
# its rows and constraints untouched), with its content type and so its permissions.

from django.db import migrations

from core.migration_helpers import model_created_by, rename_content_type, rename_content_type_back, state_only

MOVED = ("ledger", "reservations", "poolcapacityrollup")


class Migration(migrations.Migration):
    dependencies = [("inventory", "0005_pool_management"), ("reservations", "0010_booking_pool"), ("ledger", "0003_rollup_moves"), ("contenttypes", "0002_remove_content_type_name")]
    operations = [
        # The model as `capacity.0001_initial` made it: the ledger took it over unchanged.
        state_only(model_created_by("capacity", "0001_initial", "PoolCapacityRollup")),
        migrations.RunPython(rename_content_type(*MOVED), rename_content_type_back(*MOVED)),
    ]
