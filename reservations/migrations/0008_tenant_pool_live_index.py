# The index of a concurrent quota's peak: a tenant's live reservations in one pool, by start.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('reservations', '0007_node_atom_counts'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='reservation',
            index=models.Index(condition=models.Q(('state__in', ['scheduled', 'active'])), fields=['tenant', 'pool', 'starts_at'], name='reservation_tenant_pool_live'),
        ),
    ]
