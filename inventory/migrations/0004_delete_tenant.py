
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('capacity', '0002_counters_move_to_ledger'),
        ('inventory', '0003_tenant_moves_to_core'),
        ('reservations', '0004_tenant_in_core'),
    ]

    # State only: the table now belongs to `core.Tenant`.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='Tenant',
                ),
            ],
            database_operations=[],
        ),
    ]
