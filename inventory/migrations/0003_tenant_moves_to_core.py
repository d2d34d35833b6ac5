# The tenants' model moves to `core`; its table and rows stay as they are.
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0002_tenant_moves_to_core'),
        ('inventory', '0002_node_operate_permission'),
        # Every other reference to inventory.Tenant is moved before the model goes.
        ('capacity', '0002_counters_move_to_ledger'),
        ('reservations', '0004_tenant_in_core'),
    ]

    # The foreign keys already point at `inventory_tenant`; only the model they name
    # changes, and the model goes from this app's state (the table is `core.Tenant`'s now).
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='node',
                    name='owner',
                    field=models.ForeignKey(blank=True, help_text='The owner of a tenant-owned node.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='owned_nodes', to='core.tenant'),
                ),
                migrations.AlterField(
                    model_name='project',
                    name='tenant',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='projects', to='core.tenant'),
                ),
                migrations.AlterField(
                    model_name='offering',
                    name='tenant',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='offerings', to='core.tenant'),
                ),
                migrations.AlterField(
                    model_name='pool',
                    name='owner',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='owned_pools', to='core.tenant'),
                ),
                migrations.DeleteModel(
                    name='Tenant',
                ),
            ],
            database_operations=[],
        ),
    ]
