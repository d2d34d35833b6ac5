
import django.db.models.deletion
import django.db.models.expressions
import django.db.models.functions.comparison
from django.db import migrations, models

from core.migration_helpers import rename_content_type, rename_content_type_back


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('capacity', '0001_initial'),
        ('core', '0002_tenant_moves_to_core'),
        ('inventory', '0002_node_operate_permission'),
    ]

    # `pool_capacity_rollup` and `quota_usage` were created by `capacity.0001_initial`; the ledger takes them over as they are.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='PoolCapacityRollup',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('resource', models.CharField(max_length=16)),
                        ('total', models.BigIntegerField(default=0)),
                        ('allocatable', models.BigIntegerField(default=0)),
                        ('allocated', models.BigIntegerField(default=0)),
                        ('reserved', models.BigIntegerField(default=0)),
                        ('provisioning', models.BigIntegerField(default=0)),
                        ('unhealthy', models.BigIntegerField(default=0)),
                        ('maintenance', models.BigIntegerField(default=0)),
                        ('unreachable', models.BigIntegerField(default=0)),
                        ('available', models.GeneratedField(db_persist=True, expression=django.db.models.functions.comparison.Greatest(models.Value(0), django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(models.F('allocatable'), '-', models.F('allocated')), '-', models.F('reserved'))), output_field=models.BigIntegerField())),
                        ('updated_at', models.DateTimeField(db_default=models.Func(function='compute_now'))),
                        ('rebuilt_at', models.DateTimeField(blank=True, null=True)),
                        ('pool', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='rollups', to='inventory.pool')),
                    ],
                    options={
                        'db_table': 'pool_capacity_rollup',
                        'ordering': ['pool_id', 'resource'],
                        'constraints': [models.UniqueConstraint(fields=('pool', 'resource'), name='rollup_unique_pool_resource'), models.CheckConstraint(condition=models.Q(('total', django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(models.F('allocatable'), '+', models.F('provisioning')), '+', models.F('unhealthy')), '+', models.F('maintenance')), '+', models.F('unreachable')))), name='rollup_total_is_sum')],
                    },
                ),
                migrations.CreateModel(
                    name='QuotaUsage',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('resource', models.CharField(max_length=16)),
                        ('used', models.BigIntegerField(default=0)),
                        ('max', models.BigIntegerField()),
                        ('pool', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='quotas', to='inventory.pool')),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='quotas', to='core.tenant')),
                    ],
                    options={
                        'db_table': 'quota_usage',
                        'constraints': [models.UniqueConstraint(fields=('pool', 'tenant', 'resource'), name='quota_unique'), models.CheckConstraint(condition=models.Q(('used__gte', 0), ('used__lte', models.F('max'))), name='quota_used_in_range')],
                    },
                ),
            ],
            database_operations=[
                migrations.RunPython(rename_content_type("capacity", "ledger", "poolcapacityrollup", "quotausage"), rename_content_type_back("capacity", "ledger", "poolcapacityrollup", "quotausage")),
            ],
        ),
    ]
