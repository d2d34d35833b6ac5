# The foreign key already points at `inventory_tenant`; only the model it names changes.
from django.db import migrations, models
from django.db.models.deletion import PROTECT

from core.migration_helpers import state_only


class Migration(migrations.Migration):
    dependencies = [("core", "0002_tenant_moves_to_core"), ("reservations", "0003_booking_device_ends_index")]
    operations = [
        state_only(migrations.AlterField("reservation", "tenant", models.ForeignKey(on_delete=PROTECT, related_name="reservations", to="core.tenant"))),
    ]
