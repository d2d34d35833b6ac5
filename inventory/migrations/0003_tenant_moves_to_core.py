
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0002_tenant_moves_to_core'),
        ('inventory', '0002_node_operate_permission'),
    ]

    # The foreign keys already point at `inventory_tenant`; only the model they name changes.
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
            ],
            database_operations=[],
        ),
    ]
