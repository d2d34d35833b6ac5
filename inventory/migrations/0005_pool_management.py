# Pools managed through the API: labels, a gang topology key, and when the API last changed them.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("inventory", "0004_node_heartbeat_watch")]
    operations = [
        migrations.AddField("pool", "api_changed_at", models.DateTimeField(blank=True, null=True)),
        migrations.AddField("pool", "gang_topology_key", models.CharField(blank=True, db_default="", default="", max_length=128)),
        migrations.AddField("pool", "labels", models.JSONField(blank=True, db_default={}, default=dict)),
    ]
