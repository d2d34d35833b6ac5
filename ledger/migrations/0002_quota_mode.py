# A quota's mode: `counter` (the default, every row as it was) or `concurrent` (the limit caps the
# peak of use over time). A concurrent row's `used` may pass `max`, so the CHECK spares it.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0001_initial'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='quotausage',
            name='quota_used_in_range',
        ),
        migrations.AddField(
            model_name='quotausage',
            name='mode',
            field=models.CharField(choices=[('counter', 'Counter'), ('concurrent', 'Concurrent')], db_default='counter', default='counter', max_length=16),
        ),
        migrations.AddConstraint(
            model_name='quotausage',
            constraint=models.CheckConstraint(condition=models.Q(('used__gte', 0), models.Q(('mode', 'concurrent'), ('used__lte', models.F('max')), _connector='OR')), name='quota_used_in_range'),
        ),
        migrations.AddConstraint(
            model_name='quotausage',
            constraint=models.CheckConstraint(condition=models.Q(('mode__in', ['counter', 'concurrent'])), name='quota_mode_known'),
        ),
    ]
