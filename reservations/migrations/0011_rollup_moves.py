# State only: `pool_capacity_rollup` moves from `ledger` to `reservations` as it is (the table,
# its rows and constraints untouched), with its content type and so its permissions.

import django.db.models.deletion
import django.db.models.expressions
import django.db.models.functions.comparison
from django.db import migrations, models

from core.migration_helpers import rename_content_type, rename_content_type_back, state_only

MOVED = ("ledger", "reservations", "poolcapacityrollup")


class Migration(migrations.Migration):

    dependencies = [
        ('inventory', '0005_pool_management'),
        ('reservations', '0010_booking_pool'),
        ('ledger', '0003_rollup_moves'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        state_only(migrations.CreateModel(
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
        )),
        migrations.RunPython(rename_content_type(*MOVED), rename_content_type_back(*MOVED)),
    ]
