# The index of a concurrent quota's peak: a tenant's live reservations in one pool, by start.

from django.db import migrations, models

LIVE = models.Q(("state__in", ["scheduled", "active"]))


class Migration(migrations.Migration):
    dependencies = [("reservations", "0007_node_atom_counts")]
    operations = [
        migrations.AddIndex("reservation", models.Index(condition=LIVE, fields=["tenant", "pool", "starts_at"], name="reservation_tenant_pool_live")),
    ]
