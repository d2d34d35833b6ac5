# Node-agent tokens scoped to a pool or a node (plain ids: core knows no inventory table),
# and the shared counters of the write rate limits (`core.ratelimit`).
from django.db import migrations, models
from django.db.models import Q

SCOPE_NODE_HELP = "Node agents only: the one node it reports for."
SCOPE_POOL_HELP = "Node agents only: the pool whose nodes it reports for."


class Migration(migrations.Migration):
    dependencies = [("core", "0002_tenant_moves_to_core")]
    operations = [
        migrations.RemoveConstraint("rolebinding", "rolebinding_unique_platform"),
        migrations.AddField("rolebinding", "scope_node_id", models.CharField(blank=True, default="", help_text=SCOPE_NODE_HELP, max_length=64)),
        migrations.AddField("rolebinding", "scope_pool_id", models.CharField(blank=True, default="", help_text=SCOPE_POOL_HELP, max_length=64)),
        migrations.AddConstraint("rolebinding", models.UniqueConstraint(condition=Q(tenant__isnull=True), fields=("principal", "role", "scope_pool_id", "scope_node_id"), name="rolebinding_unique_platform")),
        migrations.AddConstraint("rolebinding", models.CheckConstraint(condition=Q(Q(scope_node_id="", scope_pool_id="")) | Q(role="node-agent", tenant__isnull=True), name="rolebinding_scope_node_agent_only")),
        migrations.AddConstraint("rolebinding", models.CheckConstraint(condition=Q(scope_pool_id="") | Q(scope_node_id=""), name="rolebinding_scope_one_kind")),
        migrations.CreateModel(
            "RateWindow",
            [("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")), ("key", models.CharField(max_length=200)), ("window_start", models.DateTimeField()), ("count", models.PositiveIntegerField(default=0))],
            options={"constraints": [models.UniqueConstraint(fields=("key", "window_start"), name="ratewindow_unique")]},
        ),
    ]
