# The leased slots that bound how many creates of one tenant wait for capacity (`reservations.waits`).
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("reservations", "0004_tenant_in_core")]
    operations = [
        migrations.CreateModel(
            "WaitSlot",
            [("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")), ("tenant_id", models.CharField(max_length=128)), ("slot", models.PositiveSmallIntegerField()), ("holder", models.CharField(max_length=32)), ("expires_at", models.DateTimeField())],
            options={"constraints": [models.UniqueConstraint(fields=("tenant_id", "slot"), name="waitslot_unique")]},
        ),
    ]
