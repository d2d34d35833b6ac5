
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0001_initial'),
        ('capacity', '0001_initial'),
    ]

    # State only: the tables now belong to the `ledger` app, rows and constraints untouched.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='quotausage',
                    name='pool',
                ),
                migrations.RemoveField(
                    model_name='quotausage',
                    name='tenant',
                ),
                migrations.DeleteModel(
                    name='PoolCapacityRollup',
                ),
                migrations.DeleteModel(
                    name='QuotaUsage',
                ),
            ],
            database_operations=[],
        ),
    ]
