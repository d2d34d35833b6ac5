
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0002_tenant_moves_to_core'),
        ('reservations', '0003_booking_device_ends_index'),
    ]

    # The foreign key already points at `inventory_tenant`; only the model it names changes.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='reservation',
                    name='tenant',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='reservations', to='core.tenant'),
                ),
            ],
            database_operations=[],
        ),
    ]
